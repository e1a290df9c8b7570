package policy

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A node whose clock is 2h behind reports, in a status the API server stores
// now, times 2h in the past. Every clock that reads such a time counts from
// no earlier than that status write.
func TestNodeTimesAreBoundedByTheStatusWrite(t *testing.T) {
	const behind = 2 * time.Hour
	written := now.Add(-10*time.Second + 300*time.Millisecond) // stored as now-10s
	bound := now.Add(-10 * time.Second)                        // as the API server stamps it
	kubelet := statusWritten("kubelet", written)
	evictedRule := Rule{Name: "evicted", Match: Match{Reasons: []string{"Evicted"}}, Clock: ClockFinished, After: time.Hour}
	tests := []struct {
		name  string
		rules []Rule
		pod   *corev1.Pod
		want  Decision
	}{
		{
			name: "ttl-after-finished from a finishedAt 2h ago",
			pod: newPod(inPhase(corev1.PodSucceeded), kubelet, annotated(keyTTLAfterFinished, "1h"),
				withContainers(terminatedContainer("Completed", now.Add(-behind)))),
			want: Decision{Deadline: bound.Add(time.Hour), Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished},
		},
		{
			name:  "finished clock from a Ready transition 2h ago",
			rules: []Rule{{Name: "finished", Clock: ClockFinished, After: time.Hour}},
			pod: newPod(inPhase(corev1.PodFailed), kubelet,
				withCondition(corev1.PodReady, corev1.ConditionFalse, "PodFailed", now.Add(-behind))),
			want: ruleDecision("finished", ClockFinished, ActionDelete, bound.Add(time.Hour)),
		},
		{
			name:  "evicted pod: the DisruptionTarget transition 2h ago",
			rules: []Rule{evictedRule},
			pod: newPod(inPhase(corev1.PodFailed), withReason("Evicted"), kubelet,
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "TerminationByKubelet", now.Add(-behind))),
			want: ruleDecision("evicted", ClockFinished, ActionDelete, bound.Add(time.Hour)),
		},
		{
			name:  "evicted pod without any time but startTime",
			rules: []Rule{evictedRule},
			pod:   newPod(inPhase(corev1.PodFailed), withReason("Evicted"), kubelet, startedAt(now.Add(-behind))),
			want:  ruleDecision("evicted", ClockFinished, ActionDelete, bound.Add(time.Hour)),
		},
		{
			name:  "crashLooping from a Ready=False transition 2h ago",
			rules: []Rule{{Name: "crash", Clock: ClockCrashLooping, After: 20 * time.Minute}},
			pod: newPod(inPhase(corev1.PodRunning), kubelet, withContainers(waitingContainer("CrashLoopBackOff", 5)),
				withCondition(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", now.Add(-behind))),
			want: ruleDecision("crash", ClockCrashLooping, ActionEvict, bound.Add(20*time.Minute)),
		},
		{
			name:  "pending: an init container's finishedAt 2h ago",
			rules: []Rule{{Name: "stuck", Clock: ClockPending, After: 30 * time.Minute}},
			pod: newPod(kubelet, withCondition(corev1.PodScheduled, corev1.ConditionTrue, "", created),
				withInitContainers(terminatedContainer("Completed", now.Add(-behind))),
				withContainers(waitingContainer("ImagePullBackOff", 0))),
			want: ruleDecision("stuck", ClockPending, ActionDelete, bound.Add(30*time.Minute)),
		},
		{
			name: "the latest status write of any manager bounds",
			pod: newPod(inPhase(corev1.PodSucceeded), statusWritten("kubelet", now.Add(-time.Hour)), kubelet,
				statusWritten("kube-controller-manager", now.Add(-30*time.Minute)), annotated(keyTTLAfterFinished, "1h"),
				withContainers(terminatedContainer("Completed", now.Add(-behind)))),
			want: Decision{Deadline: bound.Add(time.Hour), Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished},
		},
		{
			name: "a node time later than the status write is kept",
			pod: newPod(inPhase(corev1.PodSucceeded), kubelet, annotated(keyTTLAfterFinished, "1h"),
				withContainers(terminatedContainer("Completed", now.Add(-time.Second)))),
			want: Decision{Deadline: now.Add(-time.Second).Add(time.Hour), Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished},
		},
		{
			name: "a status write in the future is no clock skew",
			pod: newPod(inPhase(corev1.PodSucceeded), statusWritten("kubelet", now), annotated(keyTTLAfterFinished, "0s"),
				withContainers(terminatedContainer("Completed", now.Add(-behind)))),
			want: Decision{Deadline: now, Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished},
		},
		{
			name: "a main-resource write does not count",
			pod: newPod(inPhase(corev1.PodSucceeded), annotated(keyTTLAfterFinished, "1h"),
				withContainers(terminatedContainer("Completed", now.Add(-behind))),
				func(p *corev1.Pod) {
					stamp := metav1.NewTime(now)
					p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, Time: &stamp}}
				}),
			want: Decision{Deadline: now.Add(-behind).Add(time.Hour), Action: ActionDelete, Source: keyTTLAfterFinished, Reason: ReasonTTLAfterFinished},
		},
		{
			name:  "created clock: creationTimestamp is the API server's",
			rules: []Rule{{Name: "max-age", Clock: ClockCreated, After: time.Hour}},
			pod:   newPod(inPhase(corev1.PodRunning), kubelet),
			want:  ruleDecision("max-age", ClockCreated, ActionEvict, created.Add(time.Hour)),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &Evaluator{}
			if tt.rules != nil {
				e.Policy = mustPolicy(t, tt.rules...)
			}
			got, err := e.Decide(tt.pod, &Namespace{}, now)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Decide (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestNodeClocksOf(t *testing.T) {
	ready := now.Add(-time.Hour)
	crash := newPod(inPhase(corev1.PodRunning), withContainers(waitingContainer("CrashLoopBackOff", 1)),
		withCondition(corev1.PodReady, corev1.ConditionFalse, "ContainersNotReady", ready))
	if got := NodeClocksOf(crash); !got.Equal(NodeClocks{CrashLooping: ready}) {
		t.Errorf("crash-looping pod: %+v", got)
	}
	done := newPod(inPhase(corev1.PodSucceeded), withContainers(terminatedContainer("Completed", ready)))
	if got := NodeClocksOf(done); !got.Equal(NodeClocks{Finished: ready}) || got.Equal(NodeClocks{Finished: ready.Add(time.Second)}) {
		t.Errorf("finished pod: %+v", got)
	}
	if got := NodeClocksOf(newPod(inPhase(corev1.PodRunning))); !got.IsZero() {
		t.Errorf("running pod: %+v", got)
	}
}
