package policy

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Values of Kubernetes fields the policy reads.
const (
	reasonCrashLoopBackOff = "CrashLoopBackOff"
	reasonPodCompleted     = "PodCompleted"
	reasonPodFailed        = "PodFailed"
	// reasonRestartingAllContainers is the kubelet's reason for the state
	// and last termination of a container it removed to restart all the
	// pod's containers in place (Kubernetes 1.35+, KEP-5532).
	reasonRestartingAllContainers = "RestartingAllContainers"

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
// other phase, and for a pod without any time (not even a creationTimestamp).
//
// It is the latest of: every (init) container's terminated finishedAt, the
// DisruptionTarget=True transition (evictions, preemption, PodGC) and the
// Ready transition when its reason is PodCompleted or PodFailed; when the pod
// has none of these, status.startTime, else creationTimestamp. Each of these
// lies at or before the real end, so the latest is the closest to it and
// never early. A condition's time can lie far before the end, because the
// kubelet moves lastTransitionTime only when the condition's status changes:
// a pod that went not-ready at T1 and finished at T2 keeps T1. So conditions
// can only move the finish time later than the containers' finishedAt, never
// earlier. Evicted pods often have no container statuses; the
// DisruptionTarget transition, startTime or creationTimestamp still give them
// a finish time.
func FinishTime(pod *corev1.Pod) (t time.Time, ok bool) {
	if !isTerminal(pod) {
		return time.Time{}, false
	}
	finished := latestContainerFinish(pod)
	if c := condition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		finished = latest(finished, c.LastTransitionTime.Time)
	}
	if c := condition(pod, corev1.PodReady); c != nil && (c.Reason == reasonPodCompleted || c.Reason == reasonPodFailed) {
		finished = latest(finished, c.LastTransitionTime.Time)
	}
	if finished.IsZero() && pod.Status.StartTime != nil {
		finished = pod.Status.StartTime.Time
	}
	if finished.IsZero() {
		return createdAt(pod)
	}
	return finished, true
}

// NodeClocks are the times a pod's status reports that the policy's clocks
// count from, as FinishTime, the pending clock and the crashLooping clock
// read them (zero where a clock does not apply): mostly times of the node's
// clock. The lean pod cache compares them between versions of a pod to tell
// whether the status write it last saw changed them (see StatusWrittenAt).
//
// CrashLooping is also set between two back-offs of a crash loop
// (betweenBackOffs), when no container waits in CrashLoopBackOff: with a
// back-off of a second (KEP-5593), most writes of a crash-looping pod show
// its container running or just terminated, and the loop's first status
// write is kept across them.
type NodeClocks struct {
	Finished, Pending, CrashLooping time.Time
}

// NodeClocksOf reads the pod's NodeClocks.
func NodeClocksOf(pod *corev1.Pod) NodeClocks {
	var c NodeClocks
	c.Finished, _ = FinishTime(pod)
	c.Pending, _ = pendingSince(pod)
	c.CrashLooping, _ = crashLoopingSince(pod, 0)
	if c.CrashLooping.IsZero() && betweenBackOffs(pod) {
		c.CrashLooping, _ = crashLoopStart(pod)
	}
	return c
}

// Equal reports whether c and o hold the same instants.
func (c NodeClocks) Equal(o NodeClocks) bool {
	return c.Finished.Equal(o.Finished) && c.Pending.Equal(o.Pending) && c.CrashLooping.Equal(o.CrashLooping)
}

// IsZero reports whether no clock applies.
func (c NodeClocks) IsZero() bool {
	return c.Finished.IsZero() && c.Pending.IsZero() && c.CrashLooping.IsZero()
}

// StatusWrittenAt is the latest time of the pod's managedFields entries for
// the status subresource: when the API server last stored a change to the
// pod's status, by anyone (the kubelet, the scheduler, the controller
// manager), stamped by the API server's clock and truncated by it to the
// second. ok is false when the pod has no such entry (managedFields cleared).
//
// Every time a status reports came in by such a write (the API server ignores
// the status of a create and of an update of the pod itself), so the API
// server knew each of them at the latest by this time. The pod cache may keep
// an earlier time here: that of the first version it saw with the same
// NodeClocks, which the API server knew by then already.
func StatusWrittenAt(pod *corev1.Pod) (t time.Time, ok bool) {
	for _, f := range pod.ManagedFields {
		if f.Subresource == "status" && f.Time != nil {
			t, ok = latest(t, f.Time.Time), true
		}
	}
	return t, ok
}

// fromNode bounds a clock's start read from the pod's status by when the API
// server could first have known it. Nodes write these times with their own
// clocks: a node whose clock is 2h behind reports, in a status that arrives
// now, a pod that finished "2h ago". The start used is the latest of the
// reported time and StatusWrittenAt: a node's clock can make a removal late,
// never early. Both are whole seconds (the API server stores finish and
// transition times, and stamps managedFields, to the second), so with a node
// whose clock is right the two agree unless the status reached the API server
// in a later second. A start in the
// future (a node clock ahead) counts from now, and skewed says so.
//
// Why the status write's time rather than the first time podjanitor saw the
// pod so: it is the API server's clock, it survives a restart of podjanitor
// and is the same for `plan` and the daemon. The pod cache keeps one such time
// per pod, and keeps that of an earlier version as long as the clocks' times
// did not change (a crash-looping pod's status changes at every restart, its
// Ready=False transition does not), so such a pod's clock does not start over
// at every status write; `plan`, without that history, and the daemon after a
// restart count from the latest status write, later. A pod without a status
// entry in its managedFields is counted from the reported time, as before.
func fromNode(pod *corev1.Pod, t, now time.Time) (_ time.Time, skewed bool) {
	t, skewed = notAfter(t, now)
	if written, ok := StatusWrittenAt(pod); ok {
		t = latest(t, written.Truncate(time.Second))
	}
	return t, skewed
}

// latestContainerFinish is the latest terminated finishedAt of the pod's
// (init) containers, or zero.
func latestContainerFinish(pod *corev1.Pod) time.Time {
	var t time.Time
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range statuses {
			if s.State.Terminated != nil {
				t = latest(t, s.State.Terminated.FinishedAt.Time)
			}
		}
	}
	return t
}

// createdAt is the pod's creationTimestamp; ok is false when it is unset. The
// API server always sets it, but a zero time would read as the year 1 and
// make every deadline counted from it due at once: a pod without it has no
// known age, and nothing that counts from its creation applies.
func createdAt(pod *corev1.Pod) (time.Time, bool) {
	return pod.CreationTimestamp.Time, !pod.CreationTimestamp.IsZero()
}

// latest returns the latest of a and b; a zero time never wins over another.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// stuckReasons are the waiting reasons of a container the kubelet cannot get
// past by itself: its image cannot be pulled, or it cannot be created or
// started. The list is closed: any other reason (ContainerCreating,
// PodInitializing, CrashLoopBackOff, a reason added by a later kubelet) is
// never stuck.
var stuckReasons = []string{
	"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "ImageInspectError",
	"CreateContainerConfigError", "CreateContainerError", "PreCreateHookError", "PreStartHookError", "RunContainerError",
}

// pendingSince is when a Pending pod got stuck; ok is false for a pod that is
// not Pending, or not stuck. A Pending pod is stuck when it is:
//
//   - unschedulable (PodScheduled is False or Unknown): from that condition's
//     transition — except when its reason is SchedulingGated, a pod held on
//     purpose until its scheduling gates are removed, which is never stuck;
//   - never scheduled (no PodScheduled condition, no container statuses): from
//     creation;
//   - scheduled (PodScheduled=True, or the kubelet reported container
//     statuses) but stuck: no (init) container is running, and the containers
//     the kubelet is working on — the first init container that has not
//     terminated, else every container that has not terminated — all wait
//     for a reason in stuckReasons. It counts from the last progress the
//     status shows: the latest of the PodScheduled=True transition, any
//     (init) container's finishedAt, the last AllContainersRestarting
//     transition, and creation. A scheduled pod making progress (a container
//     running or being created, an init container running) is never stuck,
//     nor is one whose kubelet has not reported yet.
//
// Never stuck either: a pod of a pod group (spec.schedulingGroup, Kubernetes
// 1.36+) that is not scheduled, which waits for its gang as a gated pod waits
// for its gates (the scheduler writes no condition while the gang gathers,
// and Unschedulable when the gang does not fit: neither is the pod's own
// failure); and a pod whose kubelet is restarting all its containers in place
// (AllContainersRestarting=True).
//
// A time earlier than creation (a zero transition time) counts from
// creation; a pod without a creationTimestamp is never stuck.
func pendingSince(pod *corev1.Pod) (t time.Time, ok bool) {
	if pod.Status.Phase != corev1.PodPending || restartingAll(pod) {
		return time.Time{}, false
	}
	created, ok := createdAt(pod)
	if !ok {
		return time.Time{}, false
	}
	scheduled := condition(pod, corev1.PodScheduled)
	switch {
	case scheduled != nil && scheduled.Status == corev1.ConditionTrue,
		len(pod.Status.InitContainerStatuses)+len(pod.Status.ContainerStatuses) > 0:
		if !containersStuck(pod) {
			return time.Time{}, false
		}
		since := latest(latest(created, latestContainerFinish(pod)), restartedAllAt(pod))
		if scheduled != nil && scheduled.Status == corev1.ConditionTrue {
			since = latest(since, scheduled.LastTransitionTime.Time)
		}
		return since, true
	case inPodGroup(pod):
		return time.Time{}, false
	case scheduled != nil:
		if scheduled.Reason == corev1.PodReasonSchedulingGated {
			return time.Time{}, false
		}
		return latest(created, scheduled.LastTransitionTime.Time), true
	}
	return created, true
}

// inPodGroup reports whether the pod belongs to a pod group, which the
// scheduler places all at once or not at all (gang scheduling: the
// GenericWorkload feature, beta in Kubernetes 1.37).
func inPodGroup(pod *corev1.Pod) bool {
	return pod.Spec.SchedulingGroup != nil
}

// restartingAll reports whether the kubelet is restarting all the pod's
// containers in place (AllContainersRestarting=True; RestartAllContainers,
// KEP-5532: alpha in Kubernetes 1.35, beta in 1.36): it removes them, then
// starts the pod's init and regular containers again, as at the pod's start.
func restartingAll(pod *corev1.Pod) bool {
	c := condition(pod, corev1.AllContainersRestarting)
	return c != nil && c.Status == corev1.ConditionTrue
}

// restartedAllAt is the last transition of the pod's AllContainersRestarting
// condition: when its kubelet last began, or finished, removing all its
// containers to start them again. Zero without the condition.
func restartedAllAt(pod *corev1.Pod) time.Time {
	if c := condition(pod, corev1.AllContainersRestarting); c != nil {
		return c.LastTransitionTime.Time
	}
	return time.Time{}
}

// containersStuck reports whether no (init) container of the pod runs and
// the containers the kubelet is working on all wait for a stuck reason. Init
// containers run one at a time, in order, so the first that has not
// terminated is the one being worked on (the others wait, PodInitializing,
// for their turn); once all have terminated, it is every container that has
// not terminated.
func containersStuck(pod *corev1.Pod) bool {
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range statuses {
			if s.State.Running != nil {
				return false
			}
		}
	}
	for _, s := range pod.Status.InitContainerStatuses {
		if s.State.Terminated == nil {
			return waitsStuck(s)
		}
	}
	stuck := false
	for _, s := range pod.Status.ContainerStatuses {
		if s.State.Terminated != nil {
			continue
		}
		if !waitsStuck(s) {
			return false
		}
		stuck = true
	}
	return stuck
}

func waitsStuck(s corev1.ContainerStatus) bool {
	return s.State.Waiting != nil && slices.Contains(stuckReasons, s.State.Waiting.Reason)
}

// crashLoopingSince is when a pod with a container or init container waiting in
// CrashLoopBackOff (restarted at least minRestarts times) last became not
// Ready (crashLoopStart). ok is false when no container qualifies, and while
// the kubelet restarts all the pod's containers in place: a CrashLoopBackOff
// it shows then is the state of containers it is removing.
//
// CrashLoopBackOff is the kubelet's back-off between failed runs, which is
// what the clock rests on: restarts alone prove no crash loop. Since
// Kubernetes 1.35 a container restarts in place by its own restart rules
// (KEP-5307), also in a pod whose restartPolicy is Never, and every
// container's restartCount grows when the kubelet restarts all of them
// (KEP-5532); minRestarts counts restarts of every kind.
func crashLoopingSince(pod *corev1.Pod, minRestarts int32) (t time.Time, ok bool) {
	if restartingAll(pod) || !hasCrashLoopingContainer(pod, minRestarts) {
		return time.Time{}, false
	}
	return crashLoopStart(pod)
}

// crashLoopStart is when the pod last became not Ready: the Ready=False
// transition, else its creation; never before the kubelet last restarted all
// its containers (the AllContainersRestarting transition), which starts the
// pod over.
func crashLoopStart(pod *corev1.Pod) (t time.Time, ok bool) {
	if c := condition(pod, corev1.PodReady); c != nil && c.Status == corev1.ConditionFalse && !c.LastTransitionTime.IsZero() {
		t, ok = c.LastTransitionTime.Time, true
	} else {
		t, ok = createdAt(pod)
	}
	if !ok {
		return time.Time{}, false
	}
	return latest(t, restartedAllAt(pod)), true
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

// betweenBackOffs reports whether the pod shows a crash loop between two of
// its back-offs: it is not terminal, not Ready (Ready=False with a
// transition time) and not restarting all its containers, and an (init)
// container that has restarted ended its last run in failure after the pod
// became not Ready. Its last run is its terminated state, else its last
// termination; a failure is a non-zero exit code other than the kubelet's
// removal of the container to restart all of them. A container that failed
// once, when the pod went not Ready, and runs again does not show it; one
// that failed again since does. Only NodeClocks reads it: the clock itself
// needs CrashLoopBackOff.
func betweenBackOffs(pod *corev1.Pod) bool {
	ready := condition(pod, corev1.PodReady)
	if isTerminal(pod) || restartingAll(pod) || ready == nil || ready.Status != corev1.ConditionFalse || ready.LastTransitionTime.IsZero() {
		return false
	}
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range statuses {
			if s.RestartCount < 1 {
				continue
			}
			run := s.State.Terminated
			if run == nil {
				run = s.LastTerminationState.Terminated
			}
			if run != nil && run.ExitCode != 0 && run.Reason != reasonRestartingAllContainers &&
				run.FinishedAt.After(ready.LastTransitionTime.Time) {
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
