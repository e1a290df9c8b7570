package podcache

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/policy"
)

// PodTransform returns the pod informer's transform: the fields leanPod keeps,
// packed into a cachedPod. TestLeanPodKeepsDecisions proves that decisions on
// what the cache gives back equal decisions on full pods.
func PodTransform(prefix string) cache.TransformFunc {
	return RememberingPodTransform(prefix, nil)
}

// RememberingPodTransform is PodTransform that also reads the version of the
// pod the informer's store holds (nil: none), to keep its status time while
// the policy's clocks read the same times from the status (see
// keptStatusTime).
func RememberingPodTransform(prefix string, store cache.KeyGetter) cache.TransformFunc {
	annotationPrefix := prefix + "/"
	return func(obj interface{}) (interface{}, error) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil // a cachedPod or a tombstone: already transformed
		}
		lean := leanPod(pod, annotationPrefix)
		keptStatusTime(lean, store)
		return packPod(lean)
	}
}

// keptStatusTime gives the lean pod the status time of the version in store
// when both are the same pod whose status reports the same NodeClocks, and
// that version's time is earlier.
//
// The policy bounds the times a node writes by when the API server stored the
// status (policy.StatusWrittenAt), so a node's clock cannot make a removal
// early. A crash-looping pod's status changes at every restart, and a pod
// stuck pulling an image flips between ErrImagePull and ImagePullBackOff,
// while the times its clock counts from stay; counting from the latest write
// would start its clock over every few minutes, for ever. The earlier version
// already carried those times, so the API server knew them by its status time
// too. Since the informer transforms an event before it stores the previous
// one, store may hold an older version than the one before: its time is then
// the later one or not kept, late, never early.
func keptStatusTime(lean *corev1.Pod, store cache.KeyGetter) {
	if store == nil || len(lean.ManagedFields) == 0 {
		return
	}
	clocks := policy.NodeClocksOf(lean)
	if clocks.IsZero() {
		return
	}
	obj, exists, err := store.GetByKey(lean.Namespace + "/" + lean.Name)
	if err != nil || !exists {
		return
	}
	old, err := Pod(obj)
	if err != nil || old.UID != lean.UID || !policy.NodeClocksOf(old).Equal(clocks) {
		return
	}
	oldTime, ok := policy.StatusWrittenAt(old)
	if ok && oldTime.Before(lean.ManagedFields[0].Time.Time) {
		lean.ManagedFields[0].Time = &metav1.Time{Time: oldTime}
	}
}

// leanPod returns a copy of pod with only what the policy package reads:
//
//   - metadata: name, namespace, uid, resourceVersion (delete preconditions),
//     creationTimestamp, deletionTimestamp, labels (rule label selectors),
//     ownerReferences (apiVersion, kind, name, uid, controller; rule owner kinds),
//     annotations under annotationPrefix and kubernetes.io/config.mirror (mirror pods),
//     and of managedFields one entry: subresource status and the latest time
//     of the status entries (policy.StatusWrittenAt; no manager, no fields);
//   - spec: priorityClassName (rules leave critical pods alone) and
//     schedulingGroup (a pod waiting for its pod group is not stuck Pending);
//   - status: phase, reason, startTime, the conditions the policy reads
//     (DisruptionTarget, Ready, PodScheduled, AllContainersRestarting: type,
//     status, reason, lastTransitionTime), and for each waiting or terminated
//     (init) container: name, restartCount, state.waiting.reason,
//     state.terminated.reason, exitCode and finishedAt. Of a Pending pod,
//     every (init) container's status, running (without startedAt) or without
//     a state included: they tell a pod making progress from one stuck
//     Pending. Of a container that has restarted, in a pod not terminal, the
//     status whatever its state, and lastTerminationState.terminated's
//     reason, exitCode and finishedAt: they show a crash loop between two
//     back-offs (policy.NodeClocks).
//
// Dropped: the rest of managedFields, every other annotation, the rest of the spec, other
// conditions (PodResizePending among them), the statuses of running containers
// that have not restarted of pods not Pending, and the rest of the status
// (messages, IPs, images, resources, the rest of lastTerminationState, ...).
func leanPod(pod *corev1.Pod, annotationPrefix string) *corev1.Pod {
	pending := pod.Status.Phase == corev1.PodPending
	terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              pod.Name,
			Namespace:         pod.Namespace,
			UID:               pod.UID,
			ResourceVersion:   pod.ResourceVersion,
			CreationTimestamp: pod.CreationTimestamp,
			DeletionTimestamp: pod.DeletionTimestamp,
			Labels:            pod.Labels,
			Annotations:       keptAnnotations(pod.Annotations, annotationPrefix),
			OwnerReferences:   leanOwners(pod.OwnerReferences),
			ManagedFields:     leanManagedFields(pod),
		},
		Spec: corev1.PodSpec{PriorityClassName: pod.Spec.PriorityClassName, SchedulingGroup: pod.Spec.SchedulingGroup},
		Status: corev1.PodStatus{
			Phase:                 pod.Status.Phase,
			Reason:                pod.Status.Reason,
			StartTime:             pod.Status.StartTime,
			Conditions:            leanConditions(pod.Status.Conditions),
			ContainerStatuses:     leanContainerStatuses(pod.Status.ContainerStatuses, pending, terminal),
			InitContainerStatuses: leanContainerStatuses(pod.Status.InitContainerStatuses, pending, terminal),
		},
	}
}

// leanManagedFields is one status entry with the pod's StatusWrittenAt, or
// none when the pod has no status entry.
func leanManagedFields(pod *corev1.Pod) []metav1.ManagedFieldsEntry {
	t, ok := policy.StatusWrittenAt(pod)
	if !ok {
		return nil
	}
	return []metav1.ManagedFieldsEntry{{Subresource: "status", Time: &metav1.Time{Time: t}}}
}

func keptAnnotations(all map[string]string, prefix string) map[string]string {
	var kept map[string]string
	for k, v := range all {
		if strings.HasPrefix(k, prefix) || k == corev1.MirrorPodAnnotationKey {
			if kept == nil {
				kept = map[string]string{}
			}
			kept[k] = v
		}
	}
	return kept
}

func leanOwners(refs []metav1.OwnerReference) []metav1.OwnerReference {
	if len(refs) == 0 {
		return nil
	}
	out := make([]metav1.OwnerReference, len(refs))
	for i, r := range refs {
		out[i] = metav1.OwnerReference{APIVersion: r.APIVersion, Kind: r.Kind, Name: r.Name, UID: r.UID, Controller: r.Controller}
	}
	return out
}

// readConditions are the pod conditions the policy package reads.
var readConditions = []corev1.PodConditionType{corev1.DisruptionTarget, corev1.PodReady, corev1.PodScheduled, corev1.AllContainersRestarting}

func leanConditions(conds []corev1.PodCondition) []corev1.PodCondition {
	var out []corev1.PodCondition
	for _, c := range conds {
		if slices.Contains(readConditions, c.Type) {
			out = append(out, corev1.PodCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, LastTransitionTime: c.LastTransitionTime})
		}
	}
	return slices.Clip(out)
}

// leanContainerStatuses keeps the statuses of waiting and terminated
// containers; with all, those of running containers and of containers
// without a state; and unless terminal, those of containers that have
// restarted, with their last termination. The policy reads that a container
// runs (or has no state yet) only of Pending pods, and a last termination
// only of a restarted container of a pod not terminal; the statuses of the
// other pods' running containers, most of the cache, are dropped.
func leanContainerStatuses(statuses []corev1.ContainerStatus, all, terminal bool) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	for _, s := range statuses {
		restarted := !terminal && s.RestartCount > 0
		lean := corev1.ContainerStatus{Name: s.Name, RestartCount: s.RestartCount}
		if w := s.State.Waiting; w != nil {
			lean.State.Waiting = &corev1.ContainerStateWaiting{Reason: w.Reason}
		}
		if t := s.State.Terminated; t != nil {
			lean.State.Terminated = leanTermination(t)
		}
		if (all || restarted) && s.State.Running != nil {
			lean.State.Running = &corev1.ContainerStateRunning{}
		}
		if t := s.LastTerminationState.Terminated; restarted && t != nil {
			lean.LastTerminationState.Terminated = leanTermination(t)
		}
		if all || restarted || lean.State.Waiting != nil || lean.State.Terminated != nil {
			out = append(out, lean)
		}
	}
	return slices.Clip(out)
}

func leanTermination(t *corev1.ContainerStateTerminated) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{Reason: t.Reason, ExitCode: t.ExitCode, FinishedAt: t.FinishedAt}
}
