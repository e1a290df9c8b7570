package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	core "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/podjanitor/podjanitor/internal/wave"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
)

// testLease is the Lease of the wave fixtures (podjanitor/podjanitor), at
// the flags' default durations.
var testLease = leaseConfig{name: "podjanitor", namespace: "podjanitor", duration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second}

// leaderChanges records what runAsLeader tells setLeader.
type leaderChanges struct {
	mu  sync.Mutex
	got []bool
}

func (l *leaderChanges) set(b bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, b)
}

func (l *leaderChanges) changes() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got)
}

// lead runs runAsLeader until it returns, and returns its error; the test
// fails if it does not return (a leader that renews with no work).
func lead(t *testing.T, ctx context.Context, client kubernetes.Interface, setLeader func(bool), work func(context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runAsLeader(ctx, testLease, client, setLeader, nil, work) }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		cancel()
		<-done
		t.Fatal("runAsLeader still leads a minute after its work ended")
		return nil
	}
}

// checkReleased fails unless the Lease has no holder.
func checkReleased(t *testing.T, client kubernetes.Interface) *coordinationv1.Lease {
	t.Helper()
	l, err := client.CoordinationV1().Leases(testLease.namespace).Get(context.Background(), testLease.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("the Lease is still held by %s, want it released for another replica", *h)
	}
	return l
}

// TestLeaderGivesUpWhenItsWorkEnds: work that ends while this process
// leads, with an error or without, releases the Lease and is returned (the
// process exits 1), rather than a leader that renews with nothing running.
func TestLeaderGivesUpWhenItsWorkEnds(t *testing.T) {
	failed := errors.New("the start failed")
	for _, tc := range []struct {
		name    string
		workErr error
		want    error
	}{
		{"error", failed, failed},
		{"no error", nil, errControllerStopped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			client := fake.NewClientset()
			var leader leaderChanges
			err := lead(t, ctx, client, leader.set, func(context.Context) error { return tc.workErr })
			if !errors.Is(err, tc.want) {
				t.Errorf("runAsLeader = %v, want %v", err, tc.want)
			}
			if got := leader.changes(); len(got) < 2 || !got[0] || got[len(got)-1] {
				t.Errorf("setLeader got %v, want true, then false last", got)
			}
			checkReleased(t, client)
		})
	}
}

// TestLeaderStopsWithItsContext: on ctx's end the work's end is the normal
// one: no error, and the Lease released.
func TestLeaderStopsWithItsContext(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	client := fake.NewClientset()
	var leader leaderChanges
	err := lead(t, ctx, client, leader.set, func(ctx context.Context) error {
		cancel()
		<-ctx.Done()
		return nil
	})
	if err != nil {
		t.Errorf("runAsLeader after its context ended = %v, want nil", err)
	}
	checkReleased(t, client)
}

// TestLeaderWithAStartThatFails: the controller's start fails, for each
// reason a start can fail on the record Lease: the leader gives the Lease up
// and returns the error, which names what failed; no worker ever ran and
// nothing was removed. (A record that does not parse is no such reason:
// TestNamespaceHoldRecordThatDoesNotParse.)
func TestLeaderWithAStartThatFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		// unreadable: the Lease's reads fail once this process leads.
		unreadable bool
		want       []string
	}{
		{name: "Lease unreadable", unreadable: true,
			want: []string{"--hold-waves: the policy the last leader acted on", "reading lease podjanitor/podjanitor", "etcd"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _, _ := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
			var leading atomic.Bool
			if tc.unreadable {
				f.client.PrependReactor("get", "leases", func(core.Action) (bool, runtime.Object, error) {
					if leading.Load() {
						return true, nil, apierrors.NewInternalError(errors.New("etcd leader changed"))
					}
					return false, nil, nil
				})
			}
			var leader leaderChanges
			var workersRan atomic.Bool
			setLeader := func(b bool) {
				leader.set(b)
				leading.Store(b)
			}
			err := lead(t, f.ctx, f.client, setLeader, func(ctx context.Context) error {
				err := f.c.Run(ctx, 2)
				workersRan.Store(f.metrics.WorkersRunning() || metricValue(f.metrics, "controller_runtime_max_concurrent_reconciles") > 0)
				return err
			})
			if err == nil {
				t.Fatal("runAsLeader = nil, want the start's error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("runAsLeader = %v, want an error naming %q", err, w)
				}
			}
			if workersRan.Load() {
				t.Error("workers started")
			}
			if n := f.deletes(); n != 0 {
				t.Errorf("%d pods removed, want none", n)
			}
			if got := leader.changes(); len(got) == 0 || got[len(got)-1] {
				t.Errorf("setLeader got %v, want false last", got)
			}
			leading.Store(false)
			checkReleased(t, f.client)
		})
	}
}

// TestUnreadablePolicyRecordStartsAsAFirstInstall: the policy the last
// leader acted on does not match its hash (a hand edit), or matches it but
// does not parse: the start is measured as a first install's, against no
// rules, the widest wave there is; its 12 overdue pods are held, and the
// workers run.
func TestUnreadablePolicyRecordStartsAsAFirstInstall(t *testing.T) {
	notParsed := `{"rules":[{"name":"x","after":"soon"}]}`
	for name, annotations := range map[string]map[string]string{
		"hash mismatch": {wave.AnnotationBaseline: `{"rules":[]}`, wave.AnnotationBaselineHash: wave.BaselineHash([]byte(`{"rules":null}`))},
		"not a policy":  {wave.AnnotationBaseline: notParsed, wave.AnnotationBaselineHash: wave.BaselineHash([]byte(notParsed))},
		"not JSON":      {wave.AnnotationBaseline: "{rules", wave.AnnotationBaselineHash: wave.BaselineHash([]byte("{rules"))},
	} {
		t.Run(name, func(t *testing.T) {
			lease := recordedLease(t, "1m")
			lease.Annotations = annotations
			f, pods := startFixture(t, "1m", time.Hour, 12, lease)
			f.start(pods)
			h, held := f.c.waves.Held()
			if !held || h.ID != wave.ChangeID(nil, policyJSON(evaluatorWithAfter(t, "1m"))) {
				t.Fatalf("held %+v, %v; want the start held as a first install", h, held)
			}
			if n := f.deletes(); n != 0 {
				t.Errorf("%d pods removed, want none before an approval", n)
			}
		})
	}
}

// TestWorkersRunningFollowsRun: podjanitor_workers_running is 1 from the
// workers' start until Run returns, and /readyz's check of a leader fails
// whenever it is 0.
func TestWorkersRunningFollowsRun(t *testing.T) {
	f, _, _ := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
	if err := leaderWorking(true, f.metrics.WorkersRunning()); err == nil {
		t.Error("a leader whose workers have not started is ready")
	}
	ctx, cancel := context.WithCancel(f.ctx)
	ran := make(chan error, 1)
	go func() { ran <- f.c.Run(ctx, 1) }()
	if err := wait.PollUntilContextTimeout(f.ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return metricValue(f.metrics, "podjanitor_workers_running") == 1, nil
	}); err != nil {
		t.Fatal("podjanitor_workers_running is not 1 once Run has started")
	}
	if err := leaderWorking(true, f.metrics.WorkersRunning()); err != nil {
		t.Errorf("a leader with its workers running is not ready: %v", err)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if got := metricValue(f.metrics, "podjanitor_workers_running"); got != 0 {
		t.Errorf("podjanitor_workers_running = %v after Run returned, want 0", got)
	}
	if err := leaderWorking(true, f.metrics.WorkersRunning()); err == nil {
		t.Error("a leader whose workers stopped is ready")
	}
	if err := leaderWorking(false, false); err != nil {
		t.Errorf("a follower is not ready: %v", err)
	}
}

// TestTenantPolicyListFailingIsAWait: --tenant-policies and the API server
// answers the list of PodLifetimePolicies 500 (neither 403, an exit at
// start-up, TestTenantPoliciesWithoutListRightFailFast, nor 404, a start
// without them, TestTenantPoliciesWaitForTheirCRD): the controller waits for
// their cache, and so does /readyz, with no worker running; once the list
// answers, the workers start.
func TestTenantPolicyListFailingIsAWait(t *testing.T) {
	f := newFixtureWithNamespaces(t, Options{}, nil)
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	pj := pjfake.NewSimpleClientset()
	var failing atomic.Bool
	var lists atomic.Int32
	failing.Store(true)
	pj.PrependReactor("list", "podlifetimepolicies", func(core.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		if failing.Load() {
			return true, nil, apierrors.NewInternalError(errors.New("etcd"))
		}
		return false, nil, nil
	})
	o := &flagValues{tenants: tenantFlags{enabled: true, crdCheckInterval: time.Second}}
	synced, err := startTenantPolicies(ctx, f.c, &clients{podjanitor: pj}, o)
	if err != nil {
		t.Fatalf("startTenantPolicies with the list answering 500: %v, want a wait", err)
	}
	ran := make(chan error, 1)
	go func() { ran <- f.c.Run(ctx, 1) }()
	// The probe, then the informer's list: failed, so its cache is not synced.
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return lists.Load() >= 2, nil
	}); err != nil {
		t.Fatal("the tenant policy informer did not list")
	}
	if synced() {
		t.Error("/readyz says synced with the tenant policies' list failing")
	}
	if f.metrics.WorkersRunning() {
		t.Error("workers run before the tenant policies' cache has synced")
	}
	failing.Store(false)
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return f.metrics.WorkersRunning(), nil
	}); err != nil {
		t.Fatal("the workers did not start once the tenant policies' list answered")
	}
	if !synced() {
		t.Error("/readyz not synced once the tenant policies' list answered")
	}
	cancel()
	if err := <-ran; err != nil {
		t.Error(err)
	}
}
