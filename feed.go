package main

import (
	"sync"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// queueFeedLimit is how many keys the workqueue holds while more wait in
// the feed, until Run sets it to twice the workers if that is more: enough
// that a worker never waits for the feed, and more than redecide's room
// (the workers), so that a namespace decided again waits behind them.
const queueFeedLimit = 128

// queueFeed is the way into the workqueue. It adds a key straight to the
// queue while the queue holds fewer than its limit; otherwise it holds the
// key, first in first out, and hands the held keys to the queue as workers
// take keys (drain). Nothing it holds is lost or reordered, and a key held
// twice is held once, as the queue would.
//
// It bounds what client-go's workqueue keeps: the queue's sets and its
// metrics' add times are Go maps, which keep the size of their largest
// content (maps do not shrink), and every cached pod is queued at once in
// the initial list and on a policy reload. What the feed holds is its own,
// dropped when it empties: after the initial list of 10,000 pods the
// queue's maps stay at the limit, not at 10,000 (BENCHMARKS.md, "Memory").
type queueFeed struct {
	queue interface {
		Add(cache.ObjectName)
		Len() int
	}
	// depth is workqueue_depth's gauge: held keys count in the queue's depth;
	// nil without metrics.
	depth workqueue.GaugeMetric

	mu    sync.Mutex
	limit int
	// standby drops every key: a replica that does not lead keeps none, and
	// its start as the leader walks the cache's live pods instead
	// (Controller.Standby).
	standby bool
	held    map[cache.ObjectName]struct{}
	order   []cache.ObjectName // held keys in order, from next
	next    int
}

// Add adds key to the queue, or holds it behind the keys held already.
func (f *queueFeed) Add(key cache.ObjectName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.standby {
		return
	}
	if len(f.held) == 0 && f.queue.Len() < f.limit {
		f.queue.Add(key)
		return
	}
	if _, ok := f.held[key]; ok {
		return
	}
	if f.held == nil {
		f.held = map[cache.ObjectName]struct{}{}
	}
	f.held[key] = struct{}{}
	f.order = append(f.order, key)
	if f.depth != nil {
		f.depth.Inc()
	}
}

// drain hands held keys to the queue while it has room; workers call it for
// each key they take.
func (f *queueFeed) drain() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.next < len(f.order) && f.queue.Len() < f.limit {
		key := f.order[f.next]
		f.order[f.next] = cache.ObjectName{}
		f.next++
		delete(f.held, key)
		if f.depth != nil {
			f.depth.Dec()
		}
		f.queue.Add(key)
	}
	switch {
	case f.next == len(f.order) && f.order != nil:
		f.held, f.order, f.next = nil, nil, 0 // free what the burst took
	case f.next >= 1024 && 2*f.next >= len(f.order):
		// A feed that never empties keeps no more than twice what it holds.
		n := copy(f.order, f.order[f.next:])
		clear(f.order[n:])
		f.order, f.next = f.order[:n], 0
	}
}

// setStandby makes Add drop keys (on) or take them again (off), and reports
// whether it was on.
func (f *queueFeed) setStandby(on bool) (was bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	was, f.standby = f.standby, on
	return was
}

// setLimit sets how many keys the queue holds before the feed holds more.
func (f *queueFeed) setLimit(n int) {
	f.mu.Lock()
	f.limit = n
	f.mu.Unlock()
	f.drain()
}

// Len is the number of keys held.
func (f *queueFeed) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held)
}
