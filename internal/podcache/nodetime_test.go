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
	store := cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc)
	transform := RememberingPodTransform("podjanitor.io", store)
	for i := range 10 {
		obj, err := transform(statusPod("a", first.Add(time.Duration(i)*5*time.Minute), crashLooping(int32(3+i), readyFalse)))
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Update(obj); err != nil {
			t.Fatal(err)
		}
	}
	obj, _, _ := store.GetByKey("shop/web-1")
	lean, _ := Pod(obj)
	delete(lean.Annotations, "podjanitor.io/ttl-after-finished") // decided by the rule
	d, err := (&policy.Evaluator{Policy: rule}).Decide(lean, &policy.Namespace{}, first.Add(50*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if want := first.Add(20 * time.Minute); !d.Deadline.Equal(want) {
		t.Errorf("crashLooping deadline %v, want %v", d.Deadline, want)
	}
}
