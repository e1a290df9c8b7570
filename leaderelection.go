package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// leaseConfig is the Lease that replicas elect their leader on (--leader-elect-*).
type leaseConfig struct {
	name, namespace                      string // namespace "" means ownNamespace
	duration, renewDeadline, retryPeriod time.Duration
}

// runAsLeader runs work only while this process holds the lease. On ctx
// cancellation work finishes first, then the lease is released; a lease lost
// for any other reason ends the process with status 1. Work that ends by
// itself while leading (a start that failed: an error, or none) gives up the
// lease: it is released, so that another replica takes over, and
// runAsLeader returns work's error (errControllerStopped for none). setLeader
// is told whenever this process becomes or stops being the leader.
func runAsLeader(ctx context.Context, lease leaseConfig, client kubernetes.Interface, setLeader func(bool),
	watchdog *leaderelection.HealthzAdaptor, work func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	hostname, _ := os.Hostname()
	id := hostname + "_" + uuid.NewString()
	ns := lease.namespace
	if ns == "" {
		ns = ownNamespace()
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: lease.name, Namespace: ns},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}

	leCtx, cancelLE := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelLE()
	var (
		started      atomic.Bool
		gaveUp       atomic.Bool // work ended while leading: the lease is released on purpose
		workErr      error
		workFinished = make(chan struct{})
	)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   lease.duration,
		RenewDeadline:   lease.renewDeadline,
		RetryPeriod:     lease.retryPeriod,
		ReleaseOnCancel: true,
		Name:            controllerName,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				started.Store(true)
				defer close(workFinished)
				setLeader(true)
				logger.Info("Became the leader", "lease", klog.KRef(ns, lease.name), "identity", id)
				workCtx, cancel := context.WithCancel(ctx)
				stop := context.AfterFunc(leading, cancel)
				defer stop()
				workErr = work(workCtx)
				if ctx.Err() != nil || leading.Err() != nil {
					return
				}
				if workErr == nil {
					workErr = errControllerStopped
				}
				gaveUp.Store(true)
				setLeader(false)
				logger.Error(workErr, "The controller stopped while leading, giving up the leader lease", "lease", klog.KRef(ns, lease.name))
				cancelLE()
			},
			OnStoppedLeading: func() {
				setLeader(false)
				if ctx.Err() == nil && !gaveUp.Load() {
					logger.Error(nil, "Lost the leader lease, exiting", "lease", klog.KRef(ns, lease.name))
					klog.FlushAndExit(klog.ExitFlushTimeout, 1)
				}
				logger.Info("Released the leader lease")
			},
			OnNewLeader: func(identity string) {
				if identity != id {
					logger.Info("Another replica is the leader", "identity", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	logger.Info("Waiting to become the leader", "lease", klog.KRef(ns, lease.name), "identity", id)
	go func() {
		<-ctx.Done()
		if started.Load() {
			<-workFinished // let removals in flight finish before the lease is released
		}
		cancelLE()
	}()
	elector.Run(leCtx)
	if started.Load() {
		<-workFinished
		return workErr
	}
	return nil
}

// errControllerStopped is the error of a controller that stopped with none
// before its context ended.
var errControllerStopped = errors.New("the controller stopped before its context ended")

// ownNamespace is the namespace podjanitor runs in, else kube-system.
func ownNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return metav1.NamespaceSystem
}
