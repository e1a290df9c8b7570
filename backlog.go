package main

import (
	"container/heap"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// The backlog: due pods waiting for a removal slot under
// --max-deletions-per-second. A due pod takes a token at once when one is
// free and nobody waits; otherwise it waits here, and run hands the slots
// out as the limiter frees them, to the most overdue pod first (the
// earliest deadline; ties in the order they came due). So after a start or
// a takeover over thousands of overdue pods, and while a wave drains,
// the pods that waited longest go first, and a pod that comes due meanwhile
// takes its place by its deadline rather than behind the whole backlog.
//
// At a start the backlog is held while the first pass decides the cached
// pods (holdBacklog, openBacklog): the order is then by deadline, not by the
// order the initial list returned the pods in.

// firstPassHold is the longest the backlog is held at a start: a first pass
// of 150,000 pods takes about a second on two cores.
const firstPassHold = time.Second

// backlogEntry is a due pod waiting for a removal slot.
type backlogEntry struct {
	st *podState
	// dueSec and dueNsec are the pod's deadline in the API server's time;
	// seq is the order in which the pods came to wait.
	dueSec  int64
	seq     uint64
	dueNsec int32
	index   int32 // place in the backlog heap
}

func (e *backlogEntry) setDue(t time.Time) {
	if t.Before(earliestWake) {
		t = earliestWake
	}
	e.dueSec, e.dueNsec = t.Unix(), int32(t.Nanosecond())
}

func (e *backlogEntry) before(o *backlogEntry) bool {
	if e.dueSec != o.dueSec {
		return e.dueSec < o.dueSec
	}
	if e.dueNsec != o.dueNsec {
		return e.dueNsec < o.dueNsec
	}
	return e.seq < o.seq
}

// backlogHeap orders waiting pods, most overdue first.
type backlogHeap []*backlogEntry

func (h backlogHeap) Len() int           { return len(h) }
func (h backlogHeap) Less(i, j int) bool { return h[i].before(h[j]) }
func (h backlogHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = int32(i), int32(j)
}
func (h *backlogHeap) Push(x any) {
	e := x.(*backlogEntry)
	e.index = int32(len(*h))
	*h = append(*h, e)
}
func (h *backlogHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
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
// reserved for it, once it is the most overdue pod and a token is free); or
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
		if free := lim.TokensAt(now) - float64(s.backlog.Len()); free < 1 {
			// Wait until the waiting pods have gone; then look again.
			return slotLater, max(time.Duration((1-free)/float64(lim.Limit())*float64(time.Second)), time.Millisecond)
		}
		m.unpaid = true
		return slotNow, 0
	case m.queued == nil && s.backlog.Len() == 0 && !s.backlogHeld.Load() && lim.TokensAt(now) >= 1:
		lim.ReserveN(now, 1)
		s.dropIfEmpty(st)
		return slotNow, 0
	}
	s.unparkLocked(st)
	if e := m.queued; e != nil { // decided again while waiting
		e.setDue(deadline)
		heap.Fix(&s.backlog, int(e.index))
		return slotQueued, 0
	}
	s.seq++
	e := &backlogEntry{st: st, seq: s.seq}
	e.setDue(deadline)
	heap.Push(&s.backlog, e)
	m.queued = e
	s.reportWaiting()
	if s.backlog.Len() == 1 {
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
	heap.Remove(&s.backlog, int(st.marks.queued.index))
	st.marks.queued = nil
	s.reportWaiting()
}

// grantLocked hands the free removal tokens to the most overdue waiting
// pods, and returns their keys and, while pods still wait, how long until
// the next token is free. Callers hold s.mu.
func (s *podStates) grantLocked() (keys []cache.ObjectName, wait time.Duration, waiting bool) {
	if s.backlog.Len() == 0 || s.backlogHeld.Load() {
		return nil, 0, false
	}
	now := s.clock.Now()
	defer s.reportWaiting()
	for s.backlog.Len() > 0 {
		if free := s.limiter.TokensAt(now); free < 1 {
			wait = time.Duration((1 - free) / float64(s.limiter.Limit()) * float64(time.Second))
			return keys, max(wait, time.Millisecond), true
		}
		e := heap.Pop(&s.backlog).(*backlogEntry)
		m := e.st.marks
		m.queued = nil
		// Reserved now, used when the key comes back (reserve). Should the
		// pod no longer need it then, the token is spent all the same:
		// the limiter takes back no token whose time has passed.
		m.token = s.limiter.ReserveN(now, 1)
		s.tokens++
		keys = append(keys, e.st.key)
	}
	return keys, 0, false
}

// reportWaiting reports the pods waiting for a removal slot: those in the
// backlog and those handed a token not yet used. Callers hold s.mu.
func (s *podStates) reportWaiting() {
	if s.onWaiting != nil {
		s.onWaiting(s.backlog.Len() + s.tokens)
	}
}

// holdBacklog holds the backlog's slots until openBacklog: due pods wait
// in it in deadline order, and none goes, while the first pass decides the
// cached pods.
func (s *podStates) holdBacklog() { s.backlogHeld.Store(true) }

// openBacklog hands out the slots again, most overdue first.
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
	return s.backlog.Len()
}
