package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

func TestFinishTime(t *testing.T) {
	at := func(minutes int) time.Time { return created.Add(time.Duration(minutes) * time.Minute) }
	type result struct {
		Time time.Time
		OK   bool
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want result
	}{
		{
			name: "running pod has no finish time",
			pod:  newPod(inPhase(corev1.PodRunning), withContainers(terminatedContainer("Error", at(5)))),
			want: result{},
		},
		{
			name: "pending pod has no finish time",
			pod:  newPod(),
			want: result{},
		},
		{
			name: "a container that finished after the DisruptionTarget transition decides",
			pod: newPod(inPhase(corev1.PodFailed),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "TerminationByKubelet", at(10)),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "PodFailed", at(20)),
				withContainers(terminatedContainer("Error", at(30))),
				startedAt(at(1))),
			want: result{at(30), true},
		},
		{
			name: "a Ready transition long before the last container finished does not decide",
			pod: newPod(inPhase(corev1.PodSucceeded),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "PodCompleted", at(5)),
				withInitContainers(terminatedContainer("Completed", at(2))),
				withContainers(terminatedContainer("Completed", at(40)), terminatedContainer("Completed", at(12))),
				startedAt(at(1))),
			want: result{at(40), true},
		},
		{
			name: "a DisruptionTarget transition after the last container finished moves it later",
			pod: newPod(inPhase(corev1.PodFailed),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "DeletionByPodGC", at(50)),
				withContainers(terminatedContainer("Error", at(30)))),
			want: result{at(50), true},
		},
		{
			name: "a later DisruptionTarget=False is ignored",
			pod: newPod(inPhase(corev1.PodFailed),
				withCondition(corev1.DisruptionTarget, corev1.ConditionFalse, "", at(50)),
				withContainers(terminatedContainer("Error", at(30)))),
			want: result{at(30), true},
		},
		{
			name: "zero transition times are ignored",
			pod: newPod(inPhase(corev1.PodFailed),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "", time.Time{}),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "PodFailed", time.Time{}),
				startedAt(at(3))),
			want: result{at(3), true},
		},
		{
			name: "DisruptionTarget=False is ignored",
			pod: newPod(inPhase(corev1.PodFailed),
				withCondition(corev1.DisruptionTarget, corev1.ConditionFalse, "", at(10)),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "PodFailed", at(20))),
			want: result{at(20), true},
		},
		{
			name: "Ready with reason PodCompleted",
			pod: newPod(inPhase(corev1.PodSucceeded),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "PodCompleted", at(20)),
				withContainers(terminatedContainer("Completed", at(19)))),
			want: result{at(20), true},
		},
		{
			name: "Ready with reason PodFailed",
			pod: newPod(inPhase(corev1.PodFailed),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "PodFailed", at(21)),
				withContainers(terminatedContainer("Error", at(19)))),
			want: result{at(21), true},
		},
		{
			name: "Ready with another reason is ignored",
			pod: newPod(inPhase(corev1.PodSucceeded),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", at(20)),
				withContainers(terminatedContainer("Completed", at(19)))),
			want: result{at(19), true},
		},
		{
			name: "latest finishedAt over containers",
			pod: newPod(inPhase(corev1.PodSucceeded),
				withInitContainers(terminatedContainer("Completed", at(2))),
				withContainers(terminatedContainer("Completed", at(15)), terminatedContainer("Completed", at(25)), runningContainer())),
			want: result{at(25), true},
		},
		{
			name: "latest finishedAt is an init container's",
			pod: newPod(inPhase(corev1.PodFailed),
				withInitContainers(terminatedContainer("Error", at(40))),
				withContainers(terminatedContainer("Completed", at(15)))),
			want: result{at(40), true},
		},
		{
			name: "zero finishedAt falls back to startTime",
			pod: newPod(inPhase(corev1.PodFailed),
				withContainers(terminatedContainer("Error", time.Time{})),
				startedAt(at(3))),
			want: result{at(3), true},
		},
		{
			name: "startTime",
			pod:  newPod(inPhase(corev1.PodSucceeded), startedAt(at(3))),
			want: result{at(3), true},
		},
		{
			name: "creationTimestamp last",
			pod:  newPod(inPhase(corev1.PodFailed)),
			want: result{created, true},
		},
		{
			name: "evicted pod without container statuses, DisruptionTarget",
			pod: newPod(inPhase(corev1.PodFailed), withReason("Evicted"),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "TerminationByKubelet", at(50)),
				startedAt(at(1))),
			want: result{at(50), true},
		},
		{
			name: "evicted pod without container statuses or conditions",
			pod:  newPod(inPhase(corev1.PodFailed), withReason("Evicted"), startedAt(at(1))),
			want: result{at(1), true},
		},
		{
			name: "no creationTimestamp and nothing else: no finish time",
			pod:  newPod(inPhase(corev1.PodFailed), withReason("Evicted"), notCreated()),
			want: result{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got result
			got.Time, got.OK = FinishTime(tt.pod)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("FinishTime() (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestFinishTimeNeverBeforeAContainerFinished tries every order of the
// evidence a terminal pod can carry: whatever the conditions say, the finish
// time is never earlier than a container's finishedAt, nor earlier than a
// DisruptionTarget or PodCompleted/PodFailed transition.
func TestFinishTimeNeverBeforeAContainerFinished(t *testing.T) {
	at := func(minutes int) time.Time { return created.Add(time.Duration(minutes) * time.Minute) }
	later := func(a, b time.Time) time.Time {
		if b.After(a) {
			return b
		}
		return a
	}
	for _, phase := range []corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed} {
		for _, disruption := range []int{-1, 10, 20, 30, 40} { // -1: no condition
			for _, ready := range []int{-1, 10, 20, 30, 40} {
				for _, container := range []int{-1, 10, 20, 30, 40} {
					for _, initContainer := range []int{-1, 10, 20, 30, 40} {
						opts := []podOption{inPhase(phase), startedAt(at(1))}
						latest := at(1)
						if disruption >= 0 {
							opts = append(opts, withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "EvictionByEvictionAPI", at(disruption)))
							latest = later(latest, at(disruption))
						}
						if ready >= 0 {
							opts = append(opts, withCondition(corev1.PodReady, corev1.ConditionFalse, "PodCompleted", at(ready)))
							latest = later(latest, at(ready))
						}
						if container >= 0 {
							opts = append(opts, withContainers(terminatedContainer("Completed", at(container)), terminatedContainer("Completed", at(container/2))))
							latest = later(latest, at(container))
						}
						if initContainer >= 0 {
							opts = append(opts, withInitContainers(terminatedContainer("Completed", at(initContainer))))
							latest = later(latest, at(initContainer))
						}
						got, ok := FinishTime(newPod(opts...))
						if !ok || !got.Equal(latest) {
							t.Errorf("%s pod, DisruptionTarget %d, Ready %d, container %d, init container %d: FinishTime() = %v, %v; want %v",
								phase, disruption, ready, container, initContainer, got, ok, latest)
						}
					}
				}
			}
		}
	}
}

func TestPendingSince(t *testing.T) {
	at := func(minutes int) time.Time { return created.Add(time.Duration(minutes) * time.Minute) }
	scheduled := withCondition(corev1.PodScheduled, corev1.ConditionTrue, "", at(1))
	type result struct {
		Time time.Time
		OK   bool
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want result
	}{
		// Not scheduled.
		{"never scheduled: from creation", newPod(), result{created, true}},
		{"unschedulable: from the PodScheduled=False transition",
			newPod(withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", at(5))), result{at(5), true}},
		{"unschedulable with a zero transition time: from creation",
			newPod(withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", time.Time{})), result{created, true}},
		{"held by scheduling gates: never",
			newPod(withCondition(corev1.PodScheduled, corev1.ConditionFalse, "SchedulingGated", at(0))), result{}},
		{"never scheduled, no creationTimestamp: never", newPod(notCreated()), result{}},

		// Scheduled and making progress.
		{"scheduled, no container statuses yet: never", newPod(scheduled), result{}},
		{"containers being created: never",
			newPod(scheduled, withContainers(waitingContainer("ContainerCreating", 0))), result{}},
		{"init container being created: never",
			newPod(scheduled, withInitContainers(waitingContainer("PodInitializing", 0)), withContainers(waitingContainer("PodInitializing", 0))), result{}},
		{"init container running: never",
			newPod(scheduled, withInitContainers(runningContainer()), withContainers(waitingContainer("PodInitializing", 0))), result{}},
		{"init container running, a container in ImagePullBackOff: never",
			newPod(scheduled, withInitContainers(runningContainer()), withContainers(waitingContainer("ImagePullBackOff", 0))), result{}},
		{"a container running, another in ImagePullBackOff: never",
			newPod(scheduled, withContainers(runningContainer(), waitingContainer("ImagePullBackOff", 0))), result{}},
		{"a container in ImagePullBackOff, another being created: never",
			newPod(scheduled, withContainers(waitingContainer("ImagePullBackOff", 0), waitingContainer("ContainerCreating", 0))), result{}},
		{"init container crash-looping is the crashLooping clock's, not stuck Pending",
			newPod(scheduled, withInitContainers(waitingContainer("CrashLoopBackOff", 3)), withContainers(waitingContainer("PodInitializing", 0))), result{}},
		{"a waiting reason not on the list: never",
			newPod(scheduled, withContainers(waitingContainer("SomethingNew", 0))), result{}},

		// Scheduled and stuck.
		{"ImagePullBackOff: from the PodScheduled=True transition",
			newPod(scheduled, withContainers(waitingContainer("ImagePullBackOff", 0))), result{at(1), true}},
		{"CreateContainerConfigError: from the PodScheduled=True transition",
			newPod(scheduled, withContainers(waitingContainer("CreateContainerConfigError", 0), waitingContainer("ImagePullBackOff", 0))), result{at(1), true}},
		{"ErrImagePull after a 40-minute init container: from its finish",
			newPod(scheduled, withInitContainers(terminatedContainer("Completed", at(41))), withContainers(waitingContainer("ErrImagePull", 0))), result{at(41), true}},
		{"second init container in ImagePullBackOff: from the first one's finish",
			newPod(scheduled, withInitContainers(terminatedContainer("Completed", at(7)), waitingContainer("ImagePullBackOff", 0)),
				withContainers(waitingContainer("PodInitializing", 0))), result{at(7), true}},
		{"first init container in ImagePullBackOff, the next waiting its turn",
			newPod(scheduled, withInitContainers(waitingContainer("ImagePullBackOff", 0), waitingContainer("PodInitializing", 0)),
				withContainers(waitingContainer("PodInitializing", 0))), result{at(1), true}},
		{"stale PodInitializing of containers does not hide a stuck init container",
			newPod(scheduled, withInitContainers(waitingContainer("InvalidImageName", 0)), withContainers(waitingContainer("PodInitializing", 0))), result{at(1), true}},
		{"container statuses without a PodScheduled condition: scheduled, from creation",
			newPod(withContainers(waitingContainer("ErrImageNeverPull", 0))), result{created, true}},

		{"not Pending", newPod(inPhase(corev1.PodRunning), withContainers(waitingContainer("ImagePullBackOff", 0))), result{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got result
			got.Time, got.OK = pendingSince(tt.pod)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("pendingSince() (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestIsMirrorPod(t *testing.T) {
	if !IsMirrorPod(newPod(mirror())) {
		t.Error("IsMirrorPod(mirror pod) = false")
	}
	if IsMirrorPod(newPod(annotated("kubernetes.io/config.source", "file"))) {
		t.Error("IsMirrorPod(regular pod) = true")
	}
}

func TestDefaultAction(t *testing.T) {
	for phase, want := range map[corev1.PodPhase]Action{
		corev1.PodRunning:   ActionEvict,
		corev1.PodPending:   ActionDelete,
		corev1.PodSucceeded: ActionDelete,
		corev1.PodFailed:    ActionDelete,
		corev1.PodUnknown:   ActionDelete,
	} {
		if got := DefaultAction(newPod(inPhase(phase))); got != want {
			t.Errorf("DefaultAction(%s pod) = %q, want %q", phase, got, want)
		}
	}
}
