package namespacecontroller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// WatchHealth follows the list and watch requests of the namespace informer:
// failing from a request that fails until one succeeds. A watch that is slow
// without failing is not seen; removals do not depend on it (they read their namespace: Reader).
// Its methods are safe on a nil *WatchHealth, which follows nothing.
type WatchHealth struct {
	clock  clock.PassiveClock
	logger klog.Logger
	// onChange is called with the new state on every change (the metric).
	onChange func(healthy bool)

	mu      sync.Mutex
	failing bool
	since   time.Time
	err     error
}

func NewWatchHealth(logger klog.Logger, clk clock.PassiveClock, onChange func(healthy bool)) *WatchHealth {
	onChange(true)
	return &WatchHealth{clock: clk, logger: logger, onChange: onChange}
}

// Observe records the outcome of a list or watch request.
func (h *WatchHealth) Observe(err error) {
	if h == nil || errors.Is(err, context.Canceled) {
		return // shutting down
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err != nil && !h.failing:
		h.failing, h.since, h.err = true, h.clock.Now(), err
		h.logger.Info("Namespace watch failing: removals read their namespace from the API server, and wait while it cannot be read", "err", err)
		h.onChange(false)
	case err != nil:
		h.err = err
	case h.failing:
		h.failing = false
		h.logger.Info("Namespace watch recovered", "failedFor", h.clock.Since(h.since).Round(time.Millisecond))
		h.onChange(true)
	}
}

// Check returns nil while the namespace informer's requests succeed, else why not.
func (h *WatchHealth) Check() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing {
		return nil
	}
	return fmt.Errorf("namespace watch failing since %s: %v", h.since.UTC().Format(time.RFC3339), h.err)
}
