package events

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/reference"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podjanitor/podjanitor/internal/apitest"
	"github.com/podjanitor/podjanitor/policy"
)

func TestCutNote(t *testing.T) {
	tests := map[string]struct {
		in      string
		wantCut bool
	}{
		"short":                  {in: "Pod deleted", wantCut: false},
		"exactly the limit":      {in: strings.Repeat("a", NoteLimit), wantCut: false},
		"one byte over":          {in: strings.Repeat("a", NoteLimit+1), wantCut: true},
		"5 KB":                   {in: strings.Repeat("x", 5<<10), wantCut: true},
		"100 KB":                 {in: strings.Repeat("x", 100<<10), wantCut: true},
		"2-byte runes":           {in: strings.Repeat("é", NoteLimit), wantCut: true},
		"3-byte runes, offset 1": {in: "a" + strings.Repeat("€", NoteLimit), wantCut: true},
		"4-byte runes, offset 2": {in: "ab" + strings.Repeat("😀", NoteLimit), wantCut: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := CutNote(tt.in)
			if len(got) > NoteLimit {
				t.Errorf("len = %d bytes, want at most %d", len(got), NoteLimit)
			}
			if !utf8.ValidString(got) {
				t.Errorf("cut note is not valid UTF-8: %q", got[len(got)-20:])
			}
			if cut := got != tt.in; cut != tt.wantCut {
				t.Fatalf("cut = %v, want %v", cut, tt.wantCut)
			}
			if tt.wantCut {
				if !strings.HasSuffix(got, truncated) {
					t.Errorf("cut note does not end in the marker %q", truncated)
				}
				if body := strings.TrimSuffix(got, truncated); !strings.HasPrefix(tt.in, body) || len(got) < NoteLimit-3 {
					t.Errorf("cut note keeps %d bytes of the original, want the longest prefix that fits", len(body))
				}
			}
		})
	}
}

// recordedEvent is an event as the events library would write it.
type recordedEvent struct {
	regarding, related  corev1.ObjectReference
	typ, reason, action string
	note                string
}

// eventLog is an EventRecorder that keeps every event.
type eventLog struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (l *eventLog) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...interface{}) {
	e := recordedEvent{typ: eventtype, reason: reason, action: action, note: fmt.Sprintf(note, args...)}
	ref, err := reference.GetReference(scheme.Scheme, regarding)
	if err != nil {
		panic(err)
	}
	e.regarding = *ref
	if related != nil {
		ref, err := reference.GetReference(scheme.Scheme, related)
		if err != nil {
			panic(err)
		}
		e.related = *ref
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// take returns the events recorded since the last call.
func (l *eventLog) take() []recordedEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.events
	l.events = nil
	return out
}

// budgetHarness drives an Reporter with a fake clock.
type budgetHarness struct {
	t        *testing.T
	clock    *testingclock.FakeClock
	log      *eventLog
	r        *Reporter
	openedAt time.Time // of the window open, if any
}

func newBudgetHarness(t *testing.T, dryRun, noRemovalEvents bool) *budgetHarness {
	logger, _ := ktesting.NewTestContext(t)
	h := &budgetHarness{t: t, clock: testingclock.NewFakeClock(t0), log: &eventLog{}}
	h.r = NewReporter(logger, h.log, h.clock, dryRun, noRemovalEvents)
	t.Cleanup(h.r.Flush) // ends the window's goroutine
	return h
}

func (h *budgetHarness) windowOpen() bool {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	return h.r.windowEnd != nil
}

// remove reports the removal of pods whose deadline was a minute ago.
func (h *budgetHarness) remove(pods ...*corev1.Pod) {
	for _, p := range pods {
		wasOpen := h.windowOpen()
		action := policy.ActionDelete
		if p.Status.Phase == corev1.PodRunning {
			action = policy.ActionEvict
		}
		h.r.ReportRemoval(p, policy.Decision{Deadline: h.clock.Now().Add(-time.Minute), Action: action, Source: "podjanitor.io/ttl"})
		if !wasOpen && h.windowOpen() {
			h.openedAt = h.clock.Now()
		}
	}
}

// step advances the clock and, if the window has ended, waits until its
// flush has recorded its events.
func (h *budgetHarness) step(d time.Duration) {
	h.t.Helper()
	h.clock.Step(d)
	if h.clock.Now().Before(h.openedAt.Add(summaryInterval)) {
		return
	}
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 5*time.Second, true,
		func(context.Context) (bool, error) { return !h.windowOpen(), nil })
	if err != nil {
		h.t.Fatalf("the window opened at %s was not flushed at %s", h.openedAt, h.clock.Now())
	}
	h.r.flushing.Lock() // until the flush has recorded its events
	h.r.flushing.Unlock()
}

func ownedPods(prefix string, n int, owner *metav1.OwnerReference, phase corev1.PodPhase) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := range n {
		p := apitest.Pod(fmt.Sprintf("%s-%d", prefix, i), t0.Add(-time.Hour), phase, nil)
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		pods = append(pods, p)
	}
	return pods
}

func controllerRef(kind, name string) *metav1.OwnerReference {
	yes := true
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: &yes}
}

var countInNote = regexp.MustCompile(`^(?:Dry run: would )?(?:[Dd]elete|[Ee]vict)(?:d)? (\d+) pods?`)

// reported sums what the events say: pods reported one by one, and pods
// counted by summaries, by regarding object ("Kind/name").
func reported(t *testing.T, events []recordedEvent) (perPod int, summarised map[string]int) {
	t.Helper()
	summarised = map[string]int{}
	for _, e := range events {
		if len(e.note) > NoteLimit {
			t.Errorf("note of %d bytes: %.80s…", len(e.note), e.note)
		}
		if e.regarding.Kind == "Pod" {
			perPod++
			continue
		}
		m := countInNote.FindStringSubmatch(e.note)
		if m == nil {
			t.Fatalf("summary on %s/%s does not start with a count: %q", e.regarding.Kind, e.regarding.Name, e.note)
		}
		n, _ := strconv.Atoi(m[1])
		summarised[e.regarding.Kind+"/"+e.regarding.Name] += n
	}
	return perPod, summarised
}

func TestRemovalEventsWithinBudgetArePerPod(t *testing.T) {
	h := newBudgetHarness(t, false, false)
	h.remove(ownedPods("web", removalEventBurst, controllerRef("ReplicaSet", "web"), corev1.PodSucceeded)...)
	h.step(summaryInterval)
	h.remove(ownedPods("later", 3, nil, corev1.PodRunning)...) // 5/s refilled the bucket meanwhile

	got := h.log.take()
	if len(got) != removalEventBurst+3 {
		t.Fatalf("events = %d, want %d: one per pod", len(got), removalEventBurst+3)
	}
	want := recordedEvent{
		regarding: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "default", Name: "later-0", UID: "uid-later-0", ResourceVersion: "7"},
		typ:       corev1.EventTypeNormal, reason: ReasonLifetimeExpired, action: "Evict",
		note: "Pod evicted: its deadline 2026-11-29T11:59:10Z (podjanitor.io/ttl) has passed",
	}
	if diff := cmp.Diff(want, got[removalEventBurst], cmp.AllowUnexported(recordedEvent{})); diff != "" {
		t.Errorf("event (-want,+got):\n%s", diff)
	}
	if h.windowOpen() {
		t.Error("a summary window is open although every removal was reported on its pod")
	}
}

func TestRemovalEventsOverBudgetAreSummarisedPerOwner(t *testing.T) {
	h := newBudgetHarness(t, false, false)
	web := ownedPods("web", 200, controllerRef("ReplicaSet", "web-7d4b9"), corev1.PodSucceeded)
	// A Job pod whose first owner reference is not its controller.
	job := ownedPods("batch", 50, &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "cm", UID: "uid-cm"}, corev1.PodFailed)
	for _, p := range job {
		p.OwnerReferences = append(p.OwnerReferences, *controllerRef("Job", "batch"))
		p.OwnerReferences[1].APIVersion = "batch/v1"
	}
	bare := ownedPods("bare", 50, nil, corev1.PodSucceeded)
	for i := range 50 { // interleaved, as a drain would remove them
		h.remove(web[4*i : 4*i+4]...)
		h.remove(job[i], bare[i])
	}
	if got := len(h.log.take()); got != removalEventBurst {
		t.Fatalf("events at once = %d, want the burst of %d", got, removalEventBurst)
	}
	h.step(summaryInterval - time.Millisecond)
	if got := h.log.take(); len(got) != 0 {
		t.Fatalf("%d events before the interval ended, want none", len(got))
	}
	h.step(time.Millisecond)
	got := h.log.take()
	if len(got) != 3 {
		t.Fatalf("summaries = %d, want 3 (ReplicaSet, Job, namespace): %+v", len(got), got)
	}
	perPod, summarised := reported(t, got)
	if perPod != 0 {
		t.Errorf("%d per-pod events after the burst, want none", perPod)
	}
	// The burst went to the first 50 removals: 34 of web, 8 of batch, 8 bare.
	want := map[string]int{"ReplicaSet/web-7d4b9": 200 - 34, "Job/batch": 50 - 8, "Namespace/default": 50 - 8}
	if diff := cmp.Diff(want, summarised); diff != "" {
		t.Errorf("pods counted by summaries (-want,+got):\n%s", diff)
	}
	rs := got[0]
	wantRef := corev1.ObjectReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Namespace: "default", Name: "web-7d4b9", UID: "uid-web-7d4b9"}
	if diff := cmp.Diff(wantRef, rs.regarding); diff != "" {
		t.Errorf("summary regards (-want,+got):\n%s", diff)
	}
	if rs.related.Kind != "Pod" || rs.related.Name != "web-34" || rs.action != "Delete" || rs.reason != ReasonLifetimeExpired {
		t.Errorf("summary related %s/%s, action %s, reason %s; want the first summarised pod web-34, Delete, %s",
			rs.related.Kind, rs.related.Name, rs.action, rs.reason, ReasonLifetimeExpired)
	}
	wantNote := "Deleted 166 pods at their deadline 2026-11-29T11:59:00Z (podjanitor.io/ttl): web-34, web-35, web-36"
	if !strings.HasPrefix(rs.note, wantNote) || !strings.HasSuffix(rs.note, ", web-53 and 146 more") {
		t.Errorf("note = %q, want it to start %q and end with the pods not named", rs.note, wantNote)
	}
	if ns := got[2]; ns.regarding.Kind != "Namespace" || ns.regarding.Namespace != "default" {
		t.Errorf("bare pods' summary regards %+v, want the Namespace, in it", ns.regarding)
	}
}

// TestRemovalEventsStayWithinTheirBudget drains a backlog at 200 removals a
// second for a minute: the events stay at the budget, each owner gets at
// most one summary per interval, and every removal is reported once.
func TestRemovalEventsStayWithinTheirBudget(t *testing.T) {
	h := newBudgetHarness(t, false, false)
	owners := []*metav1.OwnerReference{controllerRef("ReplicaSet", "a"), controllerRef("ReplicaSet", "b"), nil}
	const perTick, tick, ticks = 20, 100 * time.Millisecond, 600
	var all []recordedEvent
	for i := range ticks {
		for j := range perTick {
			h.remove(ownedPods(fmt.Sprintf("p%d-%d", i, j), 1, owners[j%3], corev1.PodSucceeded)...)
		}
		h.step(tick)
		all = append(all, h.log.take()...)
	}
	h.step(summaryInterval)
	all = append(all, h.log.take()...)

	perPod, summarised := reported(t, all)
	total := perPod
	for _, n := range summarised {
		total += n
	}
	if total != perTick*ticks {
		t.Errorf("events report %d removals, want every one of %d", total, perTick*ticks)
	}
	if maxPerPod := removalEventBurst + removalEventRate*int((ticks*tick).Seconds()); perPod > maxPerPod {
		t.Errorf("%d per-pod events, budget allows %d", perPod, maxPerPod)
	}
	summaries := len(all) - perPod
	if maxSummaries := 3 * (int((ticks*tick)/summaryInterval) + 1); summaries > maxSummaries {
		t.Errorf("%d summaries, want at most one per owner and interval (%d)", summaries, maxSummaries)
	}
	t.Logf("%d removals: %d events (%d per pod, %d summaries)", perTick*ticks, len(all), perPod, summaries)
}

func TestManyOwnersAreSummarisedOnTheirNamespace(t *testing.T) {
	h := newBudgetHarness(t, false, false)
	h.remove(ownedPods("warm-up", removalEventBurst, nil, corev1.PodSucceeded)...)
	h.log.take()
	// A CronJob's Jobs in two namespaces: one pod each, but 3 for the first two.
	removals := 0
	for i := range 300 {
		n := 1
		if i < 2 {
			n = 3
		}
		pods := ownedPods(fmt.Sprintf("job-%d", i), n, controllerRef("Job", fmt.Sprintf("job-%d", i)), corev1.PodSucceeded)
		for _, p := range pods {
			p.Namespace = []string{"default", "other"}[i%2]
		}
		h.remove(pods...)
		removals += n
	}
	h.step(summaryInterval)
	got := h.log.take()
	if len(got) != maxOwnerSummaries+2 {
		t.Fatalf("events = %d, want %d owners' and 2 namespaces' summaries", len(got), maxOwnerSummaries+2)
	}
	if got[0].regarding.Name != "job-0" || !strings.HasPrefix(got[0].note, "Deleted 3 pods") {
		t.Errorf("first summary on %s: %q, want the owners with the most removals first: job-0 with 3", got[0].regarding.Name, got[0].note)
	}
	_, summarised := reported(t, got)
	ownersOwn := 3 + 3 + (maxOwnerSummaries - 2)
	if n := summarised["Namespace/default"] + summarised["Namespace/other"]; n != removals-ownersOwn {
		t.Errorf("the namespaces' summaries count %d pods, want the other owners' %d", n, removals-ownersOwn)
	}
}

func TestFlushReportsPendingRemovalsAtOnce(t *testing.T) {
	h := newBudgetHarness(t, false, false)
	h.remove(ownedPods("web", removalEventBurst+7, nil, corev1.PodSucceeded)...)
	h.log.take()
	h.r.Flush()
	got := h.log.take()
	if len(got) != 1 || !strings.HasPrefix(got[0].note, "Deleted 7 pods") {
		t.Fatalf("events on flush = %+v, want one summary of 7 pods", got)
	}
	if h.windowOpen() {
		t.Error("window still open after flush")
	}
	h.clock.Step(summaryInterval)
	time.Sleep(20 * time.Millisecond)
	if got := h.log.take(); len(got) != 0 {
		t.Errorf("events after the flushed window's interval = %+v, want none", got)
	}
}

func TestDryRunOverBudgetIsSummarisedAsWouldRemove(t *testing.T) {
	h := newBudgetHarness(t, true, true) // --removal-events=false does not silence a dry run
	h.remove(ownedPods("job", removalEventBurst+2, controllerRef("Job", "nightly"), corev1.PodSucceeded)...)
	h.step(summaryInterval)
	got := h.log.take()
	if len(got) != removalEventBurst+1 {
		t.Fatalf("events = %d, want %d", len(got), removalEventBurst+1)
	}
	first, last := got[0], got[len(got)-1]
	if first.reason != ReasonWouldRemove || !strings.HasPrefix(first.note, "Dry run: would delete pod") {
		t.Errorf("per-pod event %s %q, want WouldRemove", first.reason, first.note)
	}
	want := "Dry run: would delete 2 pods, their deadline 2026-11-29T11:59:00Z (podjanitor.io/ttl) passed: job-50, job-51"
	if last.reason != ReasonWouldRemove || last.note != want || last.regarding.Kind != "Job" {
		t.Errorf("summary %s on %s: %q, want WouldRemove on the Job: %q", last.reason, last.regarding.Kind, last.note, want)
	}
}

func TestNoRemovalEventsRecordsNone(t *testing.T) {
	h := newBudgetHarness(t, false, true)
	h.remove(ownedPods("web", removalEventBurst+10, nil, corev1.PodSucceeded)...)
	h.step(summaryInterval)
	if got := h.log.take(); len(got) != 0 {
		t.Errorf("events = %d, want none with --removal-events=false", len(got))
	}
}

func TestSummaryNoteNamesAsManyPodsAsFit(t *testing.T) {
	g := &removalGroup{action: policy.ActionEvict}
	for i := range 40 {
		d := policy.Decision{Deadline: t0.Add(time.Duration(i) * time.Second), Source: fmt.Sprintf("rule/r%d", i%5)}
		g.add(fmt.Sprintf("%s-%02d", strings.Repeat("n", 200), i), d)
	}
	note := g.note(false)
	if len(note) > NoteLimit {
		t.Errorf("note of %d bytes, want at most %d", len(note), NoteLimit)
	}
	wantHead := "Evicted 40 pods at their deadlines 2026-11-29T12:00:00Z to 2026-11-29T12:00:39Z (rule/r0, rule/r1, rule/r2): "
	if !strings.HasPrefix(note, wantHead) || !strings.HasSuffix(note, "-03 and 36 more") {
		t.Errorf("note = %q, want it to start %q and name 4 of the 40 pods", note, wantHead)
	}
	one := &removalGroup{action: policy.ActionDelete}
	one.add("web-1", policy.Decision{Deadline: t0, Source: "podjanitor.io/ttl"})
	if got, want := one.note(false), "Deleted 1 pod at its deadline 2026-11-29T12:00:00Z (podjanitor.io/ttl): web-1"; got != want {
		t.Errorf("note = %q, want %q", got, want)
	}
}

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// TestPolicyWarningsBudget proves that a tenant flipping one policy between
// usable and not 1,000 times gets at most policyWarningBurst Warnings on
// it, that 100 policies together get at most policyWarningsBurst, that the
// left-out ones are counted, and that the budget refills with time.
func TestPolicyWarningsBudget(t *testing.T) {
	h := newBudgetHarness(t, false, false)
	clk, r := h.clock, h.r
	dropped := 0
	r.OnWarningDropped(func(reason string) {
		if reason == ReasonPolicyNotUsed {
			dropped++
		}
	})
	ref := func(name string) *corev1.ObjectReference {
		return &corev1.ObjectReference{Kind: "PodLifetimePolicy", Namespace: "team-a", Name: name}
	}
	for range 1000 {
		r.TenantPolicyNotUsed(ref("flipping"), "InvalidRules", "bad")
	}
	if got := len(h.log.take()); got != policyWarningBurst {
		t.Errorf("%d Warnings for 1,000 flips of one policy, want %d", got, policyWarningBurst)
	}
	if dropped != 1000-policyWarningBurst {
		t.Errorf("%d Warnings counted as dropped, want %d", dropped, 1000-policyWarningBurst)
	}
	clk.Step(policyWarningEvery)
	if !r.TenantPolicyNotUsed(ref("flipping"), "InvalidRules", "bad") {
		t.Errorf("no Warning %v later, want one", policyWarningEvery)
	}
	h.log.take()
	clk.Step(time.Hour) // the overall budget full again
	for i := range 100 {
		r.TenantPolicyNotUsed(ref(fmt.Sprintf("p-%d", i)), "InvalidRules", "bad")
	}
	if got := len(h.log.take()); got != policyWarningsBurst {
		t.Errorf("%d Warnings for 100 policies at once, want %d", got, policyWarningsBurst)
	}
}
