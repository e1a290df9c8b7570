package podcache

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/policy"
)

// statusPod is a pod whose status the kubelet wrote at written, the API
// server stamping it, with a manager entry for the pod itself too.
func statusPod(uid string, written time.Time, status corev1.PodStatus) *corev1.Pod {
	created := metav1.NewTime(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "shop", UID: types.UID("uid-" + uid), CreationTimestamp: created,
			Annotations: map[string]string{"podjanitor.io/ttl-after-finished": "1h"},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, Time: ptrTo(created),
					FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{}}`)}},
				{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status",
					Time: ptrTo(metav1.NewTime(written)), FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{}}`)}},
			}},
		Status: status,
	}
}

// TestLeanPodKeepsTheStatusWriteTime: the time of the latest status write,
// which bounds the times nodes write (policy.StatusWrittenAt), survives the
// lean cache; a node whose clock is 2h behind cannot make a finished pod due
// early through it.
func TestLeanPodKeepsTheStatusWriteTime(t *testing.T) {
	written := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	full := statusPod("a", written, corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{Name: "main",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", FinishedAt: metav1.NewTime(written.Add(-2 * time.Hour))}}}}})
	full.ManagedFields = append(full.ManagedFields, metav1.ManagedFieldsEntry{Manager: "kube-controller-manager",
		Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", Time: ptrTo(metav1.NewTime(written.Add(-time.Minute)))})
	obj, err := PodTransform("podjanitor.io")(full)
	if err != nil {
		t.Fatal(err)
	}
	lean, err := Pod(obj)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := policy.StatusWrittenAt(lean); !ok || !got.Equal(written) {
		t.Errorf("lean pod's status write time = %v, %v; want %v", got, ok, written)
	}
	if n := len(lean.ManagedFields); n != 1 || lean.ManagedFields[0].Manager != "" || lean.ManagedFields[0].FieldsV1 != nil {
		t.Errorf("lean pod keeps managedFields %+v; want one entry without manager and fields", lean.ManagedFields)
	}
	d, err := (&policy.Evaluator{}).Decide(lean, &policy.Namespace{}, written.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if want := written.Add(time.Hour); !d.Deadline.Equal(want) {
		t.Errorf("deadline %v, want %v: an hour after the status write", d.Deadline, want)
	}

	none := full.DeepCopy()
	none.ManagedFields = none.ManagedFields[:1]
	if obj, err = PodTransform("podjanitor.io")(none); err != nil {
		t.Fatal(err)
	}
	if lean, _ := Pod(obj); len(lean.ManagedFields) != 0 {
		t.Errorf("a pod without status writes: lean managedFields %+v, want none", lean.ManagedFields)
	}
}

// TestCacheKeepsTheFirstStatusWriteOfAClock: a crash-looping pod's status
// changes at every restart while its Ready=False transition stays; the cache
// keeps the status time of the first version it saw with that transition, so
// the crashLooping clock does not start over at every write. A new transition,
// another pod of the same name, or a pod the clocks do not apply to takes the
// new time.
func TestCacheKeepsTheFirstStatusWriteOfAClock(t *testing.T) {
	first := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	readyFalse := metav1.NewTime(first.Add(-2 * time.Hour)) // a node clock 2h behind
	crashLooping := func(restarts int32, readySince metav1.Time) corev1.PodStatus {
		return corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", LastTransitionTime: readySince}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "main", RestartCount: restarts,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}}
	}
	running := corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: readyFalse}}}

	tests := []struct {
		name   string
		stored *corev1.Pod // the version in the store
		next   *corev1.Pod
		want   time.Time
	}{
		{"same transition, a restart later", statusPod("a", first, crashLooping(3, readyFalse)),
			statusPod("a", first.Add(5*time.Minute), crashLooping(4, readyFalse)), first},
		{"a new transition", statusPod("a", first, crashLooping(3, readyFalse)),
			statusPod("a", first.Add(5*time.Minute), crashLooping(4, metav1.NewTime(first.Add(4*time.Minute)))), first.Add(5 * time.Minute)},
		{"another pod of the same name", statusPod("a", first, crashLooping(3, readyFalse)),
			statusPod("b", first.Add(5*time.Minute), crashLooping(4, readyFalse)), first.Add(5 * time.Minute)},
		{"no clock applies", statusPod("a", first, running),
			statusPod("a", first.Add(5*time.Minute), running), first.Add(5 * time.Minute)},
		{"nothing stored", nil, statusPod("a", first.Add(5*time.Minute), crashLooping(4, readyFalse)), first.Add(5 * time.Minute)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc)
			transform := RememberingPodTransform("podjanitor.io", store)
			if tt.stored != nil {
				obj, err := transform(tt.stored)
				if err != nil {
					t.Fatal(err)
				}
				if err := store.Add(obj); err != nil {
					t.Fatal(err)
				}
			}
			obj, err := transform(tt.next)
			if err != nil {
				t.Fatal(err)
			}
			lean, err := Pod(obj)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := policy.StatusWrittenAt(lean); !got.Equal(tt.want) {
				t.Errorf("status write time %v, want %v", got, tt.want)
			}
		})
	}

	// The clock counts from the first write: a crash-looping rule of 20m
	// comes 20m after it, not 20m after the latest restart.
	rule, err := policy.NewPolicy(policy.Rule{Name: "crash", Clock: policy.ClockCrashLooping, After: 20 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var writes []*corev1.Pod
	for i := range 10 {
		writes = append(writes, statusPod("a", first.Add(time.Duration(i)*5*time.Minute), crashLooping(int32(3+i), readyFalse)))
	}
	lean := cachedAfter(t, writes)
	d, err := (&policy.Evaluator{Policy: rule}).Decide(lean, &policy.Namespace{}, first.Add(50*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if want := first.Add(20 * time.Minute); !d.Deadline.Equal(want) {
		t.Errorf("crashLooping deadline %v, want %v", d.Deadline, want)
	}
}

// TestCacheKeepsACrashLoopBetweenBackOffs: with a crash back-off of a second
// (KubeletCrashLoopBackOffMax, Kubernetes 1.35+), most status writes of a
// crash-looping pod show its container running again or just exited, not in
// CrashLoopBackOff. The cache keeps the first write of the loop across them,
// so a crashLooping rule of 20m comes 20m after it; a pod not Ready for hours
// whose container fails for the first time since counts from that failure's
// write, not from hours before.
func TestCacheKeepsACrashLoopBetweenBackOffs(t *testing.T) {
	first := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	status := func(readySince time.Time, restarts int32, state corev1.ContainerState, lastExit time.Time) corev1.PodStatus {
		s := corev1.ContainerStatus{Name: "main", RestartCount: restarts, State: state}
		if !lastExit.IsZero() {
			s.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1, FinishedAt: metav1.NewTime(lastExit)}
		}
		return corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", LastTransitionTime: metav1.NewTime(readySince)}},
			ContainerStatuses: []corev1.ContainerStatus{s}}
	}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(first)}}
	backOff := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	exited := func(at time.Time) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1, FinishedAt: metav1.NewTime(at)}}
	}
	rule, err := policy.NewPolicy(policy.Rule{Name: "crash", Clock: policy.ClockCrashLooping, After: 20 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// deadline feeds the writes to the cache in order and decides the last
	// one at the end.
	deadline := func(t *testing.T, writes []*corev1.Pod) time.Time {
		t.Helper()
		lean := cachedAfter(t, writes)
		d, err := (&policy.Evaluator{Policy: rule}).Decide(lean, &policy.Namespace{}, writes[len(writes)-1].ManagedFields[1].Time.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return d.Deadline
	}

	t.Run("a loop of 1 s back-offs", func(t *testing.T) {
		readySince := first.Add(-3 * time.Second) // the first failure, as the node wrote it
		var writes []*corev1.Pod
		for i := range 30 * 60 / 4 { // one loop every 4 s, for 30 minutes
			at := first.Add(time.Duration(i) * 4 * time.Second)
			restarts := int32(2 + i)
			writes = append(writes,
				statusPod("a", at, status(readySince, restarts, backOff, at.Add(-time.Second))),
				statusPod("a", at.Add(time.Second), status(readySince, restarts+1, running, at.Add(-time.Second))),
				statusPod("a", at.Add(3*time.Second), status(readySince, restarts+1, exited(at.Add(3*time.Second)), at.Add(-time.Second))))
		}
		writes = append(writes, statusPod("a", first.Add(30*time.Minute), status(readySince, 500, backOff, first.Add(30*time.Minute-time.Second))))
		if got, want := deadline(t, writes), first.Add(20*time.Minute); !got.Equal(want) {
			t.Errorf("crashLooping deadline %v, want %v: 20m after the loop's first write", got, want)
		}
	})

	t.Run("not Ready for hours, a first failure since", func(t *testing.T) {
		readySince := first.Add(-3 * time.Hour) // readiness failing, the container running
		oldOOM := first.Add(-72 * time.Hour)
		writes := []*corev1.Pod{
			statusPod("a", first.Add(-3*time.Hour), status(readySince, 1, running, oldOOM)),
			statusPod("a", first.Add(-time.Hour), status(readySince, 1, running, oldOOM)),
			statusPod("a", first, status(readySince, 1, exited(first), oldOOM)),
			statusPod("a", first.Add(time.Second), status(readySince, 2, running, first)),
			statusPod("a", first.Add(40*time.Second), status(readySince, 2, exited(first.Add(40*time.Second)), first)),
			statusPod("a", first.Add(41*time.Second), status(readySince, 2, backOff, first.Add(40*time.Second))),
		}
		if got, want := deadline(t, writes), first.Add(20*time.Minute); !got.Equal(want) {
			t.Errorf("crashLooping deadline %v, want %v: 20m after the first failure's write, not after the Ready=False transition 3h before", got, want)
		}
	})
}

// cachedAfter is the lean pod shop/web-1 as the pod cache holds it after
// writes, each through the remembering transform, with its
// ttl-after-finished annotation taken off (the rule decides).
func cachedAfter(t *testing.T, writes []*corev1.Pod) *corev1.Pod {
	t.Helper()
	store := cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc)
	transform := RememberingPodTransform("podjanitor.io", store)
	for _, w := range writes {
		obj, err := transform(w)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Update(obj); err != nil {
			t.Fatal(err)
		}
	}
	obj, _, _ := store.GetByKey("shop/web-1")
	lean, _ := Pod(obj)
	delete(lean.Annotations, "podjanitor.io/ttl-after-finished")
	return lean
}
