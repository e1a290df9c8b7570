// Command podjanitor removes Kubernetes pods whose lifetime is over, exactly when
// it is over. See README.md.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/apiclock"
	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/metrics"
	"github.com/podjanitor/podjanitor/internal/namespacecontroller"
	"github.com/podjanitor/podjanitor/internal/removalerrors"
	"github.com/podjanitor/podjanitor/internal/served"
	"github.com/podjanitor/podjanitor/policy"
	"github.com/podjanitor/podjanitor/signals"
)

func main() {
	args := os.Args[1:]
	var code int
	if len(args) > 0 && args[0] == "plan" {
		code = runPlan(args[1:])
	} else {
		code = runDaemon(args)
	}
	klog.Flush()
	os.Exit(code)
}

func runDaemon(args []string) int {
	o, code, done := parseCommand(daemonCommand, args)
	if done {
		return code
	}
	if o.loggingFormat == loggingJSON {
		klog.SetLoggerWithOptions(newJSONLogger(os.Stderr, o.verbosity), klog.ContextualLogger(true))
	}
	ctx := signals.SetupSignalHandler()
	logger := klog.FromContext(ctx)
	if err := daemon(ctx, o); err != nil {
		logger.Error(err, "podjanitor failed")
		return 1
	}
	logger.Info("Stopped cleanly")
	return 0
}

// daemon runs the controller until ctx is cancelled. An error that ends the
// controller (a start that failed) ends daemon too, and is returned: the
// process exits 1.
func daemon(ctx context.Context, o *flagValues) error {
	logger := klog.FromContext(ctx)
	applyRuntimeDefaults(logger)
	evaluator, policyData, err := loadEvaluator(o.configFile, o.scope.annotationPrefix)
	if err != nil {
		return err
	}
	meters := metrics.New(controllerName, version, commit)
	meters.RegisterClientMetrics()
	leaderelection.SetProvider(meters.LeaderElectionProvider())
	clients, err := connect(logger, o.cluster, removalerrors.WithoutDisruptionBudgetRetryAfter)
	if err != nil {
		return err
	}
	// Deadlines are compared in the API server's time, as its responses tell it.
	clk, apiClk := clients.clock, clients.apiClock

	// The endpoints serve before the first request to the API server, which
	// may wait out client-go's 30 s dial timeout (a new node whose Service
	// rules are not written yet): the kubelet's liveness probe must not
	// restart a process that waits. /readyz fails until the caches sync.
	var watchdog *leaderelection.HealthzAdaptor
	if o.leaderElect {
		watchdog = leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	}
	namespaceWatch := namespacecontroller.NewWatchHealth(logger, clk, meters.SetNamespaceWatchHealthy)
	podWatch := newPodWatchHealth(logger, clk, meters.SetPodWatchHealthy)
	var leading atomic.Bool
	ready := func() error {
		if err := namespaceWatch.Check(); err != nil {
			return err
		}
		if err := podWatch.check(); err != nil {
			return err
		}
		return leaderWorking(leading.Load(), meters.WorkersRunning())
	}
	var informersSynced atomic.Pointer[func() bool] // set once the informers exist
	synced := func() bool {
		f := informersSynced.Load()
		return f != nil && (*f)()
	}
	serveErr := make(chan error, 2)
	if err := serveEndpoints(ctx, o.endpoints.reviewedBy(clients.config), meters, watchdog, synced, ready, serveErr); err != nil {
		return err
	}

	if err := checkAPIServer(logger, clients.kube.Discovery(), o.tenants.enabled); err != nil {
		return err
	}
	apiClk.Subscribe(meters.SetClockOffset)
	logger.Info("Starting podjanitor", "version", version, "apiServer", clients.config.Host,
		"namespace", cmp.Or(o.scope.namespace, "<all>"), "labelSelector", o.scope.labelSelector, "config", o.configFile, "dryRun", o.dryRun)
	recording, err := events.StartPipeline(ctx, clients.config, controllerName)
	if err != nil {
		return err
	}
	defer recording.Shutdown()

	factory := informerFactory(clients.informerKube, o.scope, podWatch)
	podInformer := factory.Core().V1().Pods()
	namespaceInformer, err := newNamespaceInformer(clients.metadata, o.scope, namespaceWatch)
	if err != nil {
		return err
	}
	jobInformer, err := newJobInformer(ctx, clients.metadata, o.scope)
	if err != nil {
		return err
	}
	podSelector, err := labels.Parse(o.scope.labelSelector) // validated with the flags
	if err != nil {
		return err
	}
	var gate *removalGate
	var mayRemove func() (time.Duration, bool)
	if o.leaderElect {
		gate = newRemovalGate(clk, o.lease)
		mayRemove = gate.mayRemove
	}
	controller, err := NewController(ctx, podInformer, namespaceInformer, clients.kube, recording.Recorder(), clk, Options{
		Evaluator:            evaluator,
		DryRun:               o.dryRun,
		FreshPods:            clients.informerKube.CoreV1(),
		NoRemovalEvents:      !o.removalEvents,
		RemovalNotice:        o.removalNotice,
		MaxRemovalsPerSecond: o.maxRemovalsPerSecond,
		RemovalBurst:         o.removalBurst,
		ShutdownTimeout:      o.shutdownTimeout,
		WriteTimeout:         o.writeTimeout,
		ClockOffset:          apiClk.Offset,
		SleepFine:            apiclock.SleepFine,
		Metrics:              meters,
		PodSelector:          podSelector,
		RedecisionInterval:   o.redecisionInterval,
		Waves:                o.waves.options(clients.kube, o.lease),
		Scope: decisionScope{Namespace: o.scope.namespace, LabelSelector: o.scope.labelSelector, TenantPolicies: o.tenants.enabled,
			Tenant: newTenantScope(o.tenants.restrictions, o.tenants.limits)},
		MayRemove: mayRemove,
		Jobs:      jobInformer,
	})
	if err != nil {
		return err
	}
	apiClk.Subscribe(func(time.Duration) { controller.ClockOffsetChanged() })
	if o.leaderElect {
		controller.Standby() // no key kept until it leads
	}
	tenantsSynced, err := startTenantPolicies(ctx, controller, clients, o)
	if err != nil {
		return err
	}
	defer func() { // before the pipeline shuts down: removals reported in bulk, and time for them to be queued
		controller.FlushEvents()
		recording.Drain()
	}()
	if o.configFile != "" {
		go watchPolicyFile(ctx, o.configFile, policyData, policyEvaluator(o.scope.annotationPrefix), func(e *policy.Evaluator, err error) {
			if err == nil {
				if err := controller.SetEvaluator(e); err != nil {
					logger.Error(err, "Re-evaluating pods after a policy reload", "config", o.configFile)
				}
			}
			meters.PolicyReloaded(err == nil)
		})
	}

	cachesSynced := func() bool {
		return podInformer.Informer().HasSynced() && namespaceInformer.HasSynced() && tenantsSynced()
	}
	informersSynced.Store(&cachesSynced)
	var passes firstPasses
	setLeader := func(b bool) {
		leading.Store(b)
		meters.SetLeader(b)
		if b && o.leaderElect { // a standby's cache synced long ago: its first pass is the takeover's
			go releaseSyncMemory(ctx, meters.WorkersRunning, controller.Pending, passes.begin(logger))
		}
	}

	go apiClk.RunCalibration(ctx, clients.probeClock, controller.RemovalNear)
	// The informers stop when daemon returns, on an error as on a signal:
	// Shutdown waits for them.
	informersCtx, stopInformers := context.WithCancel(ctx)
	factory.Start(informersCtx.Done())
	defer func() {
		stopInformers()
		factory.Shutdown()
	}()
	go namespaceInformer.RunWithContext(informersCtx)
	go jobInformer.RunWithContext(informersCtx) // not awaited: pods are grouped by their Jobs until it syncs
	go releaseSyncMemory(ctx, podInformer.Informer().HasSynced, controller.Pending, passes.begin(logger))

	run := func(ctx context.Context) error { return controller.Run(ctx, o.workers) }
	return untilEndpointFails(ctx, serveErr, func(ctx context.Context) error {
		if o.leaderElect {
			return runAsLeader(ctx, o.lease, clients.kube, gate, setLeader, watchdog, run)
		}
		setLeader(true)
		defer setLeader(false)
		if err := run(ctx); err != nil || ctx.Err() != nil {
			return err
		}
		return errControllerStopped
	})
}

// untilEndpointFails runs work until ctx ends or an HTTP endpoint fails
// (an error on serveErr). A failed endpoint stops work and is the error
// returned, so that the process exits non-zero and is restarted rather
// than running on without its probes or metrics.
func untilEndpointFails(ctx context.Context, serveErr <-chan error, work func(context.Context) error) error {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var failed atomic.Pointer[error]
	go func() {
		select {
		case err := <-serveErr:
			if err != nil {
				klog.FromContext(ctx).Error(err, "HTTP endpoint failed, stopping")
				failed.Store(&err)
				cancel(err)
			}
		case <-runCtx.Done():
		}
	}()
	err := work(runCtx)
	if p := failed.Load(); p != nil {
		return errors.Join(*p, err)
	}
	return err
}

// leaderWorking fails while this process leads (or runs without leader
// election) and its controller's workers do not run: its caches have not
// synced yet, or its start failed and it is about to exit.
func leaderWorking(leading, workersRunning bool) error {
	if leading && !workersRunning {
		return errors.New("leading, but the controller's workers are not running")
	}
	return nil
}

// startTenantPolicies makes the controller honour the tenant policies with
// --tenant-policies and starts their informer; synced says when the
// controller's handler has taken its initial list (at once without
// --tenant-policies).
func startTenantPolicies(ctx context.Context, c *Controller, clients *clients, o *flagValues) (synced func() bool, err error) {
	if !o.tenants.enabled {
		return func() bool { return true }, nil
	}
	// Without the CRD the informer would never sync: the controller runs
	// without tenant policies until the API server serves them.
	probe := func(ctx context.Context) error {
		_, err := clients.podjanitor.PodjanitorV1alpha1().PodLifetimePolicies(o.scope.namespace).List(ctx, metav1.ListOptions{Limit: 1})
		return err
	}
	probeErr := probe(ctx)
	if apierrors.IsForbidden(probeErr) {
		return nil, fmt.Errorf("--tenant-policies: podjanitor may not list %s (see its RBAC): %w", policy.TenantKind, probeErr)
	}
	informer := newTenantInformer(clients.podjanitor, o.scope, o.tenants.limits.Bytes)
	tenants, err := c.SetTenantPolicies(ctx, informer, clients.podjanitor, o.tenants.restrictions, 0)
	if err != nil {
		return nil, err
	}
	tenants.SetLimits(o.tenants.limits)
	tenants.SetFinalizer(cmp.Or(o.lease.namespace, ownNamespace()), o.lease.name)
	// The restrictions by what they leave tenants, not by the flags' names:
	// the e2e tests read a log that says "forbidden" as an RBAC error.
	r := o.tenants.restrictions
	klog.FromContext(ctx).Info("Honouring tenant policies", "kind", policy.TenantKind,
		"disallowedClocks", r.ForbiddenClocks, "disallowedActions", r.ForbiddenActions, "runningPods", !r.NoRunningPods, "minAfter", r.MinAfter, "maxAfter", r.MaxAfter)
	if served.Absent(probeErr) {
		return tenants.AwaitAPI(ctx, probe, o.tenants.crdCheckInterval, probeErr), nil
	}
	tenants.Start(ctx)
	return tenants.HasSynced, nil
}
