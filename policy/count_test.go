package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// failedPod is a Failed pod named name, created at created, finished
// finish after it, controlled by owner (kind/name/uid; "" for none).
func failedPod(name string, finish time.Duration, owner string, opts ...podOption) *corev1.Pod {
	p := newPod(inPhase(corev1.PodFailed), withContainers(terminatedContainer("Error", created.Add(finish))))
	p.Name = name
	if owner != "" {
		parts := strings.Split(owner, "/")
		p.OwnerReferences = []metav1.OwnerReference{{Kind: parts[0], Name: parts[1], UID: types.UID(parts[2]), Controller: ptr(true)}}
	}
	for _, opt := range opts {
		opt(p)
	}
	return p
}

// countEvaluator is an evaluator of rules over pods, placed by a Groups
// set pod by pod (as the controller does).
func countEvaluator(t *testing.T, rules string, pods ...*corev1.Pod) (*Evaluator, *Groups) {
	t.Helper()
	p, err := Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n" + rules))
	if err != nil {
		t.Fatal(err)
	}
	g := NewGroups()
	e := &Evaluator{Policy: p, Ranks: g}
	for _, pod := range pods {
		key := pod.Namespace + "/" + pod.Name
		g.Set(pod.Namespace, key, e.Members(pod, anyNamespace, key))
	}
	return e, g
}

// fates are the pods' fates by name: "kept" (no deadline) or the deadline
// as an offset from created.
func fates(t *testing.T, e *Evaluator, pods ...*corev1.Pod) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, pod := range pods {
		d, err := e.Decide(pod, anyNamespace, now)
		if err != nil {
			t.Fatal(err)
		}
		if !d.HasDeadline() {
			out[pod.Name] = "kept"
			continue
		}
		out[pod.Name] = d.Deadline.Sub(created).String()
	}
	return out
}

const keepThree = `
  - name: failed
    match: {phases: [Failed]}
    clock: finished
    after: 1h
    keepNewest: 3
`

func TestKeepNewestByOwner(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 5 { // job-a: finished 1m..5m after created
		pods = append(pods, failedPod(fmt.Sprintf("a-%d", i), time.Duration(i+1)*time.Minute, "Job/a/uid-a"))
	}
	pods = append(pods, failedPod("b-0", time.Minute, "Job/b/uid-b"), failedPod("b-1", 2*time.Minute, "Job/b/uid-b"))
	e, _ := countEvaluator(t, keepThree, pods...)
	got := fates(t, e, pods...)
	want := map[string]string{
		// a-0 and a-1 are past the newest 3: at their clock (finish + 1h),
		// not before they fell past (a-3's and a-4's finish).
		"a-0": "1h1m0s", "a-1": "1h2m0s",
		"a-2": "kept", "a-3": "kept", "a-4": "kept",
		"b-0": "kept", "b-1": "kept",
	}
	if !maps.Equal(got, want) {
		t.Errorf("fates %v, want %v", got, want)
	}
	d, _ := e.Decide(pods[0], anyNamespace, now)
	if c := d.Count; c == nil || c.Rank != 4 || c.Size != 5 || c.KeepNewest != 3 || c.Group != "owner Job/a" || !c.Known {
		t.Errorf("a-0's place %+v, want rank 4 of 5 in owner Job/a", c)
	}
}

// TestKeepNewestAfterZeroGoesWhenPushedOut: with after 0s, a pod past the
// newest goes when the pod that pushed it out finished, not at its own
// finish (it was among the newest until then).
func TestKeepNewestAfterZeroGoesWhenPushedOut(t *testing.T) {
	pods := []*corev1.Pod{
		failedPod("old", time.Minute, "Job/a/uid-a"),
		failedPod("mid", 10*time.Minute, "Job/a/uid-a"),
		failedPod("new", 30*time.Minute, "Job/a/uid-a"),
	}
	e, _ := countEvaluator(t, `
  - name: failed
    match: {phases: [Failed]}
    clock: finished
    after: 0s
    keepNewest: 2
`, pods...)
	if got, want := fates(t, e, pods...), map[string]string{"old": "30m0s", "mid": "kept", "new": "kept"}; !maps.Equal(got, want) {
		t.Errorf("fates %v, want %v", got, want)
	}
}

// TestKeepNewestTies: pods that finished at once are ordered by creation,
// then by name.
func TestKeepNewestTies(t *testing.T) {
	later := func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(created.Add(time.Second)) }
	pods := []*corev1.Pod{
		failedPod("x", time.Minute, "Job/a/uid-a"),
		failedPod("y", time.Minute, "Job/a/uid-a"),
		failedPod("a-created-later", time.Minute, "Job/a/uid-a", later),
	}
	e, _ := countEvaluator(t, strings.Replace(keepThree, "keepNewest: 3", "keepNewest: 2", 1), pods...)
	// Newest first: a-created-later (created last), y (name), x.
	if got, want := fates(t, e, pods...), map[string]string{"x": "1h1m0s", "y": "kept", "a-created-later": "kept"}; !maps.Equal(got, want) {
		t.Errorf("fates %v, want %v", got, want)
	}
}

// TestKeepNewestWithoutOwners: a namespace's pods without a controlling
// owner are one group; an owner that is not the controller does not count.
func TestKeepNewestWithoutOwners(t *testing.T) {
	notController := func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "ConfigMap", Name: "c", UID: "uid-c"}}
	}
	pods := []*corev1.Pod{
		failedPod("bare-0", time.Minute, ""),
		failedPod("bare-1", 2*time.Minute, "", notController),
		failedPod("bare-2", 3*time.Minute, ""),
		failedPod("bare-3", 4*time.Minute, ""),
		failedPod("other-ns", time.Minute, "", inNamespace("other")),
	}
	e, _ := countEvaluator(t, keepThree, pods...)
	want := map[string]string{"bare-0": "1h1m0s", "bare-1": "kept", "bare-2": "kept", "bare-3": "kept", "other-ns": "kept"}
	if got := fates(t, e, pods...); !maps.Equal(got, want) {
		t.Errorf("fates %v, want %v", got, want)
	}
	if d, _ := e.Decide(pods[0], anyNamespace, now); d.Count == nil || d.Count.Group != "no owner" {
		t.Errorf("bare-0's place %+v, want the group of no owner", d.Count)
	}
}

// TestKeepNewestOwnerReplaced: an owner created again under the same name
// (a new UID) starts a group of its own.
func TestKeepNewestOwnerReplaced(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 3 {
		pods = append(pods, failedPod(fmt.Sprintf("first-%d", i), time.Duration(i+1)*time.Minute, "Job/a/uid-1"))
	}
	pods = append(pods, failedPod("second-0", 10*time.Minute, "Job/a/uid-2"))
	e, _ := countEvaluator(t, strings.Replace(keepThree, "keepNewest: 3", "keepNewest: 2", 1), pods...)
	want := map[string]string{"first-0": "1h1m0s", "first-1": "kept", "first-2": "kept", "second-0": "kept"}
	if got := fates(t, e, pods...); !maps.Equal(got, want) {
		t.Errorf("fates %v, want %v", got, want)
	}
}

// TestKeepNewestByLabel: grouped by a label's value; pods without it are
// one group.
func TestKeepNewestByLabel(t *testing.T) {
	pods := []*corev1.Pod{
		failedPod("web-0", time.Minute, "Job/a/uid-a", labelled("app", "web")),
		failedPod("web-1", 2*time.Minute, "Job/b/uid-b", labelled("app", "web")),
		failedPod("db-0", time.Minute, "Job/c/uid-c", labelled("app", "db")),
		failedPod("none-0", time.Minute, ""),
		failedPod("none-1", 2*time.Minute, ""),
	}
	e, _ := countEvaluator(t, `
  - name: failed
    match: {phases: [Failed]}
    clock: finished
    after: 1h
    keepNewest: 1
    groupBy: "label:app"
`, pods...)
	want := map[string]string{"web-0": "1h1m0s", "web-1": "kept", "db-0": "kept", "none-0": "1h1m0s", "none-1": "kept"}
	if got := fates(t, e, pods...); !maps.Equal(got, want) {
		t.Errorf("fates %v, want %v", got, want)
	}
	if d, _ := e.Decide(pods[3], anyNamespace, now); d.Count == nil || d.Count.Group != "label app absent" {
		t.Errorf("none-0's place %+v", d.Count)
	}
}

// TestGroupsMoveAcrossTheLimit: a pod that comes among the newest pushes
// the one at the limit out, a pod that leaves (deleted, or no longer
// matched: its rule no longer decides it) lets the next one in; Set says
// which pod to decide again.
func TestGroupsMoveAcrossTheLimit(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 4 {
		pods = append(pods, failedPod(fmt.Sprintf("p-%d", i), time.Duration(i+1)*time.Minute, "Job/a/uid-a"))
	}
	e, g := countEvaluator(t, keepThree, pods...)
	newest := failedPod("p-new", time.Hour, "Job/a/uid-a")
	if moved := g.Set("default", "default/p-new", e.Members(newest, anyNamespace, "default/p-new")); !slices.Equal(moved, []string{"default/p-1"}) {
		t.Errorf("a new newest pod moved %v, want p-1 out", moved)
	}
	if got := fates(t, e, pods[1]); got["p-1"] != "1h2m0s" {
		t.Errorf("p-1 pushed out: %v", got)
	}
	// p-3 leaves the rule: its phase is Succeeded now (the rule matches
	// Failed pods only).
	succeeded := pods[3].DeepCopy()
	succeeded.Status.Phase = corev1.PodSucceeded
	if moved := g.Set("default", "default/p-3", e.Members(succeeded, anyNamespace, "default/p-3")); !slices.Equal(moved, []string{"default/p-1"}) {
		t.Errorf("a pod leaving moved %v, want p-1 in", moved)
	}
	if got := fates(t, e, pods[1]); got["p-1"] != "kept" {
		t.Errorf("p-1 back among the newest: %v", got)
	}
	// Deleted: p-new goes, p-0 comes in.
	if moved := g.Set("default", "default/p-new", nil); !slices.Equal(moved, []string{"default/p-0"}) {
		t.Errorf("a deleted pod moved %v, want p-0 in", moved)
	}
	// An old pod that comes moves nobody.
	oldest := failedPod("p-oldest", 0, "Job/a/uid-a")
	if moved := g.Set("default", "default/p-oldest", e.Members(oldest, anyNamespace, "default/p-oldest")); len(moved) != 0 {
		t.Errorf("an old pod moved %v", moved)
	}
	// Set again as it is: nothing moves.
	if moved := g.Set("default", "default/p-oldest", e.Members(oldest, anyNamespace, "default/p-oldest")); len(moved) != 0 {
		t.Errorf("the same place set again moved %v", moved)
	}
}

// TestCountedPlacesLeaveOut: pods being deleted and mirror pods take no
// place; a pod kept by its own annotation, or whose ttl decides it, does.
func TestCountedPlacesLeaveOut(t *testing.T) {
	e, _ := countEvaluator(t, keepThree)
	for _, pod := range []*corev1.Pod{failedPod("t", time.Minute, "", terminating()), failedPod("m", time.Minute, "", mirror())} {
		if m := e.Members(pod, anyNamespace, "k"); len(m) != 0 {
			t.Errorf("pod %s has places %v", pod.Name, m)
		}
	}
	for _, pod := range []*corev1.Pod{failedPod("k", time.Minute, "", annotated("podjanitor.io/keep", "true")), failedPod("ttl", time.Minute, "", annotated("podjanitor.io/ttl", "1s"))} {
		if m := e.Members(pod, anyNamespace, "k"); len(m) != 1 {
			t.Errorf("pod %s has places %v, want its group", pod.Name, m)
		}
	}
	if m := e.Members(failedPod("unknown-ns", time.Minute, ""), nil, "k"); len(m) != 0 {
		t.Errorf("a pod of a namespace not known has places %v", m)
	}
}

// TestMaxPods: past the newest maxPods of the rule's pods in a namespace,
// pods go at once: not before their clock started nor before they fell
// past; within it, at their clock (and keepNewest still keeps).
func TestMaxPods(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 5 {
		pods = append(pods, failedPod(fmt.Sprintf("p-%d", i), time.Duration(i+1)*time.Minute, fmt.Sprintf("Job/j%d/uid-%d", i, i)))
	}
	e, _ := countEvaluator(t, `
  - name: failed
    match: {phases: [Failed]}
    clock: finished
    after: 1h
    keepNewest: 1
    maxPods: 3
`, pods...)
	// Each pod is the newest of its own Job: kept by keepNewest, but p-0 and
	// p-1 are past the namespace's newest 3 (pushed out at p-3's and p-4's
	// finish).
	want := map[string]string{"p-0": "4m0s", "p-1": "5m0s", "p-2": "kept", "p-3": "kept", "p-4": "kept"}
	if got := fates(t, e, pods...); !maps.Equal(got, want) {
		t.Errorf("fates %v, want %v", got, want)
	}
	d, _ := e.Decide(pods[0], anyNamespace, now)
	if c := d.Count; c == nil || c.NamespaceRank != 4 || c.MaxPods != 3 {
		t.Errorf("p-0's place %+v", c)
	}
	// maxPods alone: within it, pods go at their clock.
	e, _ = countEvaluator(t, `
  - name: failed
    match: {phases: [Failed]}
    clock: finished
    after: 1h
    maxPods: 3
`, pods...)
	want = map[string]string{"p-0": "4m0s", "p-1": "5m0s", "p-2": "1h3m0s", "p-3": "1h4m0s", "p-4": "1h5m0s"}
	if got := fates(t, e, pods...); !maps.Equal(got, want) {
		t.Errorf("maxPods alone: fates %v, want %v", got, want)
	}
}

// TestCountPlaceNotKnown: a pod whose place is not known (no Ranks, or
// not placed yet) is kept by keepNewest, and maxPods does not apply.
func TestCountPlaceNotKnown(t *testing.T) {
	pods := []*corev1.Pod{failedPod("a", time.Minute, ""), failedPod("b", 2*time.Minute, ""), failedPod("c", 3*time.Minute, "")}
	e, _ := countEvaluator(t, `
  - name: failed
    match: {phases: [Failed]}
    clock: finished
    after: 1h
    keepNewest: 1
    maxPods: 1
`)
	if got, want := fates(t, e, pods...), map[string]string{"a": "kept", "b": "kept", "c": "kept"}; !maps.Equal(got, want) {
		t.Errorf("not placed: fates %v, want %v", got, want)
	}
	e.Ranks = nil
	if d, _ := e.Decide(pods[0], anyNamespace, now); d.HasDeadline() || d.Count == nil || d.Count.Known {
		t.Errorf("no Ranks: %+v", d)
	}
}

// TestBatchRanksCountAsGroups: the places counted from a namespace's pods
// at once are those set pod by pod, and counted again when its version
// changes.
func TestBatchRanksCountAsGroups(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 6 {
		pods = append(pods, failedPod(fmt.Sprintf("p-%d", i), time.Duration(i+1)*time.Minute, fmt.Sprintf("Job/j%d/uid-%d", i%2, i%2)))
	}
	live, _ := countEvaluator(t, keepThree+"    maxPods: 5\n", pods...)
	version := uint64(1)
	batch := &BatchRanks{Pods: func(string) []*corev1.Pod { return pods }, Version: func(string) uint64 { return version }}
	e := *live
	e.Ranks = batch
	if got, want := fates(t, &e, pods...), fates(t, live, pods...); !maps.Equal(got, want) {
		t.Errorf("batch %v, live %v", got, want)
	}
	pods = pods[2:]
	version++
	if got := fates(t, &e, pods...); got["p-2"] != "kept" {
		t.Errorf("counted again without p-0 and p-1: %v", got)
	}
}

// TestTenantRuleCounts: a tenant policy's rule keeps by count like a
// file's, before the file's rules; the restrictions forbid maxPods under
// a least after and keepNewest under a most after.
func TestTenantRuleCounts(t *testing.T) {
	rules, err := ParseRules([]byte(`[{name: failed, clock: finished, after: 2h, keepNewest: 1, match: {phases: [Failed]}}]`))
	if err != nil {
		t.Fatal(err)
	}
	tp, err := NewTenantPolicy("default", "keep", rules.Rules, Restrictions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := []*corev1.Pod{failedPod("a", time.Minute, "Job/a/uid-a"), failedPod("b", 2*time.Minute, "Job/a/uid-a")}
	e, g := countEvaluator(t, keepThree)
	e.Tenants = NewStaticTenants(tp)
	for _, p := range pods {
		g.Set("default", "default/"+p.Name, e.Members(p, anyNamespace, "default/"+p.Name))
	}
	if got, want := fates(t, e, pods...), map[string]string{"a": "2h1m0s", "b": "kept"}; !maps.Equal(got, want) {
		t.Errorf("fates %v, want %v", got, want)
	}
	for _, c := range []struct {
		r    Restrictions
		rule string
		want string
	}{
		{Restrictions{MinAfter: time.Hour}, `[{name: x, clock: finished, after: 2h, maxPods: 3}]`, "maxPods: the pods past it go at once"},
		{Restrictions{MaxAfter: 7 * 24 * time.Hour}, `[{name: x, clock: finished, after: 2h, keepNewest: 3}]`, "keepNewest: the newest pods have no deadline"},
	} {
		p, err := ParseRules([]byte(c.rule))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := NewTenantPolicy("default", "x", p.Rules, c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s under %+v: %v, want %q", c.rule, c.r, err, c.want)
		}
	}
}

func TestCountValidation(t *testing.T) {
	for _, c := range []struct{ rule, want string }{
		{"keepNewest: 0", "keepNewest: at least 1"},
		{"keepNewest: -2", "keepNewest: at least 1"},
		{"keepNewest: 100001", "keepNewest: at most 100000"},
		{"maxPods: 0", "maxPods: at least 1"},
		{`groupBy: owner`, "groupBy: only with keepNewest"},
		{"keepNewest: 2\n    groupBy: job", `groupBy: "job" is not "owner" or "label:" and a label key`},
		{"keepNewest: 2\n    groupBy: \"label:bad key\"", `groupBy: "label:bad key" is not "owner" or "label:" and a label key`},
		{"removalNotice: 5x", "removalNotice:"},
		{"keepNewest: two", "keepNewest"},
	} {
		_, err := Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n  - name: r\n    clock: finished\n    after: 1h\n    " + c.rule + "\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.rule, err, c.want)
		}
		if _, err := ParseRules([]byte("[{name: r, clock: finished, after: 1h, " + strings.ReplaceAll(c.rule, "\n    ", ", ") + "}]")); err == nil {
			t.Errorf("tenant rule %q: valid", c.rule)
		}
	}
	p, err := Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n  - name: r\n    clock: finished\n    after: 1h\n    keepNewest: 3\n    groupBy: \"label:app.kubernetes.io/name\"\n    maxPods: 50\n    removalNotice: 10m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Rules[0]; r.KeepNewest != 3 || r.GroupBy != "label:app.kubernetes.io/name" || r.MaxPods != 50 || r.RemovalNotice != 10*time.Minute {
		t.Errorf("rule %+v", r)
	}
}

// TestKeepNewestByCronJob: a CronJob's pods are one group through its
// Jobs (when the Jobs' controller is known); a Job of no CronJob, or whose
// controller is not known, groups its own pods.
func TestKeepNewestByCronJob(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 4 { // nightly-0..3: one Job each, one pod each
		pods = append(pods, failedPod(fmt.Sprintf("nightly-%d", i), time.Duration(i+1)*time.Minute, fmt.Sprintf("Job/nightly-%d/uid-j%d", i, i)))
	}
	pods = append(pods, failedPod("manual-0", time.Minute, "Job/manual/uid-m"), failedPod("unknown-0", time.Minute, "Job/unknown/uid-u"))
	controllers := func(namespace string, owner *metav1.OwnerReference) *metav1.OwnerReference {
		if strings.HasPrefix(owner.Name, "nightly-") {
			return &metav1.OwnerReference{Kind: "CronJob", Name: "nightly", UID: "uid-cron", Controller: ptr(true)}
		}
		return nil
	}
	p, err := Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n" + strings.Replace(keepThree, "keepNewest: 3", "keepNewest: 2", 1)))
	if err != nil {
		t.Fatal(err)
	}
	g := NewGroups()
	e := &Evaluator{Policy: p, Ranks: g, Controllers: controllers}
	for _, pod := range pods {
		key := pod.Namespace + "/" + pod.Name
		g.Set(pod.Namespace, key, e.Members(pod, anyNamespace, key))
	}
	want := map[string]string{"nightly-0": "1h1m0s", "nightly-1": "1h2m0s", "nightly-2": "kept", "nightly-3": "kept", "manual-0": "kept", "unknown-0": "kept"}
	if got := fates(t, e, pods...); !maps.Equal(got, want) {
		t.Errorf("fates %v, want %v", got, want)
	}
	if d, _ := e.Decide(pods[0], anyNamespace, now); d.Count == nil || d.Count.Group != "owner CronJob/nightly" {
		t.Errorf("nightly-0's place %+v", d.Count)
	}
}
