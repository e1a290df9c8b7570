package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/tenantcontroller"
	"github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/policy"
)

// TestExamples keeps artifacts/examples true: each example pod is decided as
// its comment says.
func TestExamples(t *testing.T) {
	created := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	now := created.Add(time.Minute)
	tests := []struct {
		file     string
		deadline time.Time // zero: no deadline
		kept     bool
		invalid  bool
	}{
		{file: "pod-ttl.yaml", deadline: created.Add(8 * time.Hour)},
		{file: "pod-expires-at.yaml", deadline: time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC)},
		{file: "pod-ttl-after-finished.yaml"}, // not finished yet
		{file: "pod-keep.yaml", kept: true},
		{file: "pod-invalid.yaml", invalid: true},
	}
	seen := map[string]bool{"podlifetimepolicy.yaml": true, "podlifetimepolicy-keep-failed.yaml": true} // TestExamplePodLifetimePolicy, TestExampleKeepFailed
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			seen[tc.file] = true
			data, err := os.ReadFile(filepath.Join("artifacts/examples", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			var pod corev1.Pod
			if err := yaml.UnmarshalStrict(data, &pod); err != nil {
				t.Fatal(err)
			}
			pod.CreationTimestamp.Time = created
			d, err := (&policy.Evaluator{}).Decide(&pod, &policy.Namespace{}, now)
			var invalid *policy.AnnotationError
			if got := errors.As(err, &invalid); got != tc.invalid {
				t.Fatalf("Decide error = %v, want invalid=%v", err, tc.invalid)
			}
			if !d.Deadline.Equal(tc.deadline) || d.Kept != tc.kept {
				t.Errorf("decision = %+v, want deadline %v kept %v", d, tc.deadline, tc.kept)
			}
		})
	}
	files, _ := filepath.Glob("artifacts/examples/*.yaml")
	for _, f := range files {
		if !seen[filepath.Base(f)] {
			t.Errorf("example %s has no test case", f)
		}
	}
}

// TestExamplePodLifetimePolicy keeps artifacts/examples/podlifetimepolicy.yaml
// true: it is a PodLifetimePolicy podjanitor uses as it is, and its rules do
// what its comments say, in its own namespace only. (The e2e test
// TestTenantAPIAcceptsTheExample applies it to the API server.)
func TestExamplePodLifetimePolicy(t *testing.T) {
	data, err := os.ReadFile("artifacts/examples/podlifetimepolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var obj v1alpha1.PodLifetimePolicy
	if err := yaml.UnmarshalStrict(data, &obj); err != nil {
		t.Fatal(err)
	}
	tp, err := tenantcontroller.Convert(&obj, policy.Restrictions{})
	if err != nil {
		t.Fatalf("podjanitor does not use the example: %v", err)
	}
	e := &policy.Evaluator{Tenants: policy.NewStaticTenants(tp)}
	created := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	now := created.Add(time.Minute)

	runner := tenantPod("runner", obj.Namespace, created, map[string]string{"app": "runner"}) // never scheduled
	d, err := e.Decide(runner, &policy.Namespace{}, now)
	if err != nil || !d.Deadline.Equal(created.Add(30*time.Minute)) || d.Action != policy.ActionDelete ||
		d.Source != "podlifetimepolicy/ci-pods/rule/stuck" {
		t.Errorf("a stuck runner pod: decision %+v, %v; want deleted 30m after creation by rule stuck", d, err)
	}
	elsewhere := tenantPod("runner", "team-b", created, map[string]string{"app": "runner"})
	if d, err := e.Decide(elsewhere, &policy.Namespace{}, now); err != nil || d.HasDeadline() {
		t.Errorf("a runner pod of another namespace: decision %+v, %v; want no deadline", d, err)
	}
	job := apitest.Pod("job-1", created, corev1.PodRunning, nil)
	job.Namespace = obj.Namespace
	job.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: "j", APIVersion: "batch/v1", UID: "u"}}
	if d, err := e.Decide(job, &policy.Namespace{}, now); err != nil || d.HasDeadline() {
		t.Errorf("a running Job pod: decision %+v, %v; want no deadline (until it finishes)", d, err)
	}
}

// TestExampleKeepFailed keeps artifacts/examples/podlifetimepolicy-keep-failed.yaml
// true: of a Job's 5 failed pods, the newest 3 stay, the 2 others go an
// hour after they failed; pods of another Job count apart.
func TestExampleKeepFailed(t *testing.T) {
	data, err := os.ReadFile("artifacts/examples/podlifetimepolicy-keep-failed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var obj v1alpha1.PodLifetimePolicy
	if err := yaml.UnmarshalStrict(data, &obj); err != nil {
		t.Fatal(err)
	}
	tp, err := tenantcontroller.Convert(&obj, policy.Restrictions{})
	if err != nil {
		t.Fatalf("podjanitor does not use the example: %v", err)
	}
	created := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	var pods []*corev1.Pod
	for i := range 5 {
		p := apitest.Pod(fmt.Sprintf("job-a-%d", i), created.Add(time.Duration(i)*time.Minute), corev1.PodFailed, nil)
		p.Namespace = obj.Namespace
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: "a", APIVersion: "batch/v1", UID: "uid-a", Controller: new(true)}}
		pods = append(pods, p)
	}
	other := apitest.Pod("job-b-0", created, corev1.PodFailed, nil)
	other.Namespace = obj.Namespace
	other.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: "b", APIVersion: "batch/v1", UID: "uid-b", Controller: new(true)}}
	pods = append(pods, other)
	e := &policy.Evaluator{Tenants: policy.NewStaticTenants(tp), Ranks: planRanks(pods)}
	now := created.Add(10 * time.Minute)
	for i, p := range pods {
		d, err := e.Decide(p, &policy.Namespace{}, now)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case i < 2: // the oldest two of Job a: an hour after they failed
			if !d.Deadline.Equal(created.Add(time.Duration(i)*time.Minute+time.Hour)) || d.RemovalNotice != 10*time.Minute {
				t.Errorf("%s: %+v, want a deadline an hour after it failed, a notice 10m before", p.Name, d)
			}
		default:
			if d.HasDeadline() || d.Count == nil || !d.Count.Known {
				t.Errorf("%s: %+v, want kept for its rank", p.Name, d)
			}
		}
	}
}
