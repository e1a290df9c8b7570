package tenant

import (
	"context"
	"sync"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// DefaultStatusInterval is the least time between two status writes of one
// tenant policy.
const DefaultStatusInterval = 10 * time.Second

// StatusWriter writes the status of tenant policies at a bounded rate: Mark
// asks for a write of a policy's status, and marks coalesce; a policy's
// status is written at most once per interval, however often it is marked
// (once per pod event, say), and a mark is never lost: it is written at the
// end of the interval at the latest.
type StatusWriter struct {
	clock    clock.Clock
	interval time.Duration
	// write writes the policy's status as it is now (it reads it itself,
	// when called); an error marks the policy again.
	write func(ctx context.Context, policyKey string) error

	queue workqueue.TypedDelayingInterface[string]
	mu    sync.Mutex
	last  map[string]time.Time // policy key → when its status was last written
	// pending are the keys marked and not yet taken by the writer.
	pending map[string]bool
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
		last:    map[string]time.Time{},
		pending: map[string]bool{},
	}
}

// Mark asks for a write of the policy's status: now if none was written in
// the last interval, else at the end of it.
func (w *StatusWriter) Mark(policyKey string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending[policyKey] {
		return
	}
	w.pending[policyKey] = true
	wait := time.Duration(0)
	if last, ok := w.last[policyKey]; ok {
		wait = last.Add(w.interval).Sub(w.clock.Now())
	}
	w.queue.AddAfter(policyKey, max(wait, 0))
}

// Forget drops what the writer knows of a deleted policy. A mark still
// pending is written (write finds the policy gone and does nothing).
func (w *StatusWriter) Forget(policyKey string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, policyKey)
}

// Run writes until ctx is cancelled.
func (w *StatusWriter) Run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	for {
		key, shutdown := w.queue.Get()
		if shutdown {
			return
		}
		w.mu.Lock()
		delete(w.pending, key)
		w.last[key] = w.clock.Now()
		w.mu.Unlock()
		if err := w.write(ctx, key); err != nil && ctx.Err() == nil {
			utilruntime.HandleErrorWithContext(ctx, err, "Writing the status of a tenant policy failed, will retry", "policy", key)
			w.Mark(key)
		}
		w.queue.Done(key)
	}
}
