package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

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
	seen := map[string]bool{}
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
