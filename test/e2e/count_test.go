//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podjanitor/podjanitor/policy"
)

// Retention by count (issue 54) on the real API server.

// newestFirst orders pods as a rule that keeps the newest does: by finish
// time (creation for unfinished pods), then creation, then name; the
// newest first.
func newestFirst(pods []*corev1.Pod) {
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		return -cmp.Or(policy.SortTime(a).Compare(policy.SortTime(b)),
			a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
}

// names are the pods' names.
func names(pods []*corev1.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Name
	}
	return out
}

// failedPodsOf waits until the Job's n pods have failed and returns them.
func failedPodsOf(t *testing.T, ns, job string, n int) []*corev1.Pod {
	t.Helper()
	var failed []*corev1.Pod
	if err := wait.PollUntilContextTimeout(ctxFor(t), 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
		if err != nil {
			return false, nil
		}
		failed = failed[:0]
		for i := range list.Items {
			if p := &list.Items[i]; p.Status.Phase == corev1.PodFailed && mainStatus(p) != nil && mainStatus(p).State.Terminated != nil {
				failed = append(failed, p)
			}
		}
		return len(failed) >= n, nil
	}); err != nil {
		t.Fatalf("job %s: %d of %d pods failed", job, len(failed), n)
	}
	return failed
}

// remaining are the pods of ns with the label selector that are not being
// deleted.
func remaining(t *testing.T, ns, selector string) []string {
	t.Helper()
	list, err := client.CoreV1().Pods(ns).List(ctxFor(t), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out
}

// TestKeepNewestOfARealJob: a Job of 10 completions whose pods all fail on
// the real node, under a rule that keeps the newest 3 failed pods of each
// Job and removes the others at once: 7 go, the 3 newest stay. Two more
// pods of the Job fail later: they are the newest now, and the two oldest
// of the 3 go.
func TestKeepNewestOfARealJob(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	parallel, backoff := int32(10), int32(9)
	zero := int64(0)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns},
		Spec: batchv1.JobSpec{
			Parallelism: &parallel, Completions: &parallel, BackoffLimit: &backoff,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				NodeName: realNodeName, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &zero,
				Containers: []corev1.Container{crashingContainer()},
			}},
		},
	}
	job, err := client.BatchV1().Jobs(ns).Create(ctxFor(t), job, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	failed := failedPodsOf(t, ns, job.Name, 10)
	newestFirst(failed)
	t.Logf("failed, newest first: %v", names(failed))

	cfg := writePolicy(t, "", `
  - name: failed-job-pods
    match: {phases: [Failed], ownerKinds: {include: [Job]}}
    clock: finished
    after: 0s
    keepNewest: 3
`)
	startDaemon(t, "--namespace", ns, "--config", cfg)
	for _, p := range failed[3:] {
		r.waitRemoved(t, p, time.Minute)
	}
	time.Sleep(3 * time.Second)
	for _, p := range failed[:3] {
		r.checkNotRemoved(t, p)
	}

	// Two more pods of the Job fail: the newest now.
	ownedByJob := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: new(true)}}
	}
	var more []*corev1.Pod
	for i := range 2 {
		more = append(more, createPod(t, ns, fmt.Sprintf("nightly-again-%d", i), onRealNode(crashingContainer()), ownedByJob))
	}
	for _, p := range more {
		waitPod(t, p, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	}
	for _, p := range failed[1:3] {
		r.waitRemoved(t, p, time.Minute)
	}
	time.Sleep(3 * time.Second)
	r.checkNotRemoved(t, failed[0])
	for _, p := range more {
		r.checkNotRemoved(t, p)
	}
}

// TestMaxPodsOfANamespace: a rule that keeps at most 5 of its pods in a
// namespace (and would remove them a week after their creation): of 8, the
// 3 oldest go at once; 2 more created later push the 2 next oldest out.
// Pods the rule does not match are neither counted nor removed.
func TestMaxPodsOfANamespace(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	cfg := writePolicy(t, "", `
  - name: at-most-five
    match: {labelSelector: "app=batch"}
    clock: created
    after: 7d
    maxPods: 5
`)
	mk := func(prefix string, n int, opts ...podOpt) []*corev1.Pod {
		return createPods(t, n, func(i int) *corev1.Pod {
			return pod(ns, fmt.Sprintf("%s-%d", prefix, i), append([]podOpt{label("app", "batch")}, opts...)...)
		})
	}
	first := mk("a", 8)
	other := createPods(t, 3, func(i int) *corev1.Pod { return pod(ns, fmt.Sprintf("other-%d", i), label("app", "web")) })
	newestFirst(first)
	startDaemon(t, "--namespace", ns, "--config", cfg)
	for _, p := range first[5:] {
		r.waitRemoved(t, p, time.Minute)
	}
	time.Sleep(2 * time.Second) // a second apart: the next are newer
	later := mk("b", 2)
	for _, p := range first[3:5] {
		r.waitRemoved(t, p, time.Minute)
	}
	time.Sleep(3 * time.Second)
	for _, p := range append(append(first[:3:3], later...), other...) {
		r.checkNotRemoved(t, p)
	}
	want := append(names(first[:3]), names(later)...)
	slices.Sort(want)
	if got := remaining(t, ns, "app=batch"); !slices.Equal(got, want) {
		t.Errorf("remaining %v, want %v", got, want)
	}
}

// TestLoweredKeepNewestIsHeldAsAWave: 30 pods kept by keepNewest 50; the
// policy file reloaded with keepNewest 2 drops 28 out of the newest at
// once: a wave, held until approved on the Lease; then they go, and the
// newest 2 stay.
func TestLoweredKeepNewestIsHeldAsAWave(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovalsDurably(t, ns)
	pods := createPods(t, 30, func(i int) *corev1.Pod { return pod(ns, fmt.Sprintf("run-%02d", i), label("app", "ci")) })
	rule := `
  - name: keep-newest
    match: {labelSelector: "app=ci"}
    clock: created
    after: 0s
    keepNewest: %d
    groupBy: "label:app"
`
	cfg := writePolicy(t, "", fmt.Sprintf(rule, 50))
	d := startDaemon(t, "--namespace", ns, "--config", cfg, "--leader-elect-resource-namespace", ns)
	d.waitLog("Starting controller", 30*time.Second)
	time.Sleep(2 * time.Second)
	noneRemoved(t, r.removals, pods)
	writePolicy(t, cfg, fmt.Sprintf(rule, 2))
	d.waitLog("Holding the removals of the reloaded policy", 30*time.Second)
	id := heldOnLease(t, ns, "podjanitor")
	time.Sleep(5 * time.Second)
	noneRemoved(t, r.removals, pods)
	approveOnLease(t, ns, id)
	newestFirst(pods)
	for _, p := range pods[2:] {
		r.waitRemoved(t, p, time.Minute)
	}
	time.Sleep(2 * time.Second)
	for _, p := range pods[:2] {
		r.checkNotRemoved(t, p)
	}
}

// TestKeepNewestOfACronJob: a CronJob's runs are Jobs of their own; a rule
// that keeps the newest 2 failed pods of each owner counts the CronJob's
// pods together through its Jobs (podjanitor's Job metadata cache): of 4
// runs that failed, the 2 oldest runs' pods go. A Job of no CronJob keeps
// its own.
func TestKeepNewestOfACronJob(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	zero, limit, none := int64(0), int32(10), int32(0)
	podSpec := corev1.PodSpec{NodeName: realNodeName, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &zero,
		Containers: []corev1.Container{crashingContainer()}}
	cron, err := client.BatchV1().CronJobs(ns).Create(ctxFor(t), &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns},
		Spec: batchv1.CronJobSpec{Schedule: "0 0 1 1 *", Suspend: new(true), FailedJobsHistoryLimit: &limit, SuccessfulJobsHistoryLimit: &limit,
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: podSpec}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	run := func(name string, owner *metav1.OwnerReference) *corev1.Pod {
		job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: batchv1.JobSpec{BackoffLimit: &none, Template: corev1.PodTemplateSpec{Spec: podSpec}}}
		if owner != nil {
			job.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		if _, err := client.BatchV1().Jobs(ns).Create(ctxFor(t), job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return failedPodsOf(t, ns, name, 1)[0]
	}
	owner := &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "CronJob", Name: cron.Name, UID: cron.UID, Controller: new(true)}
	var runs []*corev1.Pod
	for i := range 4 {
		runs = append(runs, run(fmt.Sprintf("nightly-%d", i), owner))
	}
	manual := run("manual", nil)
	newestFirst(runs)
	cfg := writePolicy(t, "", `
  - name: failed-job-pods
    match: {phases: [Failed]}
    clock: finished
    after: 0s
    keepNewest: 2
`)
	startDaemon(t, "--namespace", ns, "--config", cfg)
	for _, p := range runs[2:] {
		r.waitRemoved(t, p, time.Minute)
	}
	time.Sleep(3 * time.Second)
	for _, p := range append(runs[:2:2], manual) {
		r.checkNotRemoved(t, p)
	}
}
