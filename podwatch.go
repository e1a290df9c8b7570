package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// podWatchGrace is how long the pod informer's list and watch requests may
// fail, none succeeding, before the pod watch counts as failing: its
// reflector tries again within 30 s, so that an API server's restart or a
// 429 does not count, while a revoked RBAC rule does.
const podWatchGrace = 2 * time.Minute

// podWatchHealth follows the list and watch requests of the pod informer:
// failing once they have failed for podWatchGrace, none succeeding, until
// one succeeds. While it fails no new pod, and no change of a pod, is seen:
// none is removed but those already known. A request is made when a watch
// ends (every 5 to 10 minutes), so a rule revoked under an open watch is
// seen within that time and the grace.
type podWatchHealth struct {
	clock  clock.PassiveClock
	logger klog.Logger
	// onChange is told each change of failing (the metric).
	onChange func(healthy bool)

	mu      sync.Mutex
	since   time.Time // of the first failure of those in a row; zero: the last succeeded
	err     error     // the last failure's
	failing bool      // since over podWatchGrace ago, as last told onChange
}

func newPodWatchHealth(logger klog.Logger, clk clock.PassiveClock, onChange func(healthy bool)) *podWatchHealth {
	onChange(true)
	return &podWatchHealth{clock: clk, logger: logger, onChange: onChange}
}

// observe records the outcome of a list or watch request.
func (h *podWatchHealth) observe(err error) {
	if h == nil || errors.Is(err, context.Canceled) {
		return // shutting down
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		if h.failing {
			h.logger.Info("Pod watch recovered", "failedFor", h.clock.Since(h.since).Round(time.Millisecond))
			h.failing = false
			h.onChange(true)
		}
		h.since, h.err = time.Time{}, nil
		return
	}
	if h.since.IsZero() {
		h.since = h.clock.Now()
	}
	h.err = err
	h.update()
}

// update turns failing on once the failures have gone on for the grace; h.mu is held.
func (h *podWatchHealth) update() {
	if h.failing || h.since.IsZero() || h.clock.Since(h.since) < podWatchGrace {
		return
	}
	h.failing = true
	h.logger.Error(h.err, "Pod watch failing: new pods and pod changes are not seen, and no pod is removed but those already known",
		"since", h.since.UTC().Format(time.RFC3339))
	h.onChange(false)
}

// check returns nil unless the pod informer's requests have failed for the
// grace, else why.
func (h *podWatchHealth) check() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.update()
	if !h.failing {
		return nil
	}
	return fmt.Errorf("pod watch failing since %s: %v", h.since.UTC().Format(time.RFC3339), h.err)
}

// newPodInformer is client-go's pod informer of namespace (all: "") with
// resync, indexers, tweak applied to its requests and their outcomes told to health (nil:
// none); client-go's watch error handler would not see them all (not a watch
// the reflector retries, a 429, a refused connection), nor a success.
func newPodInformer(client kubernetes.Interface, namespace string, resync time.Duration, indexers cache.Indexers, tweak func(*metav1.ListOptions),
	health *podWatchHealth) cache.SharedIndexInformer {
	pods := client.CoreV1().Pods(namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, lo metav1.ListOptions) (runtime.Object, error) {
			tweak(&lo)
			list, err := pods.List(ctx, lo)
			health.observe(err)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, lo metav1.ListOptions) (watch.Interface, error) {
			tweak(&lo)
			w, err := pods.Watch(ctx, lo)
			health.observe(err)
			return w, err
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{}, resync, indexers)
}
