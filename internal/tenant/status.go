package tenant

import (
	"context"
	"errors"
	"sync"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// DefaultStatusInterval is the least time between two status writes of one
// tenant policy.
const DefaultStatusInterval = 10 * time.Second

// StatusWriter writes the status of tenant policies at a bounded rate: Add
// tells it of a policy (created or changed) and Mark asks for a write of a
// known policy's status, and marks coalesce; a policy's status is written
// at most once per interval, however often it is marked (once per pod event,
// say), and a mark is never lost: it is written at the end of the interval at
// the latest. Forget drops a deleted policy for good: a later Mark of it (a
// pod decided again after the deletion) is ignored, so the writer keeps
// state for existing policies only, on the leader and on standbys alike.
// Before Run (on a standby) marks are only remembered, one per policy.
type StatusWriter struct {
	clock    clock.Clock
	interval time.Duration
	// write writes the policy's status as it is now (it reads it itself,
	// when called); an error marks the policy again.
	write func(ctx context.Context, policyKey string) error

	queue workqueue.TypedDelayingInterface[string]
	mu    sync.Mutex
	// known are the policies that exist (Add, and no Forget since).
	known map[string]bool
	last  map[string]time.Time // policy key → when its status was last written
	// pending are the keys marked and not yet taken by the writer.
	pending map[string]bool
	// running: Run has queued the pending keys, marks go to the queue.
	running bool
}

// NewStatusWriter makes a writer that calls write at most once per interval
// and policy (interval 0: DefaultStatusInterval).
func NewStatusWriter(clk clock.WithTicker, interval time.Duration, write func(ctx context.Context, policyKey string) error) *StatusWriter {
	if interval <= 0 {
		interval = DefaultStatusInterval
	}
	return &StatusWriter{
		clock:    clk,
		interval: interval,
		write:    write,
		queue: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{
			Name: "podjanitor_tenant_status", Clock: clk}),
		known:   map[string]bool{},
		last:    map[string]time.Time{},
		pending: map[string]bool{},
	}
}

// Add tells the writer that the policy exists (it was created or changed)
// and marks it.
func (w *StatusWriter) Add(policyKey string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.known[policyKey] = true
	w.markLocked(policyKey)
}

// Mark asks for a write of the policy's status: now if none was written in
// the last interval, else at the end of it. A policy not known (never
// added, or forgotten) is not written.
func (w *StatusWriter) Mark(policyKey string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.known[policyKey] {
		w.markLocked(policyKey)
	}
}

// Release writes a known policy's status now, whatever the interval: the
// policy is being deleted, which happens once per policy, and its deletion
// waits on a write (podjanitor's finalizer comes off by one). Its next
// writes keep the interval from this one.
func (w *StatusWriter) Release(policyKey string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.known[policyKey] {
		return
	}
	delete(w.last, policyKey)
	w.pending[policyKey] = true
	if w.running {
		w.queue.Add(policyKey)
	}
}

// markLocked marks a known policy; w.mu is held.
func (w *StatusWriter) markLocked(policyKey string) {
	if w.pending[policyKey] {
		return
	}
	w.pending[policyKey] = true
	if w.running {
		w.enqueueLocked(policyKey)
	}
}

// enqueueLocked queues a pending key for its time; w.mu is held.
func (w *StatusWriter) enqueueLocked(policyKey string) {
	wait := time.Duration(0)
	if last, ok := w.last[policyKey]; ok {
		wait = last.Add(w.interval).Sub(w.clock.Now())
	}
	w.queue.AddAfter(policyKey, max(wait, 0))
}

// Forget drops what the writer knows of a deleted policy; a write still
// queued is not made.
func (w *StatusWriter) Forget(policyKey string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.known, policyKey)
	delete(w.last, policyKey)
	delete(w.pending, policyKey)
}

// Len is how many policies the writer keeps state for.
func (w *StatusWriter) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	keys := map[string]bool{}
	for _, m := range []map[string]bool{w.known, w.pending} {
		for k := range m {
			keys[k] = true
		}
	}
	for k := range w.last {
		keys[k] = true
	}
	return len(keys)
}

// ErrNotYet is what a write returns when the status may not be written yet
// and whoever made it so marks the policy again: the write is not counted
// against the interval, and not retried.
var ErrNotYet = errors.New("the status may not be written yet")

// Run writes until ctx is cancelled. Its first writes wait until ready is
// closed (the pods decided once, so that the first status has the real
// figures), one interval at most; nil ready: no wait.
func (w *StatusWriter) Run(ctx context.Context, ready <-chan struct{}) {
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	if ready != nil {
		timer := w.clock.NewTimer(w.interval)
		select {
		case <-ready:
		case <-timer.C():
		case <-ctx.Done():
		}
		timer.Stop()
	}
	w.mu.Lock()
	w.running = true
	for key := range w.pending {
		w.enqueueLocked(key)
	}
	w.mu.Unlock()
	for {
		key, shutdown := w.queue.Get()
		if shutdown {
			return
		}
		w.mu.Lock()
		known := w.known[key] && w.pending[key]
		prev, hadPrev := w.last[key]
		if known && hadPrev && w.clock.Since(prev) < w.interval {
			// Queued for an earlier time than the key has now (a write since,
			// or one answered ErrNotYet, took it from the queue sooner).
			w.enqueueLocked(key)
			known = false
		} else {
			delete(w.pending, key)
		}
		if known {
			w.last[key] = w.clock.Now()
		}
		w.mu.Unlock()
		if known {
			switch err := w.write(ctx, key); {
			case errors.Is(err, ErrNotYet):
				// Not written: the interval runs from the last write, and a
				// mark made during the write, queued behind this one, comes
				// forward to it.
				w.mu.Lock()
				if _, ok := w.last[key]; ok && hadPrev {
					w.last[key] = prev
				} else if ok {
					delete(w.last, key)
				}
				if w.pending[key] {
					w.enqueueLocked(key)
				}
				w.mu.Unlock()
			case err != nil && ctx.Err() == nil:
				utilruntime.HandleErrorWithContext(ctx, err, "Writing the status of a tenant policy failed, will retry", "policy", key)
				w.Mark(key)
			}
		}
		w.queue.Done(key)
	}
}
