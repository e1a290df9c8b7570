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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// leaseConfig is the Lease that replicas elect their leader on (--leader-elect-*).
type leaseConfig struct {
	name, namespace                      string // namespace "" means ownNamespace
	duration, renewDeadline, retryPeriod time.Duration
	// identity is this process's in the Lease; "": its hostname and a
	// UUID (tests name replicas).
	identity string
}

// runAsLeader runs work only while this process holds the lease. On ctx
// cancellation work finishes first, then the lease is released. Work that
// ends by itself while leading (a start that failed: an error, or none)
// gives up the lease: it is released, so that another replica takes over,
// and runAsLeader returns work's error (errControllerStopped for none). A
// lease lost for any other reason (not renewed within the renew deadline,
// or taken by another) stops work and returns errLeaseLost, once work has
// finished and the lease is released: the process exits 1, its events
// flushed. gate (nil: one of its own) opens removals while the lease is
// renewed (removalGate); watchdog (nil: none) is /healthz's check of the
// renewals. setLeader is told whenever this process becomes or stops being
// the leader.
func runAsLeader(ctx context.Context, lease leaseConfig, client kubernetes.Interface, gate *removalGate, setLeader func(bool),
	watchdog *leaderelection.HealthzAdaptor, work func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	id := lease.identity
	if id == "" {
		hostname, _ := os.Hostname()
		id = hostname + "_" + uuid.NewString()
	}
	ns := lease.namespace
	if ns == "" {
		ns = ownNamespace()
	}
	if gate == nil {
		gate = newRemovalGate(clock.RealClock{}, lease)
	}
	lock := &gatedLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: lease.name, Namespace: ns},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}, gate: gate}

	leCtx, cancelLE := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelLE()
	var (
		started      atomic.Bool
		gaveUp       atomic.Bool // work ended while leading: the lease is released on purpose
		workErr      error
		workFinished = make(chan struct{})
	)
	// The lease is released here, not by client-go (ReleaseOnCancel), which
	// releases it as soon as a renewal fails, before work has stopped.
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: lease.duration,
		RenewDeadline: lease.renewDeadline,
		RetryPeriod:   lease.retryPeriod,
		Name:          controllerName,
		WatchDog:      watchdog,
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
			OnStoppedLeading: func() { setLeader(false) },
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
	if watchdog != nil {
		watchdog.SetLeaderElection(elector) // what client-go's RunOrDie does
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
	if !started.Load() {
		return nil
	}
	lost := ctx.Err() == nil && !gaveUp.Load()
	if lost {
		gate.close()
		logger.Error(nil, "Lost the leader lease, stopping", "lease", klog.KRef(ns, lease.name))
	}
	<-workFinished // its removals in flight end before the lease can expire (removalGate)
	switch released, err := releaseLease(ctx, lock, lease.renewDeadline); {
	case err != nil:
		logger.Error(err, "Releasing the leader lease", "lease", klog.KRef(ns, lease.name))
	case released:
		logger.Info("Released the leader lease")
	}
	if lost {
		return errLeaseLost
	}
	return workErr
}

// errLeaseLost is the error of a leader whose lease was not renewed in time
// or was taken by another.
var errLeaseLost = errors.New("lost the leader lease")

// releaseLease gives up the Lease if this process holds it, within timeout,
// as client-go's release does: a Lease that names no holder and lasts 1 s.
// It reports whether it did.
func releaseLease(ctx context.Context, lock resourcelock.Interface, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	for {
		held, _, err := lock.Get(ctx)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if held.HolderIdentity != lock.Identity() {
			return false, nil
		}
		now := metav1.Now()
		err = lock.Update(ctx, resourcelock.LeaderElectionRecord{
			LeaderTransitions: held.LeaderTransitions, LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now})
		if !apierrors.IsConflict(err) { // the record's annotations written meanwhile
			return err == nil, err
		}
	}
}

// removalGate says whether this process may start a removal now: only
// while it holds the Lease as no other replica can take it. A removal may
// start until the renew deadline after the last renewal that succeeded,
// counted from when that renewal was sent, which no other replica sees
// before it was sent: another takes the Lease only once it has seen no
// renewal for the lease duration, on its own clock. The removal's call must
// end halfway between the renew deadline and the lease duration (its
// timeout). A leader that sees the Lease held by another, or gone, starts
// no removal until it renews it again; one that cannot tell when the last
// leader stopped (it created the Lease again after one it had read was
// deleted, or found itself named its holder) starts none for the lease
// duration, by when the last leader's calls have ended.
type removalGate struct {
	clock                   clock.PassiveClock
	renewDeadline, duration time.Duration
	open                    atomic.Pointer[removalWindow] // nil: closed
}

// removalWindow is when removals may start (from until until) and when
// their calls must have ended.
type removalWindow struct{ from, until, callsEndBy time.Time }

func newRemovalGate(clk clock.PassiveClock, lease leaseConfig) *removalGate {
	return &removalGate{clock: clk, renewDeadline: lease.renewDeadline, duration: lease.duration}
}

// mayRemove reports whether a removal may start now and how long its call
// may take, or else how long until one may (0: not known, until a renewal).
func (g *removalGate) mayRemove() (time.Duration, bool) {
	w := g.open.Load()
	if w == nil {
		return 0, false
	}
	now := g.clock.Now()
	switch {
	case now.Before(w.from):
		return w.from.Sub(now), false
	case !now.Before(w.until):
		return 0, false
	}
	return w.callsEndBy.Sub(now), true
}

// renewed opens the gate for a renewal sent at sent; from is the earliest
// a removal may start.
func (g *removalGate) renewed(sent, from time.Time) {
	g.open.Store(&removalWindow{from: from, until: sent.Add(g.renewDeadline), callsEndBy: sent.Add((g.renewDeadline + g.duration) / 2)})
}

func (g *removalGate) close() { g.open.Store(nil) }

// gatedLock is the Lease's lock, which keeps the removal gate: each write
// that names this process the holder opens it, from when it was sent (the
// start of its RenewTime's second: see write); a
// read that finds another holder, or no Lease, closes it, and so does the
// release.
type gatedLock struct {
	resourcelock.Interface
	gate *removalGate
	// wall is the clock of the records' RenewTime (client-go's; nil: the
	// real one).
	wall clock.PassiveClock
	// Only the elector's goroutine calls the lock.
	held     bool      // this process wrote the last record it saw naming it
	read     bool      // a read found a Lease
	vanished bool      // then one found none: whoever held it may go on
	handedAt time.Time // zero, or when a read found this process named holder by another
	from     time.Time // the earliest a removal may start while held
}

func (l *gatedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	switch {
	case apierrors.IsNotFound(err):
		l.gate.close()
		l.vanished = l.read
	case err != nil:
	case r.HolderIdentity != l.Identity():
		l.gate.close()
		l.held, l.read, l.vanished = false, true, false
	case !l.held && l.handedAt.IsZero():
		l.read, l.handedAt = true, l.gate.clock.Now()
	default:
		l.read = true
	}
	return r, raw, err
}

func (l *gatedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, r, l.Interface.Create)
}

func (l *gatedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, r, l.Interface.Update)
}

func (l *gatedLock) write(ctx context.Context, r resourcelock.LeaderElectionRecord, write func(context.Context, resourcelock.LeaderElectionRecord) error) error {
	if r.HolderIdentity != l.Identity() { // the release
		l.gate.close()
		l.held = false
		return write(ctx, r)
	}
	sent, wallSent := l.gate.clock.Now(), time.Now()
	if l.wall != nil {
		wallSent = l.wall.Now()
	}
	if err := write(ctx, r); err != nil {
		return err
	}
	// Another replica tells renewals apart by their record, whose RenewTime
	// it reads in whole seconds: it may count this renewal from the first
	// of its second, sent up to a second earlier (with a retry period
	// under 1 s).
	renewed := sent.Add(-max(0, wallSent.Sub(r.RenewTime.Truncate(time.Second))))
	if !l.held {
		l.from = sent
		if l.vanished || !l.handedAt.IsZero() {
			l.from = sent.Add(l.gate.duration)
		}
		l.held, l.vanished, l.handedAt = true, false, time.Time{}
	}
	l.gate.renewed(renewed, l.from)
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
