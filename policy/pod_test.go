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
			name: "DisruptionTarget transition comes first",
			pod: newPod(inPhase(corev1.PodFailed),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "TerminationByKubelet", at(10)),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "PodFailed", at(20)),
				withContainers(terminatedContainer("Error", at(30))),
				startedAt(at(1))),
			want: result{at(10), true},
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
