package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/podjanitor/podjanitor/internal/apiclock"
	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/internal/wave"
	pjfake "github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned/fake"
	"github.com/podjanitor/podjanitor/policy"
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
	go func() { done <- runAsLeader(ctx, testLease, client, nil, setLeader, nil, work) }()
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
			f.c.opts.Waves.StartReadFor = time.Second // tried for a second, not the renew deadline
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

// TestRemovalGate: the gate, kept by the Lease's lock, opens removals from
// each renewal that succeeds until the renew deadline after it was sent,
// each call to end halfway to the lease duration; it closes once a read
// finds another holder, at the release, and for the renew deadline after a
// lease duration after it took a Lease without seeing the last leader's end
// (it created the Lease again after the one it read was deleted, or found
// itself named holder by hand); a Lease created where none was read before
// (a first install) opens it at once.
func TestRemovalGate(t *testing.T) {
	ctx := context.Background()
	const id = "me"
	lease := leaseConfig{name: "podjanitor", namespace: "podjanitor", duration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second}
	var clk *testingclock.FakeClock
	record := func(holder string) resourcelock.LeaderElectionRecord {
		return resourcelock.LeaderElectionRecord{HolderIdentity: holder, LeaseDurationSeconds: 15, RenewTime: metav1.NewTime(clk.Now())}
	}
	setup := func(t *testing.T, holder *string) (*testingclock.FakeClock, *removalGate, *gatedLock, *fake.Clientset) {
		var objs []runtime.Object
		if holder != nil {
			objs = append(objs, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor"},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: holder}})
		}
		client := fake.NewClientset(objs...)
		clk = testingclock.NewFakeClock(t0)
		gate := newRemovalGate(clk, lease)
		lock := &gatedLock{Interface: &resourcelock.LeaseLock{
			LeaseMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor"}, Client: client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id}}, gate: gate, wall: clk}
		return clk, gate, lock, client
	}
	check := func(t *testing.T, gate *removalGate, when string, wantOpen bool, wantWithin time.Duration) {
		t.Helper()
		within, open := gate.mayRemove()
		if open != wantOpen || within != wantWithin {
			t.Errorf("%s: mayRemove = %v, %v; want %v, %v", when, within, open, wantOpen, wantWithin)
		}
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	t.Run("taken from another, renewed, then not", func(t *testing.T) {
		clk, gate, lock, _ := setup(t, ptr.To("other"))
		check(t, gate, "before the Lease is taken", false, 0)
		_, _, err := lock.Get(ctx)
		must(t, err)
		must(t, lock.Update(ctx, record(id)))
		check(t, gate, "at the take", true, 12500*time.Millisecond)
		clk.Step(2 * time.Second)
		must(t, lock.Update(ctx, record(id)))
		clk.Step(10*time.Second - time.Nanosecond)
		check(t, gate, "a renew deadline after the renewal, less 1 ns", true, 2500*time.Millisecond+time.Nanosecond)
		clk.Step(time.Nanosecond)
		check(t, gate, "a renew deadline after the renewal, not renewed since", false, 0)
		must(t, lock.Update(ctx, record(id)))
		check(t, gate, "renewed late, but renewed", true, 12500*time.Millisecond)
	})
	t.Run("renewals in one second", func(t *testing.T) {
		clk, gate, lock, _ := setup(t, ptr.To(""))
		_, _, err := lock.Get(ctx)
		must(t, err)
		clk.Step(300 * time.Millisecond)
		must(t, lock.Update(ctx, record(id)))
		clk.Step(600 * time.Millisecond)
		r := record(id)
		clk.Step(50 * time.Millisecond) // the record made before a read, the write sent after
		must(t, lock.Update(ctx, r))
		// Another replica saw the first (0.3 s) and cannot tell the second
		// (0.9 s) from it: both are counted from the second's start.
		check(t, gate, "sent 0.95 s into its second", true, 12500*time.Millisecond-950*time.Millisecond)
		clk.Step(10*time.Second - 950*time.Millisecond)
		check(t, gate, "a renew deadline after the second's start", false, 0)
	})
	t.Run("a renewal failing", func(t *testing.T) {
		clk, gate, lock, client := setup(t, ptr.To(""))
		_, _, err := lock.Get(ctx)
		must(t, err)
		must(t, lock.Update(ctx, record(id)))
		client.PrependReactor("update", "leases", func(core.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewInternalError(errors.New("etcd"))
		})
		clk.Step(5 * time.Second)
		if err := lock.Update(ctx, record(id)); err == nil {
			t.Fatal("the renewal passed")
		}
		check(t, gate, "5 s after the renewal, the next one failed", true, 7500*time.Millisecond)
		clk.Step(5 * time.Second)
		check(t, gate, "a renew deadline after the last renewal", false, 0)
	})
	t.Run("seen held by another", func(t *testing.T) {
		_, gate, lock, client := setup(t, ptr.To(""))
		_, _, err := lock.Get(ctx)
		must(t, err)
		must(t, lock.Update(ctx, record(id)))
		check(t, gate, "renewed", true, 12500*time.Millisecond)
		l, err := client.CoordinationV1().Leases("podjanitor").Get(ctx, "podjanitor", metav1.GetOptions{})
		must(t, err)
		l.Spec.HolderIdentity = ptr.To("other")
		_, err = client.CoordinationV1().Leases("podjanitor").Update(ctx, l, metav1.UpdateOptions{})
		must(t, err)
		_, _, err = lock.Get(ctx)
		must(t, err)
		check(t, gate, "the Lease read held by another", false, 0)
	})
	t.Run("released", func(t *testing.T) {
		_, gate, lock, _ := setup(t, ptr.To(""))
		_, _, err := lock.Get(ctx)
		must(t, err)
		must(t, lock.Update(ctx, record(id)))
		if released, err := releaseLease(ctx, lock, time.Second); !released || err != nil {
			t.Fatalf("releaseLease = %v, %v; want released", released, err)
		}
		check(t, gate, "released", false, 0)
	})
	t.Run("created, none read before", func(t *testing.T) {
		_, gate, lock, _ := setup(t, nil)
		if _, _, err := lock.Get(ctx); !apierrors.IsNotFound(err) {
			t.Fatalf("Get = %v, want not found", err)
		}
		must(t, lock.Create(ctx, record(id)))
		check(t, gate, "created", true, 12500*time.Millisecond)
	})
	for _, how := range []string{"created again, the Lease read deleted", "named holder by hand"} {
		t.Run(how, func(t *testing.T) {
			holder := "other"
			if how == "named holder by hand" {
				holder = id
			}
			clk, gate, lock, client := setup(t, &holder)
			_, _, err := lock.Get(ctx)
			must(t, err)
			if how == "named holder by hand" {
				must(t, lock.Update(ctx, record(id)))
			} else {
				must(t, client.CoordinationV1().Leases("podjanitor").Delete(ctx, "podjanitor", metav1.DeleteOptions{}))
				if _, _, err := lock.Get(ctx); !apierrors.IsNotFound(err) {
					t.Fatalf("Get = %v, want not found", err)
				}
				must(t, lock.Create(ctx, record(id)))
			}
			check(t, gate, "taken", false, 15*time.Second)
			clk.Step(14 * time.Second)
			must(t, lock.Update(ctx, record(id)))
			clk.Step(time.Second - time.Nanosecond)
			check(t, gate, "renewed, a lease duration after the take less 1 ns", false, time.Nanosecond)
			clk.Step(time.Nanosecond)
			check(t, gate, "a lease duration after the take", true, 11500*time.Millisecond)
		})
	}
	t.Run("the leader creates the Lease deleted under it", func(t *testing.T) {
		clk, gate, lock, client := setup(t, ptr.To(""))
		_, _, err := lock.Get(ctx)
		must(t, err)
		must(t, lock.Update(ctx, record(id)))
		must(t, client.CoordinationV1().Leases("podjanitor").Delete(ctx, "podjanitor", metav1.DeleteOptions{}))
		clk.Step(time.Second)
		if _, _, err := lock.Get(ctx); !apierrors.IsNotFound(err) {
			t.Fatalf("Get = %v, want not found", err)
		}
		check(t, gate, "the Lease gone", false, 0)
		must(t, lock.Create(ctx, record(id)))
		check(t, gate, "created again by the leader", true, 12500*time.Millisecond)
	})
}

// TestNoRemovalStartsWithoutTheLease: a due pod is not removed while
// MayRemove says no: the Lease not renewed in time (tried again with the
// workqueue's backoff), or a new leader's wait (parked until its end); it
// goes once MayRemove says yes.
func TestNoRemovalStartsWithoutTheLease(t *testing.T) {
	pod := apitest.Pod("done", t0.Add(-time.Hour), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	var may atomic.Bool
	var after atomic.Int64
	f := newFixture(t, Options{MayRemove: func() (time.Duration, bool) {
		if may.Load() {
			return time.Minute, true
		}
		return time.Duration(after.Load()), false
	}}, pod)
	f.process(keyOf(pod))
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed without the Lease renewed, want none", n)
	}
	if f.c.queue.NumRequeues(keyOf(pod)) == 0 {
		t.Error("the pod is not tried again")
	}
	after.Store(int64(5 * time.Second))
	f.process(keyOf(pod))
	if n := f.deletes(); n != 0 {
		t.Fatalf("%d pods removed in a new leader's wait, want none", n)
	}
	if f.c.state.wakesWithin(5*time.Second-time.Millisecond) || !f.c.state.wakesWithin(5*time.Second) {
		t.Error("the pod is not parked until the wait's end, 5 s")
	}
	may.Store(true)
	f.process(keyOf(pod))
	if n := f.deletes(); n != 1 {
		t.Errorf("%d pods removed with the Lease, want 1", n)
	}
}

// TestRemovalCallEndsWithTheLease: a removal call that hangs is cut off
// when what MayRemove leaves of the Lease runs out, well before the write
// timeout.
func TestRemovalCallEndsWithTheLease(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	pod := apitest.Pod("hung", t0.Add(-time.Hour), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{WriteTimeout: time.Minute, MayRemove: func() (time.Duration, bool) { return 200 * time.Millisecond, true }}, pod)
	f.c.client = kubernetes.NewForConfigOrDie(&rest.Config{Host: srv.URL})
	start := time.Now()
	d := policy.Decision{Deadline: t0, Action: policy.ActionDelete, Reason: policy.ReasonTTL}
	if _, err := f.c.removePod(f.ctx, pod, d); err == nil {
		t.Fatal("the hung call succeeded")
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the call took %v, want it cut off near the 200ms left of the Lease, not the minute of the write timeout", took)
	}
}

// shortLease is a Lease of short durations, for tests of real elections.
var shortLease = leaseConfig{name: "podjanitor", namespace: "podjanitor", duration: 2 * time.Second, renewDeadline: 1500 * time.Millisecond, retryPeriod: 300 * time.Millisecond}

// replica runs runAsLeader with a gate on the real clock, and records each
// moment its gate let a removal start, with the time the call could take.
type replica struct {
	gate    *removalGate
	mu      sync.Mutex
	starts  []time.Time // when a removal could start
	ends    []time.Time // when a call started then had to end
	done    chan error
	leading atomic.Bool
}

func runReplica(ctx context.Context, client kubernetes.Interface, id string, watchdog *leaderelection.HealthzAdaptor) *replica {
	r := &replica{gate: newRemovalGate(clock.RealClock{}, shortLease), done: make(chan error, 1)}
	lease := shortLease
	lease.identity = id
	go func() {
		r.done <- runAsLeader(ctx, lease, client, r.gate, r.leading.Store, watchdog, func(ctx context.Context) error {
			for ctx.Err() == nil {
				if within, ok := r.gate.mayRemove(); ok {
					now := time.Now()
					r.mu.Lock()
					r.starts, r.ends = append(r.starts, now), append(r.ends, now.Add(within))
					r.mu.Unlock()
				}
				time.Sleep(5 * time.Millisecond)
			}
			return nil
		})
	}()
	return r
}

func (r *replica) removals() (starts, ends []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.starts), slices.Clone(r.ends)
}

// TestOneLeaderAtATime: two replicas; the leader's Lease stops being
// renewed (its writes fail), is taken by hand (holderIdentity set to the
// other), or is deleted. The other takes over, and every removal the old
// leader could start had to end (its call's timeout) before the new one's
// first could start; the old one returns errLeaseLost.
func TestOneLeaderAtATime(t *testing.T) {
	for _, how := range []string{"renewals fail", "taken by hand", "deleted"} {
		t.Run(how, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			client := fake.NewClientset()
			var failing atomic.Value // the identity whose Lease writes fail
			failing.Store("")
			client.PrependReactor("*", "leases", func(a core.Action) (bool, runtime.Object, error) {
				w, ok := a.(interface{ GetObject() runtime.Object })
				if !ok {
					return false, nil, nil
				}
				l := w.GetObject().(*coordinationv1.Lease)
				if h := l.Spec.HolderIdentity; h != nil && *h != "" && *h == failing.Load().(string) {
					if how == "taken by hand" { // its resourceVersion is not the Lease's: the fake clientset does not check it
						return true, nil, apierrors.NewConflict(coordinationv1.Resource("leases"), l.Name, errors.New("modified"))
					}
					return true, nil, apierrors.NewInternalError(errors.New("etcd"))
				}
				return false, nil, nil
			})
			a := runReplica(ctx, client, "a", nil)
			waitFor(t, "the first replica to remove", func() bool { starts, _ := a.removals(); return len(starts) > 0 })
			b := runReplica(ctx, client, "b", nil)
			time.Sleep(time.Second) // b reads the Lease held
			if b.leading.Load() {
				t.Fatal("both replicas lead")
			}
			leases := client.CoordinationV1().Leases(shortLease.namespace)
			l, err := leases.Get(ctx, shortLease.name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			switch how {
			case "renewals fail":
				failing.Store("a")
			case "taken by hand":
				l.Spec.HolderIdentity = ptr.To("b")
				if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				failing.Store("a")
			case "deleted":
				failing.Store("a") // and its creates: the other replica creates the Lease
				if err := leases.Delete(ctx, shortLease.name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-a.done:
				if !errors.Is(err, errLeaseLost) {
					t.Errorf("the old leader returned %v, want errLeaseLost", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the old leader still runs 20 s after its Lease was lost")
			}
			waitFor(t, "the other replica to remove", func() bool { starts, _ := b.removals(); return len(starts) > 0 })
			_, oldEnds := a.removals()
			newStarts, _ := b.removals()
			if last, first := slices.MaxFunc(oldEnds, time.Time.Compare), newStarts[0]; !last.Before(first) {
				t.Errorf("the old leader's removals could run until %v, after the new leader's first at %v", last.Format(time.StampMicro), first.Format(time.StampMicro))
			}
		})
	}
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// TestHealthzFailsWhenRenewalsStop: /healthz's check (the watchdog) passes
// while the leader renews its Lease; once the Lease's writes fail and the
// leader is stuck (its work does not stop), it fails within the lease
// duration plus the watchdog's timeout after the last renewal. Without the
// watchdog tied to the elector it never fails.
func TestHealthzFailsWhenRenewalsStop(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset()
	var failing atomic.Bool
	var lastRenewal atomic.Int64
	client.PrependReactor("update", "leases", func(core.Action) (bool, runtime.Object, error) {
		if failing.Load() {
			return true, nil, apierrors.NewInternalError(errors.New("etcd"))
		}
		lastRenewal.Store(time.Now().UnixNano())
		return false, nil, nil
	})
	const timeout = 500 * time.Millisecond
	watchdog := leaderelection.NewLeaderHealthzAdaptor(timeout)
	stuck := make(chan struct{})
	defer close(stuck)
	var leading atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- runAsLeader(ctx, shortLease, client, nil, leading.Store, watchdog, func(context.Context) error {
			<-stuck
			return nil
		})
	}()
	waitFor(t, "the replica to lead", leading.Load)
	waitFor(t, "a renewal", func() bool { return lastRenewal.Load() != 0 })
	time.Sleep(3 * shortLease.duration / 2)
	if err := watchdog.Check(nil); err != nil {
		t.Fatalf("/healthz fails while the leader renews its Lease: %v", err)
	}
	failing.Store(true)
	waitFor(t, "/healthz to fail", func() bool { return watchdog.Check(nil) != nil })
	if after := time.Since(time.Unix(0, lastRenewal.Load())); after > shortLease.duration+timeout+2*time.Second {
		t.Errorf("/healthz failed %v after the last renewal, want within %v and a margin", after, shortLease.duration+timeout)
	}
	select {
	case err := <-done:
		t.Fatalf("runAsLeader returned %v with its work stuck", err)
	default:
	}
}

// TestStartReadsOutlastAHiccup: at a takeover the API server answers the
// reads of the records (the Lease's annotations, the namespaces'
// ConfigMap) 500 for a while, longer than client-go's DefaultBackoff (4
// tries, ~0.3 s) waited: the start reads them again until they answer and
// starts, rather than exit 1.
func TestStartReadsOutlastAHiccup(t *testing.T) {
	first, _, pods := namespaceWaveFixture(t)
	first.start(pods)
	record := first.recordedNamespaces()
	f, _, _ := namespaceWaveFixtureWith(t, nil, recordedLease(t, "1m"))
	f.restore(record)
	const refusals = 6
	reads := map[string]int{}
	var mu sync.Mutex
	for _, resource := range []string{"leases", "configmaps"} {
		f.client.PrependReactor("get", resource, func(core.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			if reads[resource]++; reads[resource] <= refusals {
				return true, nil, apierrors.NewInternalError(errors.New("etcd leader changed"))
			}
			return false, nil, nil
		})
	}
	if err := f.c.startWave(f.ctx); err != nil {
		t.Fatalf("the start failed on %d refusals of each read: %v", refusals, err)
	}
	mu.Lock()
	defer mu.Unlock()
	// One read of the record is the Lease's and then the ConfigMap's: each
	// of the ConfigMap's refusals reads the Lease again.
	for resource, want := range map[string]int{"leases": 2*refusals + 1, "configmaps": refusals + 1} {
		if reads[resource] != want {
			t.Errorf("%s read %d times, want %d (%d refusals of each)", resource, reads[resource], want, refusals)
		}
	}
}

// TestTakeoverStartsAtTheCap: a standby that becomes the leader over a
// backlog removes at the cap from the start, without a burst of its own:
// the last leader may have spent its burst just before the handover, and
// the two together stay within the cap plus one burst.
func TestTakeoverStartsAtTheCap(t *testing.T) {
	const n = 20
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, overdue(fmt.Sprintf("pod-%02d", i), time.Duration(i)*time.Minute))
	}
	f := newFixture(t, Options{MaxRemovalsPerSecond: 10, RemovalBurst: 5, NoRemovalEvents: true}, pods...)
	f.c.Standby()
	ctx, cancel := context.WithCancel(f.ctx)
	ran := make(chan struct{})
	t.Cleanup(func() { cancel(); <-ran })
	go func() { defer close(ran); _ = f.c.Run(ctx, 1) }()
	settled := func() {
		t.Helper()
		waitFor(t, "the controller to settle", func() bool {
			return f.metrics.WorkersRunning() && f.c.Pending() == 0 && f.c.state.settled() && !f.c.state.backlogIsHeld()
		})
		time.Sleep(10 * time.Millisecond)
	}
	settled()
	if got := f.deletes(); got != 0 {
		t.Errorf("%d removed at the takeover, want none before a token comes at the cap", got)
	}
	for step := 1; step <= 10; step++ {
		f.clock.Step(100 * time.Millisecond)
		settled()
		if got := f.deletes(); got != step {
			t.Fatalf("%d removed %v after the takeover, want %d at 10/s", got, time.Duration(step)*100*time.Millisecond, step)
		}
	}
}

// BenchmarkMayRemove: what the removal gate costs a removal (an atomic
// load and a read of the process's clock).
func BenchmarkMayRemove(b *testing.B) {
	clk, err := apiclock.ProcessClock(klog.Background())
	if err != nil {
		b.Fatal(err)
	}
	gate := newRemovalGate(clk, testLease)
	gate.renewed(clk.Now(), clk.Now())
	for b.Loop() {
		if _, ok := gate.mayRemove(); !ok {
			b.Fatal("the gate is closed")
		}
	}
}
