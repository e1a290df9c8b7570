// Package events owns the events podjanitor records: the pipeline that writes
// them to the API server on a client of its own and drains them at shutdown
// (Pipeline), the reporter that words them and holds removal events to a
// budget, summarising the rest per owner (Reporter), and the cutting of notes
// to what the events API stores (CutNote).
//
// It promises that no note is longer than NoteLimit bytes or invalid UTF-8,
// so that no event is refused, and that a drain of any size costs a bounded
// number of event writes (see removalEventRate).
package events

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clientevents "k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/removalerrors"
	"github.com/podjanitor/podjanitor/policy"
)

// drainingSink counts the event writes in flight so that shutdown can wait for
// them: the events library writes each event from a goroutine of its own and
// offers no flush.
type drainingSink struct {
	clientevents.EventSink
	mu       sync.Mutex
	inFlight int
	last     time.Time
}

func (s *drainingSink) track() func() {
	s.mu.Lock()
	s.inFlight++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.inFlight--
		s.last = time.Now()
		s.mu.Unlock()
	}
}

func (s *drainingSink) Create(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	defer s.track()()
	return s.EventSink.Create(ctx, e)
}

func (s *drainingSink) Update(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	defer s.track()()
	return s.EventSink.Update(ctx, e)
}

func (s *drainingSink) Patch(ctx context.Context, e *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	defer s.track()()
	return s.EventSink.Patch(ctx, e, data)
}

// drain waits until no write has been in flight for quiet (counted from the
// call at the earliest, as queued events start their writes just after), or
// until timeout.
func (s *drainingSink) drain(quiet, timeout time.Duration) {
	start := time.Now()
	deadline := start.Add(timeout)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		idle := s.inFlight == 0 && time.Since(s.last) >= quiet && time.Since(start) >= quiet
		s.mu.Unlock()
		if idle {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Event reasons. No core component uses them, so that an alert on one counts
// podjanitor's actions only: the kubelet reports its node-pressure evictions
// as "Evicted", and kube-controller-manager's Job controller uses
// "DeadlineExceeded".
const (
	// ReasonLifetimeExpired: pods were removed at their deadlines; the event's
	// action says how (Delete or Evict).
	ReasonLifetimeExpired = "LifetimeExpired"
	// ReasonWouldRemove: --dry-run, pods would have been removed.
	ReasonWouldRemove = "WouldRemove"
	// ReasonRemovalScheduled (Normal): the pod goes at its deadline, which
	// is near (--removal-notice), and this is how to keep it longer.
	ReasonRemovalScheduled = "RemovalScheduled"
	// ReasonInvalidAnnotation (Warning): an annotation does not parse.
	ReasonInvalidAnnotation = "InvalidAnnotation"
	// ReasonEvictionBlocked: a PodDisruptionBudget refused an eviction
	// (Normal), or the pod is under more than one PodDisruptionBudget, which
	// the Eviction API does not support (Warning).
	ReasonEvictionBlocked = "EvictionBlocked"
	// ReasonRemovalRefused (Warning): an admission webhook or policy denied
	// the removal, or the API server refused it for good (RBAC, an invalid
	// request).
	ReasonRemovalRefused = "RemovalRefused"
	// ReasonPolicyNotUsed (Warning, on a PodLifetimePolicy): podjanitor does
	// not use its rules, and says why.
	ReasonPolicyNotUsed = "PolicyNotUsed"
	// ReasonRemovalsHeld (Warning, on the object that changed): a change
	// made more pods due at once than the hold threshold allows; none of
	// them is removed until a person approves the change.
	ReasonRemovalsHeld = "RemovalsHeld"
	// ReasonRemovalsApproved (Normal, where the hold was): a person
	// approved a held change; its pods go at the removal cap, and the
	// approval is used.
	ReasonRemovalsApproved = "RemovalsApproved"
)

// NoteLimit is the most bytes the events API stores in a note (its
// NoteLengthLimit): it refuses a longer one, so the event would be lost.
const NoteLimit = 1024

// truncated marks a note or value that was cut.
const truncated = "… (truncated)"

// valueLimit bounds an annotation value quoted in a Warning, so that the name
// of the annotation and the reason it does not parse fit in the note.
const valueLimit = 100

// The budget of removal events. A removal is reported by an event on its pod
// while a token bucket of removalEventRate per second, with a burst of
// removalEventBurst, has a token: a cleanup of a few dozen pods at once, and
// up to 5 removals a second over time, are reported pod by pod. Above that,
// removals are counted per owner (the pod's controller reference, else its
// first owner; per namespace for pods without one) over summaryInterval from
// the first of them, and then reported by one event on the owner that names
// the count, the range of the deadlines and the first pods' names. At most
// maxOwnerSummaries owners, those with the most removals, get an event of
// their own per interval; the removals of the others are reported on their
// namespace. So a drain of any size costs at most 5 event writes a second,
// plus 2 a second and one per namespace every 10 s, instead of one per pod.
// Every removal is still logged (-v=2) and counted in the metrics.
const (
	removalEventRate  = 5
	removalEventBurst = 50
	summaryInterval   = 10 * time.Second
	maxOwnerSummaries = 20
	// summaryNames is how many pod names a group keeps for its note.
	summaryNames = 20
)

// The budget of Warnings on tenant policies (PolicyNotUsed): a tenant
// flipping a policy between usable and not, or writing many bad policies,
// must not flood the event pipeline that removal events share. Each policy
// (by namespace and name, so deleting and creating it again does not refill
// it) may have policyWarningBurst Warnings at once and one more every
// policyWarningEvery; all policies together policyWarningsBurst at once and
// policyWarningsRate a second. A Warning over the budget is left out and
// counted (OnWarningDropped: podjanitor_warnings_dropped_total); the policy's
// Ready condition still says why it is not used. At most maxPolicyBudgets
// policies' budgets are kept: full ones are dropped first (they hold nothing
// a new one would not), and past that every policy shares the overall budget
// only.
const (
	policyWarningBurst  = 3
	policyWarningEvery  = 10 * time.Minute
	policyWarningsBurst = 20
	policyWarningsRate  = 1
	maxPolicyBudgets    = 4096
)

// Pipeline writes the events of a recorder to the API server, on a
// client of its own so that event writes do not take removals' share of
// --kube-api-qps. It outlives the context it starts with, so that removals
// finishing during shutdown are still reported; shutdown stops it and drains its writes.
type Pipeline struct {
	recorder    clientevents.EventRecorder
	broadcaster clientevents.EventBroadcaster
	sink        *drainingSink
}

// StartPipeline starts the pipeline of cfg's API server; its events are
// reported by controller.
func StartPipeline(ctx context.Context, cfg *rest.Config, controller string) (*Pipeline, error) {
	client, err := kubernetes.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("creating event clientset: %w", err)
	}
	sink := &drainingSink{EventSink: &clientevents.EventSinkImpl{Interface: client.EventsV1()}}
	broadcaster := clientevents.NewBroadcaster(sink)
	if err := broadcaster.StartRecordingToSinkWithContext(context.WithoutCancel(ctx)); err != nil {
		return nil, fmt.Errorf("starting event recording: %w", err)
	}
	return &Pipeline{recorder: broadcaster.NewRecorder(scheme.Scheme, controller), broadcaster: broadcaster, sink: sink}, nil
}

// Recorder records events into the pipeline.
func (p *Pipeline) Recorder() clientevents.EventRecorder { return p.recorder }

// Drain waits until the events recorded so far are written (at most 5 s).
func (p *Pipeline) Drain() { p.sink.drain(100*time.Millisecond, 5*time.Second) }

// Shutdown stops the pipeline and waits for the writes in flight.
func (p *Pipeline) Shutdown() {
	p.broadcaster.Shutdown()
	p.Drain()
}

// Reporter records podjanitor's events. It cuts notes to what the API
// stores and holds removal events to their budget (see removalEventRate).
type Reporter struct {
	logger   klog.Logger
	recorder clientevents.EventRecorder
	clock    clock.Clock
	// dryRun reports removals as WouldRemove; noRemovalEvents (ignored in a
	// dry run) reports none.
	dryRun, noRemovalEvents bool

	budget            *rate.Limiter
	interval          time.Duration
	maxOwnerSummaries int

	// policyWarnings is the overall budget of Warnings on tenant policies,
	// policyBudgets each policy's (see policyWarningBurst); dropped counts
	// those left out, by reason.
	warningsMu     sync.Mutex
	policyWarnings *rate.Limiter
	policyBudgets  map[string]*rate.Limiter
	dropped        func(reason string)

	mu sync.Mutex
	// groups are the removals over the budget in the current interval;
	// windowEnd closes that interval, nil when none is open.
	groups    map[groupKey]*removalGroup
	windowEnd chan struct{}
	// flushing serialises flushes, so that flush returns only once every
	// group pending at its call has been recorded.
	flushing sync.Mutex
}

func NewReporter(logger klog.Logger, recorder clientevents.EventRecorder, clk clock.Clock, dryRun, noRemovalEvents bool) *Reporter {
	return &Reporter{
		logger:            logger,
		recorder:          recorder,
		clock:             clk,
		dryRun:            dryRun,
		noRemovalEvents:   noRemovalEvents,
		budget:            rate.NewLimiter(removalEventRate, removalEventBurst),
		interval:          summaryInterval,
		maxOwnerSummaries: maxOwnerSummaries,
		groups:            map[groupKey]*removalGroup{},
		policyWarnings:    rate.NewLimiter(policyWarningsRate, policyWarningsBurst),
		policyBudgets:     map[string]*rate.Limiter{},
		dropped:           func(string) {},
	}
}

// OnWarningDropped sets what is told of a Warning left out over its budget.
func (r *Reporter) OnWarningDropped(dropped func(reason string)) { r.dropped = dropped }

// allowPolicyWarning takes a token of the policy's budget and the overall one.
func (r *Reporter) allowPolicyWarning(ref *corev1.ObjectReference) bool {
	r.warningsMu.Lock()
	defer r.warningsMu.Unlock()
	now := r.clock.Now()
	key := ref.Namespace + "/" + ref.Name
	budget := r.policyBudgets[key]
	if budget == nil {
		if len(r.policyBudgets) >= maxPolicyBudgets {
			for k, b := range r.policyBudgets {
				if b.TokensAt(now) >= policyWarningBurst {
					delete(r.policyBudgets, k)
				}
			}
		}
		if len(r.policyBudgets) >= maxPolicyBudgets {
			return r.policyWarnings.AllowN(now, 1)
		}
		budget = rate.NewLimiter(rate.Every(policyWarningEvery), policyWarningBurst)
		r.policyBudgets[key] = budget
	}
	if budget.TokensAt(now) < 1 || !r.policyWarnings.AllowN(now, 1) {
		return false
	}
	return budget.AllowN(now, 1)
}

// eventf records an event with the note cut to what the API stores.
func (r *Reporter) eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.recorder.Eventf(regarding, related, eventtype, reason, action, "%s", CutNote(fmt.Sprintf(note, args...)))
}

// InvalidAnnotation warns that an annotation does not parse (the controller
// warns once per pod and bad value: podStates.warnOnce).
func (r *Reporter) InvalidAnnotation(pod *corev1.Pod, e *policy.AnnotationError) {
	r.eventf(pod, nil, corev1.EventTypeWarning, ReasonInvalidAnnotation, "Validate", "Not removing pod: %s", annotationErrorNote(e))
}

// InvalidNamespaceAnnotation warns, on the Namespace, that its keep
// annotation does not parse, which holds back its due pods (the controller
// warns once per namespace and value: namespaceWarnings).
func (r *Reporter) InvalidNamespaceAnnotation(e *policy.AnnotationError) {
	_, ns := namespaceGroup(e.Namespace, "")
	r.eventf(&ns, nil, corev1.EventTypeWarning, ReasonInvalidAnnotation, "Validate", "Not removing pods: %s", annotationErrorNote(e))
}

// TenantPolicyNotUsed warns, on a tenant policy (a PodLifetimePolicy), that
// podjanitor does not use its rules (the controller warns once per new
// reason or message), within the budget of policy Warnings (see
// policyWarningBurst); it says whether the Warning was recorded.
func (r *Reporter) TenantPolicyNotUsed(policyRef *corev1.ObjectReference, reason, message string) bool {
	if !r.allowPolicyWarning(policyRef) {
		r.dropped(ReasonPolicyNotUsed)
		r.logger.V(2).Info("Warning on a tenant policy over its budget, left out", "policy", policyRef.Namespace+"/"+policyRef.Name, "reason", reason)
		return false
	}
	r.eventf(policyRef, nil, corev1.EventTypeWarning, ReasonPolicyNotUsed, "Validate", "Not using the rules (%s): %s", reason, message)
	return true
}

// RemovalsHeld warns, on the object that changed (or the object a person
// approves on), that a change's wave of pods is held, and how to approve it.
func (r *Reporter) RemovalsHeld(regarding *corev1.ObjectReference, change string, pods int, approve string) {
	r.eventf(regarding, nil, corev1.EventTypeWarning, ReasonRemovalsHeld, "Hold",
		"Holding %d pod removal(s): %s made them due at once. Approve: %s; or revert the change", pods, change, approve)
}

// RemovalsApproved reports that the held change was approved: its pods
// are decided again and go at the removal cap; the approval covers this
// occurrence of the change only.
func (r *Reporter) RemovalsApproved(regarding *corev1.ObjectReference, change string, pods int) {
	r.eventf(regarding, nil, corev1.EventTypeNormal, ReasonRemovalsApproved, "Approve",
		"Change %s approved: its %d held pod(s) go at the removal cap. The approval is used: the same change made again is held again", change, pods)
}

// annotationErrorNote is the error with a long value shortened, in the
// annotation's value and wherever the parser quoted it.
func annotationErrorNote(e *policy.AnnotationError) string {
	if len(e.Value) <= valueLimit {
		return e.Error()
	}
	short := cutPrefix(e.Value, valueLimit)
	why := strings.ReplaceAll(e.Err.Error(), e.Value, short+"…")
	return fmt.Sprintf("annotation %s=%q… (%d bytes): %s", e.Key, short, len(e.Value), why)
}

// RemovalRefused reports a removal refused for a reason that retrying soon
// cannot fix (kind, one of removalerrors.Refusals); the controller reports each pod
// once per kind (podStates.refused). A PodDisruptionBudget doing its job is
// Normal; the others need someone to act, and are Warnings.
func (r *Reporter) RemovalRefused(pod *corev1.Pod, action policy.Action, kind string, err error) {
	const retrying = "podjanitor retries with backoff, at least every 5 min"
	switch kind {
	case removalerrors.DisruptionBudget:
		r.eventf(pod, nil, corev1.EventTypeNormal, ReasonEvictionBlocked, "Evict", "Eviction refused, retrying with backoff: %v", err)
	case removalerrors.MultipleBudgets:
		r.eventf(pod, nil, corev1.EventTypeWarning, ReasonEvictionBlocked, "Evict",
			"Eviction refused: more than one PodDisruptionBudget selects the pod, which the Eviction API does not support, "+
				"so no eviction can pass until one budget selects it; %s and never deletes the pod instead: %v", retrying, err)
	case removalerrors.AdmissionDenied:
		r.eventf(pod, nil, corev1.EventTypeWarning, ReasonRemovalRefused, actionVerb(action),
			"Removal (%s) denied by admission control; %s: %v", action, retrying, err)
	default:
		r.eventf(pod, nil, corev1.EventTypeWarning, ReasonRemovalRefused, actionVerb(action),
			"Removal (%s) refused by the API server; %s: %v", action, retrying, err)
	}
}

// ReportRemoval reports a removal, or in a dry run one that would have happened:
// on the pod within the budget, else in its owner's group.
func (r *Reporter) ReportRemoval(pod *corev1.Pod, d policy.Decision) {
	if r.noRemovalEvents && !r.dryRun {
		return
	}
	if r.budget.AllowN(r.clock.Now(), 1) {
		deadline := d.Deadline.UTC().Format(time.RFC3339)
		if r.dryRun {
			r.eventf(pod, nil, corev1.EventTypeNormal, ReasonWouldRemove, actionVerb(d.Action),
				"Dry run: would %s pod, its deadline %s (%s) has passed", d.Action, deadline, d.Source)
		} else {
			r.eventf(pod, nil, corev1.EventTypeNormal, ReasonLifetimeExpired, actionVerb(d.Action),
				"Pod %s: its deadline %s (%s) has passed", pastTense(d.Action), deadline, d.Source)
		}
		return
	}
	key, regarding := ownerOf(pod, d.Action)
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.groups[key]
	if g == nil {
		g = &removalGroup{action: d.Action, regarding: regarding, related: podReference(pod)}
		r.groups[key] = g
	}
	g.add(pod.Name, d)
	if r.windowEnd == nil {
		r.openWindow()
	}
}

// RemovalScheduled tells, on the pod, that it goes at d.Deadline, left from
// now, and how to keep it longer: by the annotation that set the deadline
// (the ttl one for a rule's: any deadline annotation sets the rules aside),
// or keep; annotationKey gives the annotations' full keys. It takes a token
// of the removal events' budget (removalEventRate), so that a wave of
// notices costs no more event writes than a wave of removals; a notice over
// the budget is left out, counted (OnWarningDropped) and logged. It says
// whether the notice was recorded.
func (r *Reporter) RemovalScheduled(pod *corev1.Pod, d policy.Decision, left time.Duration, annotationKey func(string) string) bool {
	deadline := d.Deadline.UTC().Format(time.RFC3339)
	if !r.budget.AllowN(r.clock.Now(), 1) {
		r.dropped(ReasonRemovalScheduled)
		r.logger.V(2).Info("Removal notice over the events' budget, left out", "pod", klog.KObj(pod), "deadline", deadline, "by", d.Source)
		return false
	}
	extend, value := annotationKey(policy.AnnotationTTL), "<duration from creation>"
	switch d.Source {
	case annotationKey(policy.AnnotationExpiresAt):
		extend, value = d.Source, "<RFC 3339 time>"
	case annotationKey(policy.AnnotationTTLAfterFinished):
		extend, value = d.Source, "<duration from finish>"
	}
	what := "Removal (" + string(d.Action) + ") scheduled"
	if r.dryRun {
		what = "Dry run: would " + string(d.Action) + " pod"
	}
	r.eventf(pod, nil, corev1.EventTypeNormal, ReasonRemovalScheduled, "Schedule",
		"%s at %s (in %s) by %s; to extend: kubectl annotate pod %s -n %s --overwrite %s=%s, or %s=true",
		what, deadline, left.Round(time.Second), d.Source, pod.Name, pod.Namespace, extend, value, annotationKey(policy.AnnotationKeep))
	return true
}

// openWindow starts an interval at whose end the groups are reported. r.mu is held.
func (r *Reporter) openWindow() {
	end := make(chan struct{})
	r.windowEnd = end
	timer := r.clock.NewTimer(r.interval)
	go func() {
		defer timer.Stop()
		select {
		case <-timer.C():
			r.flushWindow(end)
		case <-end:
		}
	}()
}

// Flush reports every pending group now; on shutdown, so that none is lost.
func (r *Reporter) Flush() { r.flushWindow(nil) }

// flushWindow reports the pending groups and closes the window: the one that
// end belongs to, or with end nil whichever is open.
func (r *Reporter) flushWindow(end chan struct{}) {
	r.flushing.Lock()
	defer r.flushing.Unlock()
	r.mu.Lock()
	if end != nil && r.windowEnd != end {
		r.mu.Unlock()
		return // that window was flushed already
	}
	groups := r.groups
	r.groups = map[groupKey]*removalGroup{}
	if r.windowEnd != nil {
		close(r.windowEnd)
		r.windowEnd = nil
	}
	r.mu.Unlock()
	for _, g := range summaries(groups, r.maxOwnerSummaries) {
		// related is the group's first pod: the events library merges events
		// with the same regarding, related, reason and action into a series
		// that keeps the first note, and each summary's note is news.
		r.eventf(&g.regarding, &g.related, corev1.EventTypeNormal, r.removalReason(), actionVerb(g.action), "%s", g.note(r.dryRun))
		r.logger.V(2).Info("Reported removals in bulk", "regarding", g.regarding.Kind+" "+g.regarding.Namespace+"/"+g.regarding.Name,
			"action", g.action, "count", g.count)
	}
}

func (r *Reporter) removalReason() string {
	if r.dryRun {
		return ReasonWouldRemove
	}
	return ReasonLifetimeExpired
}

// groupKey identifies the removals reported together: those of one owner
// (ownerUID "" for a namespace's) by one action.
type groupKey struct {
	namespace string
	ownerUID  types.UID
	action    policy.Action
}

// ownerOf returns the group of a pod's removal and the object its summary
// regards: the pod's controller, else its first owner, else its namespace.
func ownerOf(pod *corev1.Pod, action policy.Action) (groupKey, corev1.ObjectReference) {
	refs := pod.OwnerReferences
	if len(refs) == 0 {
		return namespaceGroup(pod.Namespace, action)
	}
	owner := refs[0]
	if c := metav1.GetControllerOfNoCopy(pod); c != nil {
		owner = *c
	}
	return groupKey{namespace: pod.Namespace, ownerUID: owner.UID, action: action}, corev1.ObjectReference{
		APIVersion: owner.APIVersion, Kind: owner.Kind, Name: owner.Name, UID: owner.UID, Namespace: pod.Namespace}
}

// namespaceGroup is the group of a namespace's removals. Its summary regards
// the Namespace and is stored in it, where the namespace's users read events.
func namespaceGroup(ns string, action policy.Action) (groupKey, corev1.ObjectReference) {
	return groupKey{namespace: ns, action: action}, corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: ns, Namespace: ns}
}

func podReference(pod *corev1.Pod) corev1.ObjectReference {
	return corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
}

// removalGroup counts removals reported by one summary event.
type removalGroup struct {
	action    policy.Action
	regarding corev1.ObjectReference
	related   corev1.ObjectReference
	count     int
	// earliest and latest deadline, the deadlines' sources (at most 3) and
	// the first pods' names (at most summaryNames).
	earliest, latest time.Time
	sources          []string
	names            []string
}

func (g *removalGroup) add(name string, d policy.Decision) {
	g.merge(&removalGroup{count: 1, earliest: d.Deadline, latest: d.Deadline, sources: []string{d.Source}, names: []string{name}})
}

func (g *removalGroup) merge(o *removalGroup) {
	if g.count == 0 || o.earliest.Before(g.earliest) {
		g.earliest = o.earliest
	}
	if o.latest.After(g.latest) {
		g.latest = o.latest
	}
	g.count += o.count
	for _, s := range o.sources {
		if len(g.sources) < 3 && !slices.Contains(g.sources, s) {
			g.sources = append(g.sources, s)
		}
	}
	g.names = append(g.names, o.names[:min(len(o.names), summaryNames-len(g.names))]...)
}

// note says what happened to the group's pods, with as many of their names
// as fit in the note.
func (g *removalGroup) note(dryRun bool) string {
	pods, their := "pods", "their deadlines "+g.earliest.UTC().Format(time.RFC3339)+" to "+g.latest.UTC().Format(time.RFC3339)
	if g.count == 1 {
		pods = "pod"
	}
	if g.latest.Equal(g.earliest) {
		their = "their deadline " + g.earliest.UTC().Format(time.RFC3339)
		if g.count == 1 {
			their = "its deadline " + g.earliest.UTC().Format(time.RFC3339)
		}
	}
	sources := strings.Join(g.sources, ", ")
	head := fmt.Sprintf("%s %d %s at %s (%s)", capitalize(pastTense(g.action)), g.count, pods, their, sources)
	if dryRun {
		head = fmt.Sprintf("Dry run: would %s %d %s, %s (%s) passed", g.action, g.count, pods, their, sources)
	}
	more := func(n int) string {
		if n == 0 {
			return ""
		}
		return fmt.Sprintf(" and %d more", n)
	}
	length, shown := len(head)+1, 0 // ":"
	for _, name := range g.names {
		if length+2+len(name)+len(more(g.count-shown-1)) > NoteLimit {
			break
		}
		length += 2 + len(name) // " name" or ", name"
		shown++
	}
	if shown == 0 {
		return head
	}
	return head + ": " + strings.Join(g.names[:shown], ", ") + more(g.count-shown)
}

// summaries orders the groups for reporting: the maxOwners owners with the
// most removals first, each on its own; the other owners' removals are
// reported with their namespace's.
func summaries(groups map[groupKey]*removalGroup, maxOwners int) []*removalGroup {
	var owners []*removalGroup
	namespaces := map[groupKey]*removalGroup{}
	for key, g := range groups {
		if key.ownerUID == "" {
			namespaces[key] = g
		} else {
			owners = append(owners, g)
		}
	}
	byCountThenName := func(a, b *removalGroup) int {
		return cmp.Or(cmp.Compare(b.count, a.count), cmp.Compare(a.regarding.Namespace, b.regarding.Namespace),
			cmp.Compare(a.regarding.Name, b.regarding.Name), cmp.Compare(a.regarding.UID, b.regarding.UID), cmp.Compare(a.action, b.action))
	}
	slices.SortFunc(owners, byCountThenName)
	if len(owners) > maxOwners {
		for _, g := range owners[maxOwners:] {
			key, regarding := namespaceGroup(g.regarding.Namespace, g.action)
			ns := namespaces[key]
			if ns == nil {
				ns = &removalGroup{action: g.action, regarding: regarding, related: g.related}
				namespaces[key] = ns
			}
			ns.merge(g)
		}
		owners = owners[:maxOwners]
	}
	rest := make([]*removalGroup, 0, len(namespaces))
	for _, g := range namespaces {
		rest = append(rest, g)
	}
	slices.SortFunc(rest, byCountThenName)
	return append(owners, rest...)
}

func actionVerb(a policy.Action) string {
	if a == policy.ActionEvict {
		return "Evict"
	}
	return "Delete"
}

func pastTense(a policy.Action) string {
	if a == policy.ActionEvict {
		return "evicted"
	}
	return "deleted"
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// CutNote cuts a note to what the events API stores.
func CutNote(s string) string { return cutString(s, NoteLimit) }

// cutString cuts s to at most limit bytes, at a UTF-8 character boundary,
// ending in the truncated marker.
func cutString(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	return cutPrefix(s, limit-len(truncated)) + truncated
}

// cutPrefix returns the longest prefix of s of at most limit bytes that ends
// at a UTF-8 character boundary.
func cutPrefix(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	n := max(limit, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
