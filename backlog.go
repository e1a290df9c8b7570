package main

import (
	"container/heap"
	"math"
	"time"

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
// pods: the order is then by deadline, not by the order the initial list
// returned the pods in. The pod states (podstate.go) keep the backlog and
// hand out its slots.

// firstPassHold is the longest the backlog is held at a start: a first pass
// of 150,000 pods takes about a second on two cores.
const firstPassHold = time.Second

// earliestWake is the earliest wake-up time an entry holds (a parked key's, a backlog entry's deadline): Unix seconds
// cannot say earlier ones (292 billion years ago), which they are moved to.
var earliestWake = time.Unix(math.MinInt64, 0)

// backlogEntry is a due pod waiting for a removal slot.
type backlogEntry struct {
	key cache.ObjectName
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

// backlog is the heap of due pods waiting for a slot, with the order in
// which they came to wait.
type backlog struct {
	heap backlogHeap
	seq  uint64 // pods that came to wait so far
}

// add puts the pod of key, due at due, in the backlog.
func (b *backlog) add(key cache.ObjectName, due time.Time) *backlogEntry {
	b.seq++
	e := &backlogEntry{key: key, seq: b.seq}
	e.setDue(due)
	heap.Push(&b.heap, e)
	return e
}

// move gives e a new deadline.
func (b *backlog) move(e *backlogEntry, due time.Time) {
	e.setDue(due)
	heap.Fix(&b.heap, int(e.index))
}

// remove takes e out of the backlog.
func (b *backlog) remove(e *backlogEntry) { heap.Remove(&b.heap, int(e.index)) }

// pop takes the most overdue pod out of the backlog.
func (b *backlog) pop() *backlogEntry { return heap.Pop(&b.heap).(*backlogEntry) }

// len is the number of pods waiting.
func (b *backlog) len() int { return b.heap.Len() }
