//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/podjanitor/podjanitor/policy"
)

// reportStatus writes the pod's status as a node would, through the status
// subresource, and returns the pod as the API server stored it.
func reportStatus(t *testing.T, pod *corev1.Pod, set func(*corev1.PodStatus)) *corev1.Pod {
	t.Helper()
	var stored *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctxFor(t), pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		set(&p.Status)
		stored, err = client.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("writing the status of pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return stored
}

// finishedAt is the status of a pod whose node says it ended at end.
func finishedAt(phase corev1.PodPhase, reason string, end time.Time) func(*corev1.PodStatus) {
	return func(s *corev1.PodStatus) {
		at := metav1.NewTime(end)
		s.Phase, s.Reason = phase, reason
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "PodCompleted", LastTransitionTime: at}}
		if reason == "Evicted" {
			s.Conditions = append(s.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
				Reason: "TerminationByKubelet", LastTransitionTime: at})
		}
		for i := range s.ContainerStatuses {
			s.ContainerStatuses[i].Ready = false
			s.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: at, FinishedAt: at}}
		}
	}
}

// TestNodeClockBehindMakesNoRemovalEarly: a node whose clock is 2h behind
// reports now that its pods finished 2h ago. podjanitor counts from when the
// API server stored that status (its managedFields time), not from the node's
// time: ttl-after-finished 1h and an evicted-pod rule of 1h leave such pods
// alone, and a pod with ttl-after-finished 5s goes 5s after the status write,
// not at once.
func TestNodeClockBehindMakesNoRemovalEarly(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: evicted
    match: {phases: [Failed], reasons: [Evicted]}
    clock: finished
    after: 1h
`)
	startDaemon(t, "--namespace", ns, "--config", cfg)

	skewed := createPod(t, ns, "finished-2h-ago", onNode, annotate(prefix+"ttl-after-finished", "1h"))
	evicted := createPod(t, ns, "evicted-2h-ago", onNode)
	control := createPod(t, ns, "control-5s", onNode, annotate(prefix+"ttl-after-finished", "5s"))
	for _, p := range []*corev1.Pod{skewed, evicted, control} {
		waitPod(t, p, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	}

	behind := time.Now().Add(-2 * time.Hour)
	reportStatus(t, skewed, finishedAt(corev1.PodSucceeded, "", behind))
	reportStatus(t, evicted, finishedAt(corev1.PodFailed, "Evicted", behind))
	stored := reportStatus(t, control, finishedAt(corev1.PodSucceeded, "", behind))
	written, ok := policy.StatusWrittenAt(stored)
	if !ok {
		t.Fatalf("the status write left no managedFields entry: %+v", stored.ManagedFields)
	}
	r.checkOnTime(t, control, written.Add(5*time.Second))

	time.Sleep(5 * time.Second) // the others had time to go too, if podjanitor counted from the node's clock
	r.checkNotRemoved(t, skewed)
	r.checkNotRemoved(t, evicted)
}
