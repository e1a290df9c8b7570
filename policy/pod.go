package policy

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Values of Kubernetes fields the policy reads.
const (
	reasonCrashLoopBackOff = "CrashLoopBackOff"
	reasonPodCompleted     = "PodCompleted"
	reasonPodFailed        = "PodFailed"

	// NoOwner stands for "no ownerReferences" in a rule's ownerKinds.
	NoOwner = "<none>"
)

// IsMirrorPod reports whether the pod is the API server's mirror of a static pod.
func IsMirrorPod(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[corev1.MirrorPodAnnotationKey]
	return ok
}

// isTerminal reports whether the pod has finished for good: phase Succeeded or Failed.
func isTerminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// DefaultAction is evict for Running pods (PodDisruptionBudgets apply to them)
// and delete for every other phase.
func DefaultAction(pod *corev1.Pod) Action {
	if pod.Status.Phase == corev1.PodRunning {
		return ActionEvict
	}
	return ActionDelete
}

// FinishTime is when a Succeeded or Failed pod finished; ok is false for any
// other phase. It is the first of: the DisruptionTarget=True condition's
// transition (evictions, preemption, PodGC); the Ready condition's transition
// when its reason is PodCompleted or PodFailed; the latest terminated
// finishedAt of any container or init container; status.startTime;
// creationTimestamp. Evicted pods often have no container statuses, so there
// is always an answer.
func FinishTime(pod *corev1.Pod) (t time.Time, ok bool) {
	if !isTerminal(pod) {
		return time.Time{}, false
	}
	if c := condition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.IsZero() {
		return c.LastTransitionTime.Time, true
	}
	if c := condition(pod, corev1.PodReady); c != nil && (c.Reason == reasonPodCompleted || c.Reason == reasonPodFailed) && !c.LastTransitionTime.IsZero() {
		return c.LastTransitionTime.Time, true
	}
	if t := latestContainerFinish(pod); !t.IsZero() {
		return t, true
	}
	if pod.Status.StartTime != nil && !pod.Status.StartTime.IsZero() {
		return pod.Status.StartTime.Time, true
	}
	return pod.CreationTimestamp.Time, true
}

func latestContainerFinish(pod *corev1.Pod) time.Time {
	var latest time.Time
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range statuses {
			if s.State.Terminated != nil && s.State.Terminated.FinishedAt.After(latest) {
				latest = s.State.Terminated.FinishedAt.Time
			}
		}
	}
	return latest
}

// pendingSince is when a Pending pod became unschedulable (the PodScheduled=False
// transition), else its creation; ok is false for pods not Pending.
func pendingSince(pod *corev1.Pod) (t time.Time, ok bool) {
	if pod.Status.Phase != corev1.PodPending {
		return time.Time{}, false
	}
	if c := condition(pod, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse && !c.LastTransitionTime.IsZero() {
		return c.LastTransitionTime.Time, true
	}
	return pod.CreationTimestamp.Time, true
}

// crashLoopingSince is when a pod with a container or init container waiting in
// CrashLoopBackOff (restarted at least minRestarts times) last became not
// Ready: the Ready=False transition, else its creation. ok is false when no
// container qualifies.
func crashLoopingSince(pod *corev1.Pod, minRestarts int32) (t time.Time, ok bool) {
	if !hasCrashLoopingContainer(pod, minRestarts) {
		return time.Time{}, false
	}
	if c := condition(pod, corev1.PodReady); c != nil && c.Status == corev1.ConditionFalse && !c.LastTransitionTime.IsZero() {
		return c.LastTransitionTime.Time, true
	}
	return pod.CreationTimestamp.Time, true
}

func hasCrashLoopingContainer(pod *corev1.Pod, minRestarts int32) bool {
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range statuses {
			if s.State.Waiting != nil && s.State.Waiting.Reason == reasonCrashLoopBackOff && s.RestartCount >= minRestarts {
				return true
			}
		}
	}
	return false
}

// podReasons lists the pod's status.reason (e.g. Evicted) and the reasons of
// its (init) containers' current state: waiting (CrashLoopBackOff,
// ImagePullBackOff) or terminated (OOMKilled, Error, Completed).
func podReasons(pod *corev1.Pod) []string {
	var reasons []string
	if pod.Status.Reason != "" {
		reasons = append(reasons, pod.Status.Reason)
	}
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range statuses {
			if s.State.Waiting != nil && s.State.Waiting.Reason != "" {
				reasons = append(reasons, s.State.Waiting.Reason)
			}
			if s.State.Terminated != nil && s.State.Terminated.Reason != "" {
				reasons = append(reasons, s.State.Terminated.Reason)
			}
		}
	}
	return reasons
}

// ownerKinds lists the kinds of the pod's owners, or NoOwner for a bare pod.
func ownerKinds(pod *corev1.Pod) []string {
	if len(pod.OwnerReferences) == 0 {
		return []string{NoOwner}
	}
	kinds := make([]string, 0, len(pod.OwnerReferences))
	for _, ref := range pod.OwnerReferences {
		kinds = append(kinds, ref.Kind)
	}
	return kinds
}

func condition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}
