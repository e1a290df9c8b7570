//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The pod lifecycle of Kubernetes 1.35 to 1.37 (docs/policy.md#the-pod-lifecycle-of-kubernetes-135-to-137)
// as the real node's kubelet and the real scheduler write it. policy/lifecycle_test.go
// has every case as a table; these show the statuses are the ones the table assumes.

// crashingContainer runs podjanitor's image with a flag it refuses: the
// container exits 2 at once, on the real node (its image is loaded there).
func crashingContainer() corev1.Container {
	return corev1.Container{
		Name:            "main",
		Image:           "local/podjanitor:dev",
		ImagePullPolicy: corev1.PullNever,
		Args:            []string{"--no-such-flag"},
	}
}

// restartsOnExit2 makes the container restart in place when it exits 2,
// in a pod whose restartPolicy is Never (KEP-5307, beta in 1.35).
func restartsOnExit2(c *corev1.Container) {
	never := corev1.ContainerRestartPolicyNever
	c.RestartPolicy = &never
	c.RestartPolicyRules = []corev1.ContainerRestartRule{{
		Action:    corev1.ContainerRestartRuleActionRestart,
		ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{2}},
	}}
}

func onRealNode(c corev1.Container) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.NodeName = realNodeName
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.Containers = []corev1.Container{c}
		zero := int64(0)
		p.Spec.TerminationGracePeriodSeconds = &zero
	}
}

func mainStatus(p *corev1.Pod) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == "main" {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// TestRestartRulesOnARealNode: a container of a restartPolicy Never pod that
// the kubelet restarts by a rule has terminated, but its pod has not finished,
// so a `finished` rule leaves it; the same container with no rule fails its
// pod, which goes. Restarts by a rule are a crash loop once the kubelet backs
// off from them (CrashLoopBackOff), and only then.
func TestRestartRulesOnARealNode(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: finished
    clock: finished
    after: 1s
  - name: crash-looping
    match: {labelSelector: "loop=yes"}
    clock: crashLooping
    minRestarts: 1
    after: 2s
`)
	startDaemon(t, "--namespace", ns, "--config", cfg)

	withRule := crashingContainer()
	restartsOnExit2(&withRule)
	inPlace := createPod(t, ns, "restarts-in-place", onRealNode(withRule))
	if len(inPlace.Spec.Containers[0].RestartPolicyRules) == 0 {
		t.Fatal("the API server dropped the container's restartPolicyRules (ContainerRestartRules off?)")
	}
	looping := createPod(t, ns, "restarts-backing-off", onRealNode(withRule), label("loop", "yes"))
	failed := createPod(t, ns, "fails", onRealNode(crashingContainer()))

	// The pod without a rule fails and goes a second after its container's end.
	f := waitPod(t, failed, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	finishedAt := mainStatus(f).State.Terminated.FinishedAt.Time
	if at := r.waitRemoved(t, failed, 30*time.Second); at.Before(finishedAt.Add(time.Second)) {
		t.Errorf("failed pod removed at %s, before its finish %s + 1s", at.Format(time.RFC3339Nano), finishedAt.Format(time.RFC3339Nano))
	}

	// The pod restarting in place: its container has exited 2 and been
	// restarted, the pod stays Running and is never finished.
	p := waitPod(t, inPlace, "a restart in place", func(p *corev1.Pod) bool {
		s := mainStatus(p)
		return s != nil && s.RestartCount >= 1 && s.LastTerminationState.Terminated != nil
	})
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		t.Fatalf("pod restarting in place is %s", p.Status.Phase)
	}
	if code := mainStatus(p).LastTerminationState.Terminated.ExitCode; code != 2 {
		t.Fatalf("container exited %d, want 2", code)
	}

	// The one with the crash-looping rule goes once the kubelet backs off,
	// not before its Ready=False + 2s.
	l := waitPod(t, looping, "CrashLoopBackOff", func(p *corev1.Pod) bool {
		s := mainStatus(p)
		return s != nil && s.RestartCount >= 1 && s.State.Waiting != nil && s.State.Waiting.Reason == "CrashLoopBackOff"
	})
	ready := condition(l, corev1.PodReady)
	if ready == nil || ready.Status != corev1.ConditionFalse {
		t.Fatalf("crash-looping pod's Ready condition %+v, want False", ready)
	}
	if at := r.waitRemoved(t, looping, 30*time.Second); at.Before(ready.LastTransitionTime.Add(2 * time.Second)) {
		t.Errorf("crash-looping pod removed at %s, before its Ready=False %s + 2s", at.Format(time.RFC3339Nano), ready.LastTransitionTime.Format(time.RFC3339Nano))
	}

	// Well past the finished rule's second, the pod restarting in place is
	// still there (it matches no crash-looping rule).
	time.Sleep(3 * time.Second)
	r.checkNotRemoved(t, inPlace)
}

// TestGangWaitingPodIsNotStuck: a pod of a pod group that the scheduler holds
// until its gang is complete is Pending on purpose; a `pending` rule leaves it,
// while an unschedulable pod of no group goes, and so does a member the
// scheduler placed that cannot start its image. Needs the GenericWorkload gate
// (beta, off by default, from 1.37; hack/local-cluster.sh turns it on there).
func TestGangWaitingPodIsNotStuck(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	if _, err := client.Discovery().ServerResourcesForGroupVersion("scheduling.k8s.io/v1beta1"); err != nil {
		if apierrors.IsNotFound(err) {
			t.Skip("scheduling.k8s.io/v1beta1 is not served (pod groups are beta from Kubernetes 1.37)")
		}
		t.Fatal(err)
	}
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: stuck-pending
    clock: pending
    after: 2s
`)
	startDaemon(t, "--namespace", ns, "--config", cfg)

	group := func(name string, minCount int32) string {
		t.Helper()
		pg := &schedulingv1beta1.PodGroup{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
				Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: minCount},
			}},
		}
		if _, err := client.SchedulingV1beta1().PodGroups(ns).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod group %s: %v", name, err)
		}
		return name
	}
	member := func(group, image string) podOpt {
		return func(p *corev1.Pod) {
			p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: &group}
			p.Spec.Containers = []corev1.Container{{Name: "main", Image: image, ImagePullPolicy: corev1.PullNever}}
			p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": realNodeName}
			p.Spec.Tolerations = []corev1.Toleration{{Key: realNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
			zero := int64(0)
			p.Spec.TerminationGracePeriodSeconds = &zero
		}
	}
	// One of a gang of three: the scheduler waits for the two others (the
	// pod shows no PodScheduled condition meanwhile).
	waiting := createPod(t, ns, "waits-for-its-gang", member(group("three", 3), "local/podjanitor:dev"))
	if waiting.Spec.SchedulingGroup == nil {
		t.Fatal("the API server dropped the pod's schedulingGroup (GenericWorkload off?)")
	}
	// A gang of one, placed at once, whose image the node does not have.
	cannotPull := createPod(t, ns, "placed-cannot-pull", member(group("one", 1), "local/no-such-image:never"))
	// No group, nowhere to go.
	unschedulable := createPod(t, ns, "unschedulable", func(p *corev1.Pod) {
		p.Spec.NodeSelector = map[string]string{"podjanitor.io/no-such-node": "true"}
	})

	u := waitPod(t, unschedulable, "PodScheduled=False", func(p *corev1.Pod) bool {
		c := condition(p, corev1.PodScheduled)
		return c != nil && c.Status == corev1.ConditionFalse
	})
	if at := r.waitRemoved(t, unschedulable, 30*time.Second); at.Before(condition(u, corev1.PodScheduled).LastTransitionTime.Add(2 * time.Second)) {
		t.Errorf("unschedulable pod removed at %s, before its PodScheduled=False + 2s", at.Format(time.RFC3339Nano))
	}
	c := waitPod(t, cannotPull, "ErrImageNeverPull", func(p *corev1.Pod) bool {
		s := mainStatus(p)
		return s != nil && s.State.Waiting != nil && s.State.Waiting.Reason == "ErrImageNeverPull"
	})
	if c.Spec.NodeName != realNodeName {
		t.Fatalf("gang of one placed on %q, want %s", c.Spec.NodeName, realNodeName)
	}
	r.waitRemoved(t, cannotPull, 30*time.Second)

	// The gang's member: still Pending and unplaced, never removed.
	time.Sleep(3 * time.Second)
	w, err := client.CoreV1().Pods(ns).Get(ctx, waiting.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Status.Phase != corev1.PodPending || w.Spec.NodeName != "" {
		t.Fatalf("gang member is %s on %q, want Pending and not placed", w.Status.Phase, w.Spec.NodeName)
	}
	if c := condition(w, corev1.PodScheduled); c != nil {
		t.Logf("gang member waits with PodScheduled=%s %s: %s", c.Status, c.Reason, strings.TrimSpace(c.Message))
	}
	r.checkNotRemoved(t, waiting)
}

// realNodeTaint keeps pods off the real node unless they tolerate it
// (hack/node/real-node.sh's REAL_NODE_TAINT).
const realNodeTaint = "local-cluster.podjanitor.io/real-node"
