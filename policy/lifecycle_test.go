package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Statuses as the kubelet and the scheduler of Kubernetes 1.35 to 1.37 write
// them (pkg/kubelet getPhase and convertToAPIContainerStatuses, the
// GangScheduling plugin), for the lifecycle those releases brought.

// exited is a terminated state: a run that ended with code at t.
func exited(reason string, code int32, at time.Time) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{Reason: reason, ExitCode: code, StartedAt: metav1.NewTime(at.Add(-time.Minute)), FinishedAt: metav1.NewTime(at)}
}

// container is an (init) container's status: restarts, its state (one of
// running, waiting reason, terminated) and its last termination.
func container(name string, restarts int32, state corev1.ContainerState, last *corev1.ContainerStateTerminated) corev1.ContainerStatus {
	s := corev1.ContainerStatus{Name: name, RestartCount: restarts, State: state}
	if last != nil {
		s.LastTerminationState.Terminated = last
	}
	return s
}

func runningState() corev1.ContainerState {
	return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(created)}}
}

func waitingState(reason string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}
}

func terminatedState(t *corev1.ContainerStateTerminated) corev1.ContainerState {
	return corev1.ContainerState{Terminated: t}
}

// inGroup gives the pod spec.schedulingGroup.podGroupName (1.36+).
func inGroup(name string) podOption {
	return func(p *corev1.Pod) { p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: &name} }
}

// TestNewerLifecycle decides, with one rule per clock, pods in the states
// the newer lifecycle gives them: what must not be removed, and what still
// must. A zero time is no deadline.
func TestNewerLifecycle(t *testing.T) {
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	const (
		finishedAfter = time.Hour
		pendingAfter  = time.Hour
		crashAfter    = 20 * time.Minute
		createdAfter  = 48 * time.Hour
	)
	scheduled := withCondition(corev1.PodScheduled, corev1.ConditionTrue, "", ago(20*time.Hour))
	notReady := func(since time.Time) podOption {
		return withCondition(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", since)
	}
	restartingAll := withCondition(corev1.AllContainersRestarting, corev1.ConditionTrue, "RestartAllContainersStarted", ago(5*time.Second))
	restartedAll := func(at time.Time) podOption {
		return withCondition(corev1.AllContainersRestarting, corev1.ConditionFalse, "", at)
	}
	resize := func(reason string) podOption {
		return withCondition(corev1.PodResizePending, corev1.ConditionTrue, reason, ago(3*time.Hour))
	}
	removedForRestart := func(restarts int32) corev1.ContainerStatus {
		return container("main", restarts, waitingState("RestartingAllContainers"), exited("RestartingAllContainers", 137, time.Time{}))
	}
	type deadlines struct{ Finished, Pending, CrashLooping time.Time }
	tests := []struct {
		name string
		pod  *corev1.Pod
		want deadlines
	}{
		// Container restart rules (KEP-5307; beta in 1.35): a container of a
		// restartPolicy: Never pod restarts in place when its exit matches a
		// Restart rule; the kubelet keeps the pod Running meanwhile.
		{"Never pod, container exited 42 and restarting by its rule: Running, not finished",
			newPod(inPhase(corev1.PodRunning), notReady(ago(2*time.Hour)),
				withContainers(container("main", 0, terminatedState(exited("Error", 42, ago(2*time.Hour))), nil))),
			deadlines{}},
		{"Never pod running again after 7 restarts by its rule: restarts are no crash loop",
			newPod(inPhase(corev1.PodRunning), notReady(ago(2*time.Hour)),
				withContainers(container("main", 7, runningState(), exited("Error", 42, ago(3*time.Hour))))),
			deadlines{}},
		{"Never pod in back-off between its rule's restarts: crash-looping",
			newPod(inPhase(corev1.PodRunning), notReady(ago(2*time.Hour)),
				withContainers(container("main", 7, waitingState("CrashLoopBackOff"), exited("Error", 42, ago(time.Minute))))),
			deadlines{CrashLooping: ago(2 * time.Hour).Add(crashAfter)}},
		{"Never pod whose last exit matched no rule: Failed, finished",
			newPod(inPhase(corev1.PodFailed), withCondition(corev1.PodReady, corev1.ConditionFalse, "PodFailed", ago(2*time.Hour)),
				withContainers(container("main", 3, terminatedState(exited("Error", 1, ago(2*time.Hour))), exited("Error", 42, ago(3*time.Hour))))),
			deadlines{Finished: ago(2 * time.Hour).Add(finishedAfter)}},

		// RestartAllContainers (KEP-5532; alpha in 1.35, beta in 1.36): the
		// kubelet removes every container (waiting and last terminated
		// RestartingAllContainers, restartCount + 1) and starts the pod over.
		{"restarting all containers, a CrashLoopBackOff not yet replaced: neither crash-looping nor stuck",
			newPod(inPhase(corev1.PodRunning), notReady(ago(2*time.Hour)), restartingAll,
				withInitContainers(container("setup", 4, waitingState("RestartingAllContainers"), exited("RestartingAllContainers", 137, time.Time{}))),
				withContainers(removedForRestart(4), container("worker", 4, waitingState("CrashLoopBackOff"), exited("Error", 1, ago(time.Minute))))),
			deadlines{}},
		{"restarting all containers while Pending: not stuck",
			newPod(scheduled, restartingAll, withInitContainers(container("setup", 1, waitingState("RestartingAllContainers"), nil)),
				withContainers(removedForRestart(1))),
			deadlines{}},
		{"restarted all 10m ago, its init container cannot pull its image: stuck from the restart, not the scheduling",
			newPod(scheduled, restartedAll(ago(10*time.Minute)),
				withInitContainers(container("setup", 2, waitingState("ErrImagePull"), exited("RestartingAllContainers", 137, time.Time{}))),
				withContainers(container("main", 2, waitingState("PodInitializing"), exited("RestartingAllContainers", 137, time.Time{})))),
			deadlines{Pending: ago(10 * time.Minute).Add(pendingAfter)}},
		{"restarted all 10m ago, crash-looping since: counted from the restart, not the Ready=False before it",
			newPod(inPhase(corev1.PodRunning), notReady(ago(2*time.Hour)), restartedAll(ago(10*time.Minute)),
				withContainers(container("main", 6, waitingState("CrashLoopBackOff"), exited("Error", 1, ago(time.Minute))))),
			deadlines{CrashLooping: ago(10 * time.Minute).Add(crashAfter)}},
		{"Never pod whose init container failed after a restart of all: Failed, finished",
			newPod(inPhase(corev1.PodFailed), restartedAll(ago(2*time.Hour)),
				withInitContainers(container("setup", 1, terminatedState(exited("Error", 1, ago(2*time.Hour))), exited("RestartingAllContainers", 137, time.Time{}))),
				withContainers(container("main", 1, waitingState("RestartingAllContainers"), exited("RestartingAllContainers", 137, time.Time{})))),
			deadlines{Finished: ago(2 * time.Hour).Add(finishedAfter)}},

		// A crash back-off of a second (KubeletCrashLoopBackOffMax, KEP-5593;
		// beta in 1.35): CrashLoopBackOff comes and goes within seconds.
		{"1 s back-off, running again between two back-offs: no CrashLoopBackOff now",
			newPod(inPhase(corev1.PodRunning), notReady(ago(time.Hour)),
				withContainers(container("main", 30, runningState(), exited("Error", 1, ago(time.Second))))),
			deadlines{}},
		{"1 s back-off, just exited: no CrashLoopBackOff now",
			newPod(inPhase(corev1.PodRunning), notReady(ago(time.Hour)),
				withContainers(container("main", 30, terminatedState(exited("Error", 1, ago(time.Second))), exited("Error", 1, ago(3*time.Second))))),
			deadlines{}},
		{"1 s back-off, in its back-off: crash-looping since it went not Ready",
			newPod(inPhase(corev1.PodRunning), notReady(ago(time.Hour)),
				withContainers(container("main", 31, waitingState("CrashLoopBackOff"), exited("Error", 1, ago(time.Second))))),
			deadlines{CrashLooping: ago(time.Hour).Add(crashAfter)}},
		{"not Ready for 3h, its first back-off a second ago: counted from that status write",
			newPod(inPhase(corev1.PodRunning), notReady(ago(3*time.Hour)), statusWritten("kubelet", ago(time.Second)),
				withContainers(container("main", 1, waitingState("CrashLoopBackOff"), exited("Error", 1, ago(2*time.Second))))),
			deadlines{CrashLooping: ago(time.Second).Add(crashAfter)}},

		// Gang scheduling (GenericWorkload, beta in 1.37; spec.schedulingGroup
		// since 1.36): a pod waits for its pod group on purpose.
		{"gang gathering: no PodScheduled condition, not stuck",
			newPod(inGroup("trainers")), deadlines{}},
		{"gang does not fit: PodScheduled=False Unschedulable, not stuck",
			newPod(inGroup("trainers"), withCondition(corev1.PodScheduled, corev1.ConditionFalse, corev1.PodReasonUnschedulable, ago(5*time.Hour))),
			deadlines{}},
		{"gang member scheduled, its image cannot be pulled: stuck",
			newPod(inGroup("trainers"), scheduled, withContainers(container("main", 0, waitingState("ImagePullBackOff"), nil))),
			deadlines{Pending: ago(20 * time.Hour).Add(pendingAfter)}},
		{"no pod group, Unschedulable: stuck",
			newPod(withCondition(corev1.PodScheduled, corev1.ConditionFalse, corev1.PodReasonUnschedulable, ago(5*time.Hour))),
			deadlines{Pending: ago(5 * time.Hour).Add(pendingAfter)}},

		// In-place resize (GA in 1.35): a resize the node cannot take yet
		// (Deferred) or ever (Infeasible) leaves the pod running as it was.
		{"Running, resize Deferred: not stuck, not crash-looping",
			newPod(inPhase(corev1.PodRunning), resize(corev1.PodReasonDeferred), withContainers(container("main", 0, runningState(), nil))),
			deadlines{}},
		{"Running, resize Infeasible: not stuck, not crash-looping",
			newPod(inPhase(corev1.PodRunning), resize(corev1.PodReasonInfeasible), withContainers(container("main", 0, runningState(), nil))),
			deadlines{}},
		{"Running, a container restarted by its resize (RestartContainer): not crash-looping",
			newPod(inPhase(corev1.PodRunning), notReady(ago(time.Second)), withCondition(corev1.PodResizeInProgress, corev1.ConditionTrue, "", ago(2*time.Second)),
				withContainers(container("main", 1, runningState(), exited("Error", 137, ago(2*time.Second))))),
			deadlines{}},
		{"Pending, init container running, resize Deferred: not stuck",
			newPod(scheduled, resize(corev1.PodReasonDeferred), withInitContainers(container("setup", 0, runningState(), nil)),
				withContainers(container("main", 0, waitingState("PodInitializing"), nil))),
			deadlines{}},
		{"Pending, image cannot be pulled, resize Infeasible: stuck all the same",
			newPod(scheduled, resize(corev1.PodReasonInfeasible), withContainers(container("main", 0, waitingState("ImagePullBackOff"), nil))),
			deadlines{Pending: ago(20 * time.Hour).Add(pendingAfter)}},

		// Sidecars (restartable init containers, GA in 1.33).
		{"sidecar running while the main container pulls its image: not stuck",
			newPod(scheduled, withInitContainers(container("proxy", 0, runningState(), nil)),
				withContainers(container("main", 0, waitingState("ImagePullBackOff"), nil))),
			deadlines{}},
		{"sidecar crash-looping: crash-looping",
			newPod(inPhase(corev1.PodRunning), notReady(ago(time.Hour)),
				withInitContainers(container("proxy", 9, waitingState("CrashLoopBackOff"), exited("Error", 1, ago(time.Minute)))),
				withContainers(container("main", 0, runningState(), nil))),
			deadlines{CrashLooping: ago(time.Hour).Add(crashAfter)}},
		{"Succeeded, the sidecar stopped after the main container: finished when the sidecar stopped",
			newPod(inPhase(corev1.PodSucceeded),
				withInitContainers(container("proxy", 0, terminatedState(exited("Completed", 0, ago(89*time.Minute))), nil)),
				withContainers(container("main", 0, terminatedState(exited("Completed", 0, ago(90*time.Minute))), nil))),
			deadlines{Finished: ago(89 * time.Minute).Add(finishedAfter)}},
	}
	rules := map[Clock]Rule{
		ClockFinished:     {Name: "finished", Clock: ClockFinished, After: finishedAfter},
		ClockPending:      {Name: "pending", Clock: ClockPending, After: pendingAfter},
		ClockCrashLooping: {Name: "crash", Clock: ClockCrashLooping, After: crashAfter},
		ClockCreated:      {Name: "max-age", Clock: ClockCreated, After: createdAfter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			deadline := func(clock Clock) time.Time {
				t.Helper()
				d, err := (&Evaluator{Policy: mustPolicy(t, rules[clock])}).Decide(tt.pod, anyNamespace, now)
				if err != nil {
					t.Fatal(err)
				}
				return d.Deadline
			}
			got := deadlines{deadline(ClockFinished), deadline(ClockPending), deadline(ClockCrashLooping)}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("deadlines (-want,+got):\n%s", diff)
			}
			if got := deadline(ClockCreated); !got.Equal(created.Add(createdAfter)) {
				t.Errorf("created deadline %v, want %v: the maximum age applies to every pod", got, created.Add(createdAfter))
			}
		})
	}
}

// TestCrashLoopBetweenBackOffs: NodeClocks keeps a crash loop's start while
// its container runs or has just exited between two back-offs, so that the
// pod cache keeps the loop's first status write; not for a container that
// failed only when the pod went not Ready, nor for a pod restarting all its
// containers, nor for a terminal pod.
func TestCrashLoopBetweenBackOffs(t *testing.T) {
	notReadySince := now.Add(-time.Hour)
	notReady := withCondition(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", notReadySince)
	after := exited("Error", 1, notReadySince.Add(30*time.Minute))
	tests := []struct {
		name string
		pod  *corev1.Pod
		want time.Time
	}{
		{"in CrashLoopBackOff", newPod(inPhase(corev1.PodRunning), notReady,
			withContainers(container("main", 3, waitingState("CrashLoopBackOff"), after))), notReadySince},
		{"running again after a failure since it went not Ready", newPod(inPhase(corev1.PodRunning), notReady,
			withContainers(container("main", 3, runningState(), after))), notReadySince},
		{"just exited, again", newPod(inPhase(corev1.PodRunning), notReady,
			withContainers(container("main", 3, terminatedState(after), exited("Error", 1, notReadySince.Add(time.Minute))))), notReadySince},
		{"an init container, running again", newPod(notReady,
			withInitContainers(container("setup", 2, runningState(), after))), notReadySince},
		{"restarted all since: from the restart", newPod(inPhase(corev1.PodRunning), notReady,
			withCondition(corev1.AllContainersRestarting, corev1.ConditionFalse, "", notReadySince.Add(10*time.Minute)),
			withContainers(container("main", 3, runningState(), after))), notReadySince.Add(10 * time.Minute)},

		{"failed only when it went not Ready (the same second)", newPod(inPhase(corev1.PodRunning), notReady,
			withContainers(container("main", 1, runningState(), exited("Error", 1, notReadySince)))), time.Time{}},
		{"an old failure, not Ready since for another reason", newPod(inPhase(corev1.PodRunning), notReady,
			withContainers(container("main", 1, runningState(), exited("OOMKilled", 137, notReadySince.Add(-72*time.Hour))))), time.Time{}},
		{"exited 0 since", newPod(inPhase(corev1.PodRunning), notReady,
			withContainers(container("main", 2, runningState(), exited("Completed", 0, notReadySince.Add(time.Minute))))), time.Time{}},
		{"removed to restart all", newPod(inPhase(corev1.PodRunning), notReady,
			withContainers(container("main", 2, waitingState("ContainerCreating"), exited("RestartingAllContainers", 137, notReadySince.Add(time.Minute))))), time.Time{}},
		{"restarting all", newPod(inPhase(corev1.PodRunning), notReady,
			withCondition(corev1.AllContainersRestarting, corev1.ConditionTrue, "RestartAllContainersStarted", now),
			withContainers(container("main", 3, runningState(), after))), time.Time{}},
		{"Ready", newPod(inPhase(corev1.PodRunning), withCondition(corev1.PodReady, corev1.ConditionTrue, "", notReadySince),
			withContainers(container("main", 3, runningState(), after))), time.Time{}},
		{"no restart yet", newPod(inPhase(corev1.PodRunning), notReady,
			withContainers(container("main", 0, terminatedState(after), nil))), time.Time{}},
		{"Failed", newPod(inPhase(corev1.PodFailed), notReady,
			withContainers(container("main", 3, terminatedState(after), after))), time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NodeClocksOf(tt.pod).CrashLooping; !got.Equal(tt.want) {
				t.Errorf("NodeClocksOf().CrashLooping = %v, want %v", got, tt.want)
			}
		})
	}
}
