package podcache

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/policy"
)

// TestLeanPodKeepsDecisions proves that the informer transform keeps every field
// the decisions read: over a generated set of pods (all phases, conditions,
// owners, annotations, container states), the pod the cache gives back is
// decided exactly as the full pod, with the example policy and with
// annotations only.
func TestLeanPodKeepsDecisions(t *testing.T) {
	examplePolicy, err := policy.LoadFile("../../artifacts/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	everyClock, err := policy.NewPolicy(
		policy.Rule{Name: "crash", Clock: policy.ClockCrashLooping, After: 20 * time.Minute},
		policy.Rule{Name: "stuck", Clock: policy.ClockPending, After: 30 * time.Minute},
		policy.Rule{Name: "done", Clock: policy.ClockFinished, After: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	evaluators := map[string]*policy.Evaluator{
		"annotations only": {},
		"example policy":   {Policy: examplePolicy},
		"other prefix":     {Prefix: "janitor.example.com", Policy: examplePolicy},
		"every clock":      {Policy: everyClock},
	}
	transforms := map[string]func(any) (any, error){
		"podjanitor.io":       PodTransform("podjanitor.io"),
		"janitor.example.com": PodTransform("janitor.example.com"),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	nows := []time.Time{base.Add(time.Minute), base.Add(2 * time.Hour), base.Add(50 * time.Hour), base.Add(9 * 24 * time.Hour)}

	decisions, withDeadline, byReason := 0, 0, map[string]int{}
	for i := range 5000 {
		full := generatePod(rng, i, base)
		for name, e := range evaluators {
			prefix := e.Prefix
			if prefix == "" {
				prefix = policy.DefaultAnnotationPrefix
			}
			obj, err := transforms[prefix](full.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			lean, err := Pod(obj)
			if err != nil {
				t.Fatal(err)
			}
			if want, got := policy.NodeClocksOf(full), policy.NodeClocksOf(lean); !got.Equal(want) {
				t.Fatalf("%s: pod %d: NodeClocks %+v on the lean pod, %+v on the full one\nfull pod: %+v", name, i, got, want, full)
			}
			for _, now := range nows {
				want, wantErr := e.Decide(full, &policy.Namespace{}, now)
				got, gotErr := e.Decide(lean, &policy.Namespace{}, now)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("%s: pod %d at %v: decision differs (-full,+lean):\n%s\nfull pod: %+v", name, i, now, diff, full)
				}
				if fmt.Sprint(wantErr) != fmt.Sprint(gotErr) {
					t.Fatalf("%s: pod %d: error %v on the full pod, %v on the lean one", name, i, wantErr, gotErr)
				}
				decisions++
				if want.HasDeadline() {
					withDeadline++
					byReason[want.Reason]++
				}
			}
		}
	}
	// The generator must exercise the rules, not only the "nothing to do" path.
	if withDeadline < decisions/6 {
		t.Errorf("only %d of %d decisions had a deadline; the generated pods are too uniform", withDeadline, decisions)
	}
	for _, reason := range []string{policy.ReasonFinished, policy.ReasonPending, policy.ReasonCrashLooping} {
		if byReason[reason] < 250 {
			t.Errorf("only %d decisions by the %s clock; the generated pods are too uniform", byReason[reason], reason)
		}
	}
}

// TestLeanPodKeepsProgress proves that the cache keeps the signs of progress
// of a Pending pod: a Job pod whose init container runs while another
// container shows ImagePullBackOff is not stuck, and a Pending pod with a
// container the kubelet has not given a state yet is not stuck either; on the
// full pod and on the cached one alike.
func TestLeanPodKeepsProgress(t *testing.T) {
	examplePolicy, err := policy.LoadFile("../../artifacts/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e := &policy.Evaluator{Policy: examplePolicy}
	created := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	pod := func(init []corev1.ContainerStatus, containers ...corev1.ContainerStatus) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "job-x", Namespace: "batch", UID: "uid-x", CreationTimestamp: metav1.NewTime(created),
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "job", UID: "job", Controller: ptrTo(true)}}},
			Status: corev1.PodStatus{Phase: corev1.PodPending,
				Conditions:            []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(created)}},
				InitContainerStatuses: init, ContainerStatuses: containers},
		}
	}
	running := corev1.ContainerStatus{Name: "init", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(created)}}}
	pullBackOff := corev1.ContainerStatus{Name: "main", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}
	noState := corev1.ContainerStatus{Name: "sidecar"}
	for name, full := range map[string]*corev1.Pod{
		"init container running, a container in ImagePullBackOff":  pod([]corev1.ContainerStatus{running}, pullBackOff),
		"a container without a state, another in ImagePullBackOff": pod(nil, pullBackOff, noState),
	} {
		obj, err := PodTransform("podjanitor.io")(full.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		lean, err := Pod(obj)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []*corev1.Pod{full, lean} {
			d, err := e.Decide(p, &policy.Namespace{}, created.Add(40*time.Minute))
			if err != nil || d.HasDeadline() {
				t.Errorf("%s: Decide() = %+v, %v; want no deadline", name, d, err)
			}
		}
	}
}

func TestLeanPodDropsWhatIsNotRead(t *testing.T) {
	full := generatePod(rand.New(rand.NewPCG(3, 4)), 0, time.Now())
	full.Annotations = map[string]string{"podjanitor.io/ttl": "1h", "kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 4000)}
	obj, err := PodTransform("podjanitor.io")(full)
	if err != nil {
		t.Fatal(err)
	}
	lean, err := Pod(obj)
	if err != nil {
		t.Fatal(err)
	}
	if len(lean.ManagedFields) > 1 || len(lean.Spec.Containers) != 0 || lean.Spec.NodeName != "" || lean.Status.Message != "" || lean.Status.PodIP != "" {
		t.Errorf("lean pod keeps unread fields: %+v", lean)
	}
	if diff := cmp.Diff(map[string]string{"podjanitor.io/ttl": "1h"}, lean.Annotations); diff != "" {
		t.Errorf("annotations (-want,+got):\n%s", diff)
	}
	if tomb, _ := PodTransform("podjanitor.io")("not a pod"); tomb != "not a pod" {
		t.Error("transform changed a non-pod object")
	}
	if again, _ := PodTransform("podjanitor.io")(obj); again != obj {
		t.Error("transform is not idempotent: it changed an object it had already transformed")
	}
}

// TestCachedPodRoundTrip proves that packing loses nothing leanPod keeps: the
// pod the cache gives back equals the lean pod field for field, and a
// cachedPod answers metav1.Object's getters and the informer's key functions
// as the pod would.
func TestCachedPodRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	base := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC).Local() // API times are local, in whole seconds
	for i := range 2000 {
		full := generatePod(rng, i, base)
		lean := leanPod(full, "podjanitor.io/")
		packed, err := packPod(lean)
		if err != nil {
			t.Fatal(err)
		}
		got, err := packed.Pod()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(lean, got); diff != "" {
			t.Fatalf("pod %d: unpacked pod differs from the lean pod (-lean,+unpacked):\n%s", i, diff)
		}
		if diff := cmp.Diff(lean.Labels, packed.GetLabels()); diff != "" {
			t.Fatalf("pod %d: GetLabels (-want,+got):\n%s", i, diff)
		}
		if diff := cmp.Diff(lean.Annotations, packed.GetAnnotations()); diff != "" {
			t.Fatalf("pod %d: GetAnnotations (-want,+got):\n%s", i, diff)
		}
		if diff := cmp.Diff(lean.OwnerReferences, packed.GetOwnerReferences()); diff != "" {
			t.Fatalf("pod %d: GetOwnerReferences (-want,+got):\n%s", i, diff)
		}
		if packed.GetNamespace() != lean.Namespace || packed.GetName() != lean.Name ||
			packed.GetResourceVersion() != lean.ResourceVersion || packed.GetUID() != lean.UID {
			t.Fatalf("pod %d: namespace, name, resourceVersion, uid %q %q %q %q; want %q %q %q %q", i,
				packed.GetNamespace(), packed.GetName(), packed.GetResourceVersion(), packed.GetUID(),
				lean.Namespace, lean.Name, lean.ResourceVersion, lean.UID)
		}
		if c := packed.GetCreationTimestamp(); !c.Equal(&lean.CreationTimestamp) {
			t.Fatalf("pod %d: GetCreationTimestamp %v, want %v", i, c, lean.CreationTimestamp)
		}
		if d := packed.GetDeletionTimestamp(); !d.Equal(lean.DeletionTimestamp) {
			t.Fatalf("pod %d: GetDeletionTimestamp %v, want %v", i, d, lean.DeletionTimestamp)
		}
		wantKey, _ := cache.MetaNamespaceKeyFunc(full)
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(packed); err != nil || key != wantKey {
			t.Fatalf("pod %d: key %q, %v; want %q", i, key, err, wantKey)
		}
		if cp := packed.DeepCopyObject().(*cachedPod); !reflect.DeepEqual(cp, packed) || cp == packed {
			t.Fatalf("pod %d: DeepCopyObject is not an equal copy", i)
		}
	}
}

// TestCachedPodIsImmutable: the informer's readers share a stored pod, so a
// setter must not change it quietly.
func TestCachedPodIsImmutable(t *testing.T) {
	p, err := packPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", ResourceVersion: "7"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if recover() == nil {
			t.Error("SetResourceVersion did not panic")
		}
		if p.GetResourceVersion() != "7" {
			t.Errorf("resourceVersion changed to %q", p.GetResourceVersion())
		}
	}()
	p.SetResourceVersion("8")
}

// TestCachedPodsShareWorkloadMetadata shows why packing saves memory: pods
// of one workload (equal labels and owners) share one copy of them.
func TestCachedPodsShareWorkloadMetadata(t *testing.T) {
	pod := func(name string, ttl string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID(name),
			Labels:          map[string]string{"app": "web", "pod-template-hash": "abc", "tier": "front"},
			Annotations:     map[string]string{"podjanitor.io/ttl": ttl},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-abc", UID: "rs-1", Controller: ptrTo(true)}}}}
	}
	a, _ := packPod(pod("web-abc-1", "1h"))
	b, _ := packPod(pod("web-abc-2", "1h"))
	c, _ := packPod(pod("web-abc-3", "2h"))
	if a.workload != b.workload || a.workload != c.workload {
		t.Error("pods of one workload do not share their packed labels and owners")
	}
	if got := c.GetAnnotations()["podjanitor.io/ttl"]; got != "2h" {
		t.Errorf("pod web-abc-3: ttl annotation %q after packing, want 2h", got)
	}
	if _, err := Pod(42); err == nil {
		t.Error("Pod accepted an object that is not a pod")
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "shop/web-abc-1", Obj: a}
	if got, err := Pod(tomb); err != nil || got.Name != "web-abc-1" || got.Labels["app"] != "web" {
		t.Errorf("Pod(tombstone) = %v, %v", got, err)
	}
}

// generatePod builds a pod with every field a real pod has, drawn at random
// from the values that matter to the policy.
func generatePod(rng *rand.Rand, i int, base time.Time) *corev1.Pod {
	pick := func(n int) int { return rng.IntN(n) }
	at := func() metav1.Time { return metav1.NewTime(base.Add(time.Duration(rng.IntN(72*60)) * time.Minute)) }
	phases := []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed, corev1.PodUnknown}
	namespaces := []string{"default", "kube-system", "ci-42", "shop-prod", "team-a"}
	prefixes := []string{"podjanitor.io", "janitor.example.com"}

	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("pod-%d", i), Namespace: namespaces[pick(len(namespaces))],
			UID: types.UID(fmt.Sprintf("uid-%d", i)), ResourceVersion: fmt.Sprint(1000 + i), Generation: 1,
			CreationTimestamp: metav1.NewTime(base),
			Labels:            map[string]string{"app": "web", "pod-template-hash": "abc"},
			Annotations:       map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z", "prometheus.io/scrape": "true"},
			Finalizers:        []string{"example.com/x"}[:pick(2)],
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate,
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{}}`)}}},
		},
		Spec: corev1.PodSpec{
			NodeName: "node-1", ServiceAccountName: "default", RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{Name: "main", Image: "example/web:1", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}},
				{Name: "sidecar", Image: "example/proxy:1"}},
		},
		Status: corev1.PodStatus{
			Phase: phases[pick(len(phases))], Message: "some message", PodIP: "10.0.0.1", HostIP: "10.1.0.1",
			QOSClass: corev1.PodQOSBestEffort,
		},
	}
	// Status writes: none, one, or two managers', the latest of them read.
	for range pick(3) {
		t := at()
		pod.ManagedFields = append(pod.ManagedFields, metav1.ManagedFieldsEntry{Manager: []string{"kubelet", "kwok"}[pick(2)],
			Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &t, Subresource: "status",
			FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:phase":{}}}`)}})
	}
	if pick(3) == 0 {
		pod.Labels["ci.example.com/pinned"] = []string{"true", "false"}[pick(2)]
	}
	if pick(4) == 0 {
		pod.DeletionTimestamp = ptrTo(at())
	}
	if pick(2) == 0 {
		pod.Status.StartTime = ptrTo(at())
	}
	if pick(3) == 0 {
		pod.Status.Reason = []string{"Evicted", "NodeLost", "Preempting"}[pick(3)]
	}
	switch pick(6) {
	case 1:
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-abc", UID: "rs", Controller: ptrTo(true)}}
	case 2:
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "job", UID: "job", Controller: ptrTo(true)}}
	case 3:
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "ds"}}
	case 4:
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs"},
			{APIVersion: "tekton.dev/v1", Kind: "TaskRun", Name: "tr", UID: "tr", BlockOwnerDeletion: ptrTo(true)}}
	}
	conditionTypes := []corev1.PodConditionType{corev1.PodScheduled, corev1.PodReady, corev1.ContainersReady, corev1.DisruptionTarget, corev1.PodInitialized}
	reasons := []string{"", "Unschedulable", "SchedulingGated", "PodCompleted", "PodFailed", "ContainersNotReady", "TerminationByKubelet", "EvictionByEvictionAPI"}
	for _, ct := range conditionTypes {
		if pick(2) == 0 {
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
				Type: ct, Status: []corev1.ConditionStatus{corev1.ConditionTrue, corev1.ConditionFalse}[pick(2)],
				Reason: reasons[pick(len(reasons))], Message: "why", LastTransitionTime: at(), LastProbeTime: at(),
			})
		}
	}
	// Conditions of the newer lifecycle (1.35+): restarts of all containers,
	// resizes.
	for _, ct := range []corev1.PodConditionType{corev1.AllContainersRestarting, corev1.PodResizePending, corev1.PodResizeInProgress} {
		if pick(8) == 0 {
			pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
				Type: ct, Status: []corev1.ConditionStatus{corev1.ConditionTrue, corev1.ConditionFalse}[pick(2)],
				Reason: []string{"", "RestartAllContainersStarted", "Deferred", "Infeasible"}[pick(4)], Message: "why", LastTransitionTime: at(),
			})
		}
	}
	status := func(name string) corev1.ContainerStatus {
		s := corev1.ContainerStatus{Name: name, Image: "example/web:1", ImageID: "sha256:x", ContainerID: "containerd://x",
			RestartCount: int32(pick(8)), Ready: pick(2) == 0, Started: ptrTo(true)}
		switch pick(4) {
		case 0:
			s.State.Running = &corev1.ContainerStateRunning{StartedAt: at()}
		case 1:
			waiting := []string{"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError", "ContainerCreating", "PodInitializing", "RestartingAllContainers"}
			s.State.Waiting = &corev1.ContainerStateWaiting{Reason: waiting[pick(len(waiting))], Message: "back-off"}
		case 2:
			s.State.Terminated = &corev1.ContainerStateTerminated{Reason: []string{"Completed", "Error", "OOMKilled", "RestartingAllContainers"}[pick(4)],
				ExitCode: []int32{0, 1, 42, 137}[pick(4)], StartedAt: at(), FinishedAt: at(), Message: "done", ContainerID: "containerd://x"}
		}
		if pick(2) == 0 {
			s.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{Reason: []string{"OOMKilled", "Error", "Completed", "RestartingAllContainers"}[pick(4)],
				ExitCode: []int32{137, 1, 0, 137}[pick(4)], StartedAt: at(), FinishedAt: at(), Message: "killed", ContainerID: "containerd://y"}
		}
		return s
	}
	for range pick(3) {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, status(fmt.Sprintf("c%d", len(pod.Status.ContainerStatuses))))
	}
	switch pick(4) {
	case 0:
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{status("init")}
	case 1:
		pod.Status.InitContainerStatuses = []corev1.ContainerStatus{status("init-0"), status("init-1")}
	}
	prefix := prefixes[pick(len(prefixes))]
	switch pick(9) {
	case 0:
		pod.Annotations[prefix+"/ttl"] = []string{"30m", "1d", "3x"}[pick(3)]
	case 1:
		pod.Annotations[prefix+"/expires-at"] = []string{"2026-11-02", "2026-11-01T14:00:00+01:00", "tomorrow"}[pick(3)]
	case 2:
		pod.Annotations[prefix+"/ttl-after-finished"] = []string{"1h", "0s"}[pick(2)]
	case 3:
		pod.Annotations[prefix+"/keep"] = []string{"true", "false", "yes"}[pick(3)]
		pod.Annotations[prefix+"/ttl"] = "1m"
	case 4:
		pod.Annotations[corev1.MirrorPodAnnotationKey] = "hash"
	}
	if pick(12) == 0 {
		pod.Spec.PriorityClassName = []string{"system-cluster-critical", "system-node-critical", "batch"}[pick(3)]
	}
	if pick(12) == 0 {
		pod.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptrTo([]string{"trainers", "workers-0"}[pick(2)])}
	}
	// Status writes the API server stamped: none, the kubelet's, and at times
	// the scheduler's or the controller manager's too.
	for _, manager := range []string{"kubelet", "kube-scheduler", "kube-controller-manager"}[:pick(4)] {
		pod.ManagedFields = append(pod.ManagedFields, metav1.ManagedFieldsEntry{Manager: manager,
			Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", Time: ptrTo(at()),
			FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{}}}`)}})
	}
	return pod
}

func ptrTo[T any](v T) *T { return &v }
