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
// out as the limiter frees them, fairly between namespaces: the namespaces
// with waiting pods take turns, a slot each (round-robin, as the API
// server's priority and fairness shares its seats between flows), and
// within a namespace the most overdue pod goes first (the earliest
// deadline; ties in the order they came due). So a namespace with
// thousands of overdue pods takes its share of the cap and no more: another
// namespace's pods wait for their own namespace's turns, at most one slot
// of each other waiting namespace apart. A namespace whose first pod comes
// to wait takes its turn after those that wait already. After a start or a
// takeover over thousands of overdue pods, and while a wave drains, each
// namespace's pods that waited longest go first, and a pod that comes due
// meanwhile takes its place by its deadline rather than behind the whole
// backlog of its namespace.
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
	index   int32             // place in its namespace's heap
	ns      *namespaceBacklog // its namespace's waiting pods
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

// namespaceBacklog is one namespace's waiting pods, most overdue first,
// and its place in the round of namespaces that take turns.
type namespaceBacklog struct {
	name       string
	heap       backlogHeap
	prev, next *namespaceBacklog // the round: a ring
}

// backlog is the due pods waiting for a slot: a heap for each namespace
// with waiting pods, and the round in which the namespaces take turns.
// Memory is an entry for each waiting pod and one for each namespace
// with waiting pods.
type backlog struct {
	namespaces map[string]*namespaceBacklog
	turn       *namespaceBacklog // the namespace whose turn is next; nil when none waits
	pods       int               // pods waiting
	seq        uint64            // pods that came to wait so far
}

// add puts the pod of key, due at due, in the backlog: in its namespace's
// heap, and its namespace last in the round when it is new there.
func (b *backlog) add(key cache.ObjectName, due time.Time) *backlogEntry {
	ns := b.namespaces[key.Namespace]
	if ns == nil {
		if b.namespaces == nil {
			b.namespaces = map[string]*namespaceBacklog{}
		}
		ns = &namespaceBacklog{name: key.Namespace}
		b.namespaces[key.Namespace] = ns
		b.join(ns)
	}
	b.seq++
	e := &backlogEntry{key: key, seq: b.seq, ns: ns}
	e.setDue(due)
	heap.Push(&ns.heap, e)
	b.pods++
	return e
}

// move gives e a new deadline: a new place in its namespace's heap.
func (b *backlog) move(e *backlogEntry, due time.Time) {
	e.setDue(due)
	heap.Fix(&e.ns.heap, int(e.index))
}

// remove takes e out of the backlog, and its namespace out of the round
// when no other pod of it waits.
func (b *backlog) remove(e *backlogEntry) {
	heap.Remove(&e.ns.heap, int(e.index))
	b.pods--
	if e.ns.heap.Len() == 0 {
		b.leave(e.ns)
	}
}

// pop takes the most overdue pod of the namespace whose turn it is out of
// the backlog, and passes the turn to the next namespace.
func (b *backlog) pop() *backlogEntry {
	ns := b.turn
	e := heap.Pop(&ns.heap).(*backlogEntry)
	b.pods--
	b.turn = ns.next
	if ns.heap.Len() == 0 {
		b.leave(ns)
	}
	return e
}

// join puts ns last in the round: just before the namespace whose turn is next.
func (b *backlog) join(ns *namespaceBacklog) {
	if b.turn == nil {
		ns.prev, ns.next, b.turn = ns, ns, ns
		return
	}
	ns.prev, ns.next = b.turn.prev, b.turn
	ns.prev.next, ns.next.prev = ns, ns
}

// leave takes ns, with no pod waiting, out of the round and the backlog.
func (b *backlog) leave(ns *namespaceBacklog) {
	if ns.next == ns {
		b.turn = nil
	} else {
		ns.prev.next, ns.next.prev = ns.next, ns.prev
		if b.turn == ns {
			b.turn = ns.next
		}
	}
	ns.prev, ns.next = nil, nil
	delete(b.namespaces, ns.name)
}

// len is the number of pods waiting.
func (b *backlog) len() int { return b.pods }

// namespaceCount is the number of namespaces with pods waiting.
func (b *backlog) namespaceCount() int { return len(b.namespaces) }
