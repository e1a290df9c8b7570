// Package redecide schedules the re-decisions of whole namespaces: the pods
// of a namespace whose tenant policies or labels changed are decided again.
// It promises three things. A namespace is pending at most once, however many
// changes arrive (they coalesce), and two passes over one namespace start at
// least the interval apart. Its pods are handed to the controller's queue
// only while that queue has room, so that keys that are due (and pod events)
// never wait behind a namespace's backlog. Namespaces take their turns in
// the order their passes may start.
package redecide

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// backstop is how often a feed waiting for room looks again without a Wake.
const backstop = 100 * time.Millisecond

// Namespaces feeds the pods of namespaces to be decided again to the
// controller's queue. Safe for concurrent use; Run feeds.
type Namespaces struct {
	clock    clock.PassiveClock
	interval time.Duration
	podsOf   func(namespace string) []string
	add      func(podKey string)
	room     func() bool

	mu sync.Mutex
	// pending is when each pending namespace's pass may start.
	pending map[string]time.Time
	// last is when each namespace's last pass started (for the interval).
	last    map[string]time.Time
	feeding string
	passes  int
	signal  chan struct{}
}

// New returns the Namespaces that hands the pod keys podsOf lists to add,
// while room says the queue has room, one pass per namespace per interval
// (0: passes as soon as the last one is done).
func New(clk clock.PassiveClock, interval time.Duration, podsOf func(namespace string) []string, add func(podKey string), room func() bool) *Namespaces {
	return &Namespaces{
		clock: clk, interval: interval, podsOf: podsOf, add: add, room: room,
		pending: map[string]time.Time{}, last: map[string]time.Time{}, signal: make(chan struct{}, 1),
	}
}

// Add marks namespace's pods to be decided again; a namespace already
// pending stays pending once.
func (n *Namespaces) Add(namespace string) {
	n.mu.Lock()
	if _, ok := n.pending[namespace]; !ok {
		start := n.clock.Now()
		if last, ok := n.last[namespace]; ok && last.Add(n.interval).After(start) {
			start = last.Add(n.interval)
		}
		n.pending[namespace] = start
	}
	n.mu.Unlock()
	n.Wake()
}

// Wake tells Run that the queue may have room, or a pass may start now
// (after a step of a test's clock).
func (n *Namespaces) Wake() {
	select {
	case n.signal <- struct{}{}:
	default:
	}
}

// Idle says that no pass may start now and none is being fed.
func (n *Namespaces) Idle() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	ns, _ := n.nextLocked()
	return n.feeding == "" && ns == ""
}

// Passes is how many passes have started.
func (n *Namespaces) Passes() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.passes
}

// Pending is how many namespaces wait for a pass.
func (n *Namespaces) Pending() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.pending)
}

// nextLocked is the namespace whose pass may start now (the earliest), or
// "" and how long until the earliest may (0: none pending); n.mu is held.
func (n *Namespaces) nextLocked() (string, time.Duration) {
	now := n.clock.Now()
	var best string
	var bestAt time.Time
	for ns, at := range n.pending {
		if best == "" || at.Before(bestAt) || (at.Equal(bestAt) && ns < best) {
			best, bestAt = ns, at
		}
	}
	if best == "" {
		return "", 0
	}
	if wait := bestAt.Sub(now); wait > 0 {
		return "", wait
	}
	return best, 0
}

// Run feeds passes until ctx is done.
func (n *Namespaces) Run(ctx context.Context) {
	for ctx.Err() == nil {
		n.mu.Lock()
		ns, wait := n.nextLocked()
		if ns != "" {
			delete(n.pending, ns)
			n.last[ns] = n.clock.Now()
			n.feeding = ns
			n.passes++
		}
		n.pruneLocked()
		n.mu.Unlock()
		if ns == "" {
			n.sleep(ctx, wait)
			continue
		}
		n.feed(ctx, ns)
		n.mu.Lock()
		n.feeding = ""
		n.mu.Unlock()
	}
}

// feed hands the pods of namespace to the queue, each once there is room.
func (n *Namespaces) feed(ctx context.Context, namespace string) {
	for _, key := range n.podsOf(namespace) {
		for !n.room() {
			if !n.sleep(ctx, backstop) {
				return
			}
		}
		n.add(key)
	}
}

// sleep waits for a Wake, wait (0: no time) or ctx; false when ctx is
// done. wait is measured in real time: the clock is the process's steady
// clock, or a test's, whose steps come with a Wake.
func (n *Namespaces) sleep(ctx context.Context, wait time.Duration) bool {
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-n.signal:
	case <-timeout:
	}
	return true
}

// pruneLocked forgets the passes older than the interval: they hold no
// later pass back; n.mu is held.
func (n *Namespaces) pruneLocked() {
	if len(n.last) < 1024 {
		return
	}
	now := n.clock.Now()
	for ns, at := range n.last {
		if !at.Add(n.interval).After(now) {
			delete(n.last, ns)
		}
	}
}
