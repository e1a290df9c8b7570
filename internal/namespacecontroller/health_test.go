package namespacecontroller

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	testingclock "k8s.io/utils/clock/testing"
)

// TestWatchHealth proves that the namespace watch counts as failing from a
// request that fails until one succeeds, on the metric and in check, and
// that a request cancelled at shutdown is no failure.
func TestWatchHealth(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	// The gauge podjanitor_namespace_watch_healthy as the daemon sets it
	// (metrics.SetNamespaceWatchHealthy).
	var gauge atomic.Value
	h := NewWatchHealth(klog.Background(), clk, func(ok bool) { gauge.Store(map[bool]float64{true: 1, false: 0}[ok]) })
	healthy := func() float64 { return gauge.Load().(float64) }
	if h.Check() != nil || healthy() != 1 {
		t.Fatalf("new: check %v, gauge %v; want healthy", h.Check(), healthy())
	}
	h.Observe(nil)
	h.Observe(context.Canceled)
	if h.Check() != nil || healthy() != 1 {
		t.Errorf("after a success and a cancelled request: check %v, gauge %v; want healthy", h.Check(), healthy())
	}
	h.Observe(apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "", errors.New("RBAC")))
	clk.Step(time.Minute)
	h.Observe(errors.New("connection refused"))
	err := h.Check()
	if err == nil || !strings.Contains(err.Error(), "since 2026-11-29T12:00:00Z") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("failing: check = %v, want the time of the first failure and the last error", err)
	}
	if healthy() != 0 {
		t.Errorf("failing: gauge %v, want 0", healthy())
	}
	h.Observe(nil)
	if h.Check() != nil || healthy() != 1 {
		t.Errorf("recovered: check %v, gauge %v; want healthy", h.Check(), healthy())
	}
	var none *WatchHealth
	none.Observe(errors.New("x"))
	if none.Check() != nil {
		t.Error("a nil WatchHealth must report healthy")
	}
}
