package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/wave"
)

// spreadSettle is how long the pods that a namespace's change (its tenant
// policies, labels or keep) brings forward wait for more such changes
// before they go: one change pushed into many namespaces one after another
// is measured as one (wave.Spread).
const spreadSettle = 2 * time.Second

// spreadWaves holds one change made in many namespaces as one wave: the
// namespaces' and the tenant policies' controllers tell its Spread the
// changes they let through (wave.Options.Spread), the pod controller checks
// due pods against it with its other holds, and run keeps its record on the Lease.
type spreadWaves struct {
	*wave.Spread
	// options are --hold-waves' (read at each use: a test sets its
	// record's client after the controller is made).
	options  *wave.Options
	clock    clock.WithTicker
	reporter *events.Reporter
	// requeue decides a pod again: the held change was approved.
	requeue func(cache.ObjectName)
	// held is told the namespaces of a hold as it starts and as it is
	// approved (their tenant policies' status says so); nil: none.
	held func(namespaces []string)
}

// newSpreadWaves measures the changes of w's namespaces against the
// cluster's threshold, over every pod in pods.
func newSpreadWaves(o *wave.Options, pods cache.Store, w spreadWaves, onHeld func(source string, n int)) *spreadWaves {
	var watched watchedCount
	w.options = o
	w.Spread = wave.NewSpread(o.Threshold, o.Window, spreadSettle, func() int { return watched.get(pods, w.clock.Now()) }, onHeld)
	return &w
}

// watchedCount is the number of pods cached, counted at most once a second
// (a Spread asks at every namespace's change).
type watchedCount struct {
	mu sync.Mutex
	at time.Time
	n  int
}

func (w *watchedCount) get(pods cache.Store, now time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.at.IsZero() || now.Sub(w.at) >= time.Second {
		w.at, w.n = now, len(pods.ListKeys())
	}
	return w.n
}

// run records the Spread's hold on the record Lease, reports it in a
// Warning Event there with the approval command, and takes its approval,
// looking every waveRecordInterval until ctx ends. The approval is used
// once: it comes off the Lease with the hold.
func (w *spreadWaves) run(ctx context.Context) {
	record := w.options.Record
	logger := klog.FromContext(ctx).WithValues("lease", klog.KRef(record.Namespace, record.Name))
	ticker := w.clock.NewTicker(waveRecordInterval)
	defer ticker.Stop()
	published, used := wave.Hold{}, ""
	// stale: the Lease records a hold of an earlier leader, which this
	// one's replaces, or takes off if it holds none (the changes were
	// reverted, or approved, while none ran).
	stale := false
	if record.Client != nil {
		if l, err := record.ReadLease(ctx); err == nil && l != nil {
			_, stale = l.Annotations[wave.AnnotationHeldSpread]
		}
	}
	for {
		h, inHold, held := w.Held()
		switch {
		case held && h != published: // a new hold, or more pods in it
			if err := record.PublishSpread(ctx, &h, inHold, used); err != nil {
				logger.Error(err, "Cannot record the held wave of many namespaces' changes", "change", h.ID)
				break
			}
			first := h.ID != published.ID
			published, used, stale = h, "", false
			if !first {
				break
			}
			if w.held != nil {
				w.held(inHold)
			}
			what := fmt.Sprintf("changes of %d namespaces' tenant policies or labels made together (%s)", len(inHold), wave.SpreadNamespaces(inHold))
			logger.Info("Holding the removals of changes made in many namespaces together: too many pods due at once in all",
				"change", h.ID, "pods", h.Pods, "namespaces", len(inHold), "approve", record.ApproveCommand(h.ID))
			w.reporter.RemovalsHeld(record.Ref(), what, h.Pods, record.ApproveCommand(h.ID))
		case held:
			id, err := record.Approved(ctx)
			if err != nil {
				logger.Error(err, "Cannot read approvals of the held wave of many namespaces' changes", "change", h.ID)
				break
			}
			if id != h.ID {
				break
			}
			keys, ok := w.Approve(id)
			if !ok {
				break
			}
			logger.Info("Wave of many namespaces' changes approved, removing its pods at the removal rate", "change", id, "pods", len(keys))
			w.reporter.RemovalsApproved(record.Ref(), id, len(keys))
			if w.held != nil {
				w.held(inHold)
			}
			for _, k := range keys {
				if name, err := cache.ParseObjectName(k); err == nil {
					w.requeue(name)
				}
			}
			used = id
			fallthrough
		case published.ID != "" || used != "" || stale:
			if _, _, still := w.Held(); still {
				break
			}
			if err := record.PublishSpread(ctx, nil, nil, used); err != nil {
				logger.Error(err, "Cannot record the end of the held wave of many namespaces' changes")
				break
			}
			published, used, stale = wave.Hold{}, "", false
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}
