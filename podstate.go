package main

import (
	"container/heap"
	"context"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/apiclock"
	"github.com/podjanitor/podjanitor/internal/removalerrors"
)

// podStates is everything the controller remembers about individual pods, by
// key: when a parked key is to be handed to the workers again, the removal
// token reserved for a pod that waits for the rate limit, whether the pod was
// removed already, how often its removal was refused, which invalid
// annotation it was warned about, and which deadline it was told of (a
// removal notice). Only pods that need
// one of these have an entry, and forget drops a pod's entry with the pod, so
// memory follows the pods that exist, not the pods seen.
//
// Parked keys wait here rather than in the workqueue's delaying queue, which
// keeps every key until its time even when the pod is gone. run hands each
// key to the workqueue (ready) when its time comes.
type podStates struct {
	clock clock.WithTicker
	// now is the API server's time as estimated (Controller.now): wake-up
	// times are in it, so that parked deadlines follow a corrected estimate
	// of the clock offset (see offsetChanged).
	now func() time.Time
	// onParkedUntilDeadline is called with the number of pods parked
	// untilDeadline (podjanitor_pods_scheduled), whenever it changes.
	onParkedUntilDeadline func(int)
	// onWaiting, when set, is called with the number of pods waiting for
	// a removal slot (the backlog, backlog.go) and the number of namespaces
	// whose pods wait for their turn, whenever they change.
	onWaiting func(pods, namespaces int)
	// limiter caps the removals (--max-deletions-per-second).
	limiter *rate.Limiter
	// backlogHeld holds the backlog's slots during the first pass.
	backlogHeld atomic.Bool
	// sleepFine, when set, sleeps the last apiclock.FineLead before a
	// wake-up, which the clock's timer ends up to a millisecond late; run
	// then sets its timer for FineLead before the wake-up.
	sleepFine func(time.Duration)

	mu            sync.Mutex
	pods          map[cache.ObjectName]*podState
	parked        parkedHeap
	untilDeadline int           // parked entries whose parking is untilDeadline
	tokens        int           // removal tokens handed out (grantLocked) and not yet used or given back
	backlog       backlog       // due pods waiting for a removal slot, namespaces in turn (backlog.go)
	wake          chan struct{} // the earliest wake-up time changed
	// waiting is set while run is blocked with its timer armed for the
	// earliest entry, so tests with a fake clock know when to step it.
	waiting bool
}

type podState struct {
	key cache.ObjectName
	// wakeSec and wakeNsec are when the key goes back to the workqueue, in
	// the API server's time: Unix seconds and nanoseconds, which hold any
	// time without wrapping (Unix nanoseconds wrap after 2262; see setWake).
	wakeSec int64
	// marks is what the controller remembers about the pod besides parking;
	// nil for most pods, which are only parked: an entry is 64 bytes then.
	marks    *podMarks
	wakeNsec int32
	// index is the entry's place in the heap, -1 when not parked.
	index   int32
	parking parking // why it is parked
}

// parking says why a key is parked: its pod is not due yet, or it is due and
// waits its turn. Only the former are "scheduled" in the metric's sense.
type parking bool

const (
	// untilDeadline: the pod is not due yet; it counts in
	// podjanitor_pods_scheduled.
	untilDeadline parking = true
	// untilRetry: the pod is due and waits for a removal token or for a
	// refusal's backoff.
	untilRetry parking = false
)

// setWake sets the entry's wake-up time to t.
func (st *podState) setWake(t time.Time) {
	if t.Before(earliestWake) {
		t = earliestWake
	}
	st.wakeSec, st.wakeNsec = t.Unix(), int32(t.Nanosecond())
}

// wakeTime is the entry's wake-up time.
func (st *podState) wakeTime() time.Time { return time.Unix(st.wakeSec, int64(st.wakeNsec)) }

// wakesBefore orders entries by wake-up time.
func (st *podState) wakesBefore(o *podState) bool {
	return st.wakeSec < o.wakeSec || st.wakeSec == o.wakeSec && st.wakeNsec < o.wakeNsec
}

type podMarks struct {
	// uid is the pod the marks are about; a new pod under the same name
	// starts afresh.
	uid types.UID
	// token is a removal reserved from the rate limiter and not yet used.
	token    *rate.Reservation
	refusals int    // removals refused in a row for a reason retrying soon cannot fix
	warned   uint64 // hash of the invalid annotation and value the pod was warned about; 0: none
	removed  bool   // removed (or reported removed in dry-run): no second API call
	// reported has a bit for each kind of refusal (removalerrors.Refusals) the pod
	// was reported for: one event per pod and kind.
	reported uint8
	// unpaid marks a retry of a refused removal under way without a token:
	// it pays for one only if the API server does not refuse it (charge).
	unpaid bool
	// queued is the pod's place in the backlog while it waits for a slot.
	queued *backlogEntry
	// noticed is the deadline the pod was told of (--removal-notice:
	// noticeOnce); zero: none.
	noticed time.Time
}

func (m *podMarks) empty() bool {
	return m.token == nil && m.queued == nil && !m.removed && m.reported == 0 && !m.unpaid && m.refusals == 0 && m.warned == 0 && m.noticed.IsZero()
}

func newPodStates(clk clock.WithTicker, now func() time.Time, onParkedUntilDeadline func(int)) *podStates {
	if onParkedUntilDeadline == nil {
		onParkedUntilDeadline = func(int) {}
	}
	return &podStates{
		clock:                 clk,
		now:                   now,
		onParkedUntilDeadline: onParkedUntilDeadline,
		pods:                  map[cache.ObjectName]*podState{},
		wake:                  make(chan struct{}, 1),
	}
}

// get returns the entry for key and its marks for uid, creating them, or
// resetting the marks when they belonged to an earlier pod of the same name.
// Callers hold s.mu.
func (s *podStates) get(key cache.ObjectName, uid types.UID) (*podState, *podMarks) {
	st := s.pods[key]
	if st == nil {
		st = &podState{key: key, index: -1}
		s.pods[key] = st
	}
	switch {
	case st.marks == nil:
		st.marks = &podMarks{uid: uid}
	case st.marks.uid != uid:
		s.cancelToken(st)
		s.dequeue(st)
		*st.marks = podMarks{uid: uid}
	}
	return st, st.marks
}

// dropIfEmpty deletes marks, and an entry, that no longer hold anything.
// Callers hold s.mu.
func (s *podStates) dropIfEmpty(st *podState) {
	if st.marks != nil && st.marks.empty() {
		st.marks = nil
	}
	if st.index < 0 && st.marks == nil {
		delete(s.pods, st.key)
	}
}

// maxPark is the longest a key stays parked: a pod whose deadline is further
// away (an expires-at of 9999-12-31, a ttl of centuries) is decided again
// after a day and parked again. No wake-up time is then more than a day
// ahead of the clock that set it.
const maxPark = 24 * time.Hour

// park hands key back to the workqueue after d, or after maxPark when d is
// longer; why says whether the pod is not due yet (untilDeadline) or waits
// its turn (untilRetry). Parking a parked key moves it.
func (s *podStates) park(key cache.ObjectName, d time.Duration, why parking) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.pods[key]
	if st == nil {
		st = &podState{key: key, index: -1}
		s.pods[key] = st
	}
	s.dequeue(st) // parked, it does not wait for a slot
	s.setParking(st, why)
	st.setWake(s.now().Add(min(max(d, 0), maxPark))) // Add saturates at the last time.Time, never wraps
	if st.index >= 0 {
		heap.Fix(&s.parked, int(st.index))
	} else {
		heap.Push(&s.parked, st)
	}
	if st.index == 0 {
		s.signal()
	}
}

// unpark takes key out of the heap, if it is there, and gives back a removal
// token it holds: the pod was decided again and is neither waiting for its
// deadline nor for a token.
func (s *podStates) unpark(key cache.ObjectName) { s.release(key, keepMarks) }

// forget drops everything about a pod that is gone.
func (s *podStates) forget(key cache.ObjectName) { s.release(key, dropEntry) }

// afterRelease says what release does with the rest of a key's entry.
type afterRelease bool

const (
	keepMarks afterRelease = false // keep what is remembered about the pod (unpark)
	dropEntry afterRelease = true  // drop the whole entry: the pod is gone (forget)
)

// release unparks key and gives back its token, then keeps its marks or
// drops the whole entry (then).
func (s *podStates) release(key cache.ObjectName, then afterRelease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.pods[key]
	if st == nil {
		return
	}
	s.unparkLocked(st)
	s.cancelToken(st)
	s.dequeue(st)
	if then == dropEntry {
		delete(s.pods, key)
	} else {
		s.dropIfEmpty(st)
	}
}

func (s *podStates) unparkLocked(st *podState) {
	if st.index >= 0 {
		heap.Remove(&s.parked, int(st.index))
	}
	s.setParking(st, untilRetry)
}

// setParking records why st is parked, and counts the entries parked
// untilDeadline.
func (s *podStates) setParking(st *podState, why parking) {
	if st.parking == why {
		return
	}
	st.parking = why
	if why == untilDeadline {
		s.untilDeadline++
	} else {
		s.untilDeadline--
	}
	s.onParkedUntilDeadline(s.untilDeadline)
}

// charge makes a retry of a refused removal pay for its token (see reserve),
// once the API server has answered anything but a refusal. The token may be
// one that another removal took meanwhile: the limiter then owes it, and
// the next removals wait for it.
func (s *podStates) charge(key cache.ObjectName, uid types.UID, limiter *rate.Limiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.pods[key]
	if st == nil || st.marks == nil || st.marks.uid != uid || !st.marks.unpaid {
		return
	}
	st.marks.unpaid = false
	limiter.ReserveN(s.clock.Now(), 1)
	s.dropIfEmpty(st)
}

// cancelToken gives an unused reservation back to the limiter. Callers hold s.mu.
func (s *podStates) cancelToken(st *podState) {
	if st.marks != nil && st.marks.token != nil {
		st.marks.token.CancelAt(s.clock.Now())
		st.marks.token = nil
		s.tokens--
		s.reportWaiting()
	}
}

// markRemoved records that the pod was removed (or reported in dry-run).
func (s *podStates) markRemoved(key cache.ObjectName, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, m := s.get(key, uid)
	m.removed, m.reported, m.refusals, m.unpaid = true, 0, 0, false
}

// wasRemoved reports whether this pod (same UID) was removed already.
func (s *podStates) wasRemoved(key cache.ObjectName, uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.pods[key]
	return st != nil && st.marks != nil && st.marks.uid == uid && st.marks.removed
}

// warnOnce records that the pod is warned about the value of an annotation
// that does not parse, and says whether that is news: the first warning for
// this pod and value. The entry keeps a hash of the two, ~8 bytes, until the
// pod is gone.
func (s *podStates) warnOnce(key cache.ObjectName, uid types.UID, annotation, value string) (first bool) {
	h := fnv.New64a()
	for _, v := range []string{annotation, value} {
		h.Write([]byte(v))
		h.Write([]byte{0})
	}
	sum := h.Sum64()
	s.mu.Lock()
	defer s.mu.Unlock()
	_, m := s.get(key, uid)
	first = m.warned != sum
	m.warned = sum
	return first
}

// noticeOnce records that the pod is told it goes at deadline (a removal
// notice), and says whether that is news: the first notice for this pod and
// deadline. A later deadline (a longer ttl) is news again; the entry keeps
// the last one until the pod is gone.
func (s *podStates) noticeOnce(key cache.ObjectName, uid types.UID, deadline time.Time) (first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, m := s.get(key, uid)
	first = !m.noticed.Equal(deadline)
	m.noticed = deadline
	return first
}

// recordRefusal counts a removal refused for a reason that retrying soon
// cannot fix (kind, one of removalerrors.Refusals: a PodDisruptionBudget, an
// admission denial, missing permissions, ...). It returns how long to wait
// before trying again (5 s, doubling up to 5 min) and whether this is the
// first refusal of this kind for this pod, the one to report. A retry that
// was refused again does not pay for its token (reserve).
func (s *podStates) recordRefusal(key cache.ObjectName, uid types.UID, kind string) (retryAfter time.Duration, firstOfKind bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, m := s.get(key, uid)
	m.refusals++
	m.unpaid = false
	if i := slices.Index(removalerrors.Refusals, kind); i >= 0 {
		bit := uint8(1) << i
		firstOfKind = m.reported&bit == 0
		m.reported |= bit
	}
	return refusalBackoff(m.refusals), firstOfKind
}

const (
	refusalBackoffBase = 5 * time.Second
	refusalBackoffMax  = 5 * time.Minute
)

func refusalBackoff(n int) time.Duration {
	d := refusalBackoffBase
	for i := 1; i < n && d < refusalBackoffMax; i++ {
		d *= 2
	}
	return min(d, refusalBackoffMax)
}

// len is the number of pods with an entry (for tests and benchmarks).
func (s *podStates) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pods)
}

// offsetChanged wakes run to time its next wake-up again: the estimate of
// the API server's clock moved, and parked deadlines move with it.
func (s *podStates) offsetChanged() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.signal()
}

// settled reports whether run waits for the clock or a change, with nothing
// it has not looked at yet (for tests that step a fake clock).
func (s *podStates) settled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// signal wakes run. Callers hold s.mu.
func (s *podStates) signal() {
	s.waiting = false
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run hands parked keys to ready when their time comes, and the backlog's
// pods their removal slots as tokens free up, until ctx ends.
func (s *podStates) run(ctx context.Context, ready func(cache.ObjectName)) {
	for {
		due, wait, idle := s.popDue()
		granted, slotWait, waiting := s.grant()
		for _, key := range due {
			ready(key)
		}
		for _, key := range granted {
			ready(key)
		}
		fine := !idle // the wait is for a parked key's time
		if waiting && (idle || slotWait < wait) {
			wait, idle, fine = slotWait, false, false
		}
		if fine && s.sleepFine != nil && wait <= apiclock.FineLead {
			// Not woken by a change meanwhile: a key parked before this
			// one in the next FineLead waits at most that long.
			s.sleepFine(wait)
			continue
		}
		var timer clock.Timer
		var timeout <-chan time.Time
		if !idle {
			if fine && s.sleepFine != nil {
				wait -= apiclock.FineLead
			}
			timer = s.clock.NewTimer(wait)
			timeout = timer.C()
		}
		s.mu.Lock()
		s.waiting = len(s.wake) == 0
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-s.wake:
		case <-timeout:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		s.waiting = false
		s.mu.Unlock()
	}
}

// grant is grantLocked for run.
func (s *podStates) grant() (keys []cache.ObjectName, wait time.Duration, waiting bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grantLocked()
}

// wakesWithin reports whether a parked key is handed back to the workqueue
// within d (or is overdue): a removal may be near.
func (s *podStates) wakesWithin(d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parked.Len() > 0 && s.parked[0].wakeTime().Sub(s.now()) <= d
}

// popDue takes the parked keys whose time has come out of the heap and
// returns them, with how long run may sleep before it looks again: until the
// earliest key left is due, but at most maxPark, so that run looks again
// even should the estimate of the API server's clock move on faster than
// this one without a word. idle says that no key is left.
func (s *podStates) popDue() (due []cache.ObjectName, wait time.Duration, idle bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for s.parked.Len() > 0 {
		st := s.parked[0]
		if wait = st.wakeTime().Sub(now); wait > 0 { // Sub saturates, never wraps
			return due, min(wait, maxPark), false
		}
		heap.Pop(&s.parked)
		s.setParking(st, untilRetry)
		due = append(due, st.key)
		s.dropIfEmpty(st)
	}
	return due, 0, true
}

// parkedHeap orders parked entries by wake-up time.
type parkedHeap []*podState

func (h parkedHeap) Len() int           { return len(h) }
func (h parkedHeap) Less(i, j int) bool { return h[i].wakesBefore(h[j]) }
func (h parkedHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = int32(i), int32(j)
}
func (h *parkedHeap) Push(x any) {
	st := x.(*podState)
	st.index = int32(len(*h))
	*h = append(*h, st)
}
func (h *parkedHeap) Pop() any {
	old := *h
	st := old[len(old)-1]
	old[len(old)-1] = nil
	st.index = -1
	*h = old[:len(old)-1]
	return st
}

// slot says what reserve found for a due pod.
type slot int

const (
	slotNow    slot = iota // remove it now
	slotLater              // try again after the delay reserve returned
	slotQueued             // it waits in the backlog; run hands it its slot
)

// reserve finds a removal slot for a due pod whose deadline is deadline,
// under the limiter's cap. It returns slotNow when the pod may go now;
// slotQueued when it waits in the backlog (its key comes back, with a token
// reserved for it, once it is its namespace's turn, it is the most overdue
// pod of its namespace and a token is free); or
// slotLater with how long to wait.
//
// A pod whose last removal was refused (a PodDisruptionBudget, an admission
// denial, ...) is retried outside the backlog: it goes only when a token is
// free now that no waiting pod needs, and pays for it afterwards only if
// the API server did not refuse it again (charge). So refusals that go on
// for ever cost due pods no tokens, and a refused pod whose removal passes
// at last still counts against the cap.
func (s *podStates) reserve(key cache.ObjectName, uid types.UID, deadline time.Time) (slot, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, m := s.get(key, uid)
	now := s.clock.Now()
	lim := s.limiter
	switch {
	case lim.Limit() == rate.Inf:
		s.dropIfEmpty(st)
		return slotNow, 0
	case m.token != nil: // handed out by run
		if delay := m.token.DelayFrom(now); delay > 0 {
			return slotLater, delay
		}
		m.token = nil
		s.tokens--
		s.reportWaiting()
		s.dropIfEmpty(st)
		return slotNow, 0
	case m.refusals > 0:
		if free := lim.TokensAt(now) - float64(s.backlog.len()); free < 1 {
			// Wait until the waiting pods have gone; then look again.
			return slotLater, max(time.Duration((1-free)/float64(lim.Limit())*float64(time.Second)), time.Millisecond)
		}
		m.unpaid = true
		return slotNow, 0
	case m.queued == nil && s.backlog.len() == 0 && !s.backlogHeld.Load() && lim.TokensAt(now) >= 1:
		lim.ReserveN(now, 1)
		s.dropIfEmpty(st)
		return slotNow, 0
	}
	s.unparkLocked(st)
	if e := m.queued; e != nil { // decided again while waiting
		s.backlog.move(e, deadline)
		return slotQueued, 0
	}
	m.queued = s.backlog.add(key, deadline)
	s.reportWaiting()
	if s.backlog.len() == 1 {
		s.signal() // run times the next slot
	}
	return slotQueued, 0
}

// dequeue takes st out of the backlog, if it waits there: its pod is gone,
// or no longer due. Callers hold s.mu.
func (s *podStates) dequeue(st *podState) {
	if st.marks == nil || st.marks.queued == nil {
		return
	}
	s.backlog.remove(st.marks.queued)
	st.marks.queued = nil
	s.reportWaiting()
}

// grantLocked hands the free removal tokens to the waiting pods, one to
// each namespace with waiting pods in turn (the most overdue pod of the
// namespace), and returns their keys and, while pods still wait, how long
// until the next token is free. Callers hold s.mu.
func (s *podStates) grantLocked() (keys []cache.ObjectName, wait time.Duration, waiting bool) {
	if s.backlog.len() == 0 || s.backlogHeld.Load() {
		return nil, 0, false
	}
	now := s.clock.Now()
	defer s.reportWaiting()
	for s.backlog.len() > 0 {
		if free := s.limiter.TokensAt(now); free < 1 {
			wait = time.Duration((1 - free) / float64(s.limiter.Limit()) * float64(time.Second))
			return keys, max(wait, time.Millisecond), true
		}
		e := s.backlog.pop()
		m := s.pods[e.key].marks // an entry in the backlog keeps its pod's
		m.queued = nil
		// Reserved now, used when the key comes back (reserve). Should the
		// pod no longer need it then, the token is spent all the same:
		// the limiter takes back no token whose time has passed.
		m.token = s.limiter.ReserveN(now, 1)
		s.tokens++
		keys = append(keys, e.key)
	}
	return keys, 0, false
}

// reportWaiting reports the pods waiting for a removal slot (those in the
// backlog and those handed a token not yet used) and the namespaces with
// pods in the backlog. Callers hold s.mu.
func (s *podStates) reportWaiting() {
	if s.onWaiting != nil {
		s.onWaiting(s.backlog.len()+s.tokens, s.backlog.namespaceCount())
	}
}

// holdBacklog holds the backlog's slots until openBacklog: due pods wait
// in it in deadline order, and none goes, while the first pass decides the
// cached pods.
func (s *podStates) holdBacklog() { s.backlogHeld.Store(true) }

// openBacklog hands out the slots again.
func (s *podStates) openBacklog() {
	if !s.backlogHeld.Swap(false) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.signal()
}

// backlogIsHeld reports whether holdBacklog holds the slots.
func (s *podStates) backlogIsHeld() bool { return s.backlogHeld.Load() }

// waitingForSlot is the number of pods in the backlog (for tests).
func (s *podStates) waitingForSlot() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backlog.len()
}

// namespacesWaiting is the number of namespaces with pods in the backlog
// (for tests).
func (s *podStates) namespacesWaiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backlog.namespaceCount()
}
