package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	clientevents "k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/metrics"
	"github.com/podjanitor/podjanitor/internal/namespacecontroller"
	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/internal/redecide"
	"github.com/podjanitor/podjanitor/internal/removalerrors"
	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/tenantcontroller"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned"
	"github.com/podjanitor/podjanitor/policy"
)

// Controller removes pods whose lifetime is over.
//
// Every pod event only enqueues the pod's key. A worker reads the pod from the
// informer cache and asks the policy package for its deadline: a pod with no
// deadline is forgotten, a pod that is not due yet is parked in the queue with
// AddAfter for exactly the time that is left, and a due pod is deleted (or evicted,
// when it is running) with a UID and resourceVersion precondition, so that a pod
// replaced under the same name or changed since the decision is never removed by
// a stale decision. A token bucket caps the removal rate; a key that finds no
// token is parked until one is free, never dropped.
type Controller struct {
	client   kubernetes.Interface
	reporter *events.Reporter
	clock    clock.WithTicker

	// pods is the pod informer's store, indexed by namespace; see
	// podcache.Pod for what it holds. podsSynced: the controller's handler
	// has taken the informer's initial list.
	pods       cache.Indexer
	podsSynced cache.InformerSynced
	// groups are the places of pods under the rules that keep a number of
	// them, ranks the evaluators' view of them (counting.go).
	groups *policy.Groups
	ranks  policy.Ranks
	// jobs is the Job metadata cache (Options.Jobs), nil without it.
	jobs cache.Indexer
	// namespaces is the namespace controller: what the namespace cache
	// knows of a pod's namespace, its warnings and its holds; a namespace
	// change decides its pods again. nsReader reads a due pod's namespace
	// fresh before its removal.
	namespaces namespaces
	nsReader   *namespacecontroller.Reader
	// namespaceCache is the namespace informer's store, for the tenant
	// policy controller.
	namespaceCache cache.Indexer

	// evaluator is swapped when the policy file is reloaded.
	evaluator atomic.Pointer[policy.Evaluator]
	// tenants is the tenant policy controller (SetTenantPolicies); nil
	// when they are not honoured.
	tenants tenantPolicies

	// queue is what the workers read: keys to decide now, and failed keys
	// waiting for their backoff. Keys parked until a deadline or a removal
	// token wait in state instead, which drops them with their pod.
	queue workqueue.TypedRateLimitingInterface[cache.ObjectName]
	// redecide feeds the pods of namespaces to decide again (a tenant
	// policy or the namespace changed) to queue, coalesced, and only while
	// queue holds fewer than room keys: keys that are due go first.
	redecide *redecide.Namespaces
	room     atomic.Int64
	// feed is the way into queue for every key but a failed one's retry:
	// it holds the keys of a burst (the initial list, a policy reload, many
	// pods due at once) until the workers take them, so that the queue
	// never grows to the pod count (queueFeed).
	feed    *queueFeed
	state   *podStates
	limiter *rate.Limiter
	// transform is the pod informer's (podcache.RememberingPodTransform against the
	// cache), for pods read afresh before an eviction.
	transform cache.TransformFunc
	opts      Options
	metrics   *metrics.Metrics
	// waves holds a large wave of a change of the cluster's policy; nil
	// with --hold-waves=false.
	waves *policyWaves
	// holders are the holds a due pod is checked against: the cluster
	// policy's, the namespaces' and the tenant policies', and the spread
	// of changes made in many namespaces (none without --hold-waves).
	holders []holder
	// spread holds a change made in many namespaces; nil without
	// --hold-waves.
	spread *spreadWaves
}

// holder holds the pods that a change waiting for a person's approval made
// due (internal/wave).
type holder interface {
	// CheckPod says whether the due pod is held, and the deadline it had
	// before the change (zero: none).
	CheckPod(key cache.ObjectName, pod *corev1.Pod, now time.Time) (bool, time.Time)
	// ForgetPod drops the pod: it is gone, or not due.
	ForgetPod(key cache.ObjectName)
}

// namespaces is what the pod controller asks of the namespace controller
// (internal/namespacecontroller).
type namespaces interface {
	Info(name string) *policy.Namespace
	WarnOnce(namespace, value string) bool
	HasSynced() bool
	Holds() *wave.Holds
	Lead()
	Resume(ctx context.Context, stored wave.Stored) error
	RunRecord(ctx context.Context)
}

// tenantPolicies is what the pod controller asks of the tenant policy
// controller (internal/tenantcontroller).
type tenantPolicies interface {
	Store() *tenant.Store
	Observe(podKey string, d policy.Decision)
	MarkNamespaces(namespaces []string)
	Confirm(ctx context.Context, d policy.Decision) error
	Sync(namespace string)
	HasSynced() bool
	Holds() *wave.Holds
	Expect(podKeys []string) <-chan struct{}
	RunStatus(ctx context.Context, ready <-chan struct{})
	NamespaceTerminating(namespace string)
}

// transientBackoffMax caps the workqueue's backoff for failed syncs, so that
// pods that came due while the API server was unreachable go within seconds of
// its recovery. Refusals that retrying soon cannot fix wait longer (refusalBackoff).
const transientBackoffMax = 10 * time.Second

// NewController wires the controller to the pod informer and the namespace
// metadata informer. It does not start anything.
func NewController(ctx context.Context, podInformer coreinformers.PodInformer, namespaceInformer cache.SharedIndexInformer,
	client kubernetes.Interface, recorder clientevents.EventRecorder, clk clock.WithTicker, opts Options) (*Controller, error) {
	logger := klog.FromContext(ctx)
	if opts.Evaluator == nil {
		return nil, errors.New("options: an Evaluator is required")
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = 30 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 15 * time.Second
	}
	if opts.FreshPods == nil {
		opts.FreshPods = client.CoreV1()
	}
	if opts.PodSelector == nil {
		opts.PodSelector = labels.Everything()
	}
	if opts.ClockOffset == nil {
		opts.ClockOffset = func() time.Duration { return 0 }
	}
	if _, ok := podInformer.Informer().GetIndexer().GetIndexers()[cache.NamespaceIndex]; !ok {
		return nil, errors.New("the pod informer has no namespace index")
	}
	limit, burst := rate.Inf, opts.RemovalBurst
	if opts.MaxRemovalsPerSecond > 0 {
		limit = rate.Limit(opts.MaxRemovalsPerSecond)
		burst = max(burst, 1)
	}
	c := &Controller{
		client:   client,
		reporter: events.NewReporter(logger, recorder, clk, opts.DryRun, opts.NoRemovalEvents),
		clock:    clk,
		pods:     podInformer.Informer().GetIndexer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[cache.ObjectName](10*time.Millisecond, transientBackoffMax),
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{
				Name: controllerName, Clock: clk, MetricsProvider: opts.Metrics.WorkqueueProvider()},
		),
		limiter: rate.NewLimiter(limit, burst),
		// Against the cache's version, as the informer's own transform: a pod read
		// afresh keeps the status time of the cached version with the same clocks.
		transform: podcache.RememberingPodTransform(strings.TrimSuffix(opts.Evaluator.AnnotationKey(""), "/"), podInformer.Informer().GetIndexer()),
		opts:      opts,
		metrics:   opts.Metrics,
	}
	c.feed = &queueFeed{queue: c.queue, depth: opts.Metrics.WorkqueueDepth(controllerName), limit: queueFeedLimit}
	c.reporter.OnWarningDropped(opts.Metrics.CountWarningDropped)
	c.nsReader = namespacecontroller.NewReader(client, clk, opts.WriteTimeout)
	c.state = newPodStates(clk, c.now, opts.Metrics.SetPodsParked)
	c.state.sleepFine = opts.SleepFine
	c.state.limiter = c.limiter
	c.state.onWaiting = func(pods, namespaces int) {
		opts.Metrics.SetRemovalsWaiting(pods, namespaces, opts.MaxRemovalsPerSecond)
	}
	c.room.Store(math.MaxInt64) // until Run: as many as there are
	c.redecide = redecide.New(clk, opts.RedecisionInterval, func(namespace string) []string {
		if c.tenants != nil {
			c.tenants.Sync(namespace) // a namespace's tenant changes take effect at its pass
		}
		return c.namespacePodKeys(namespace)
	}, c.enqueueKey,
		func() bool { return int64(c.queue.Len()) < c.room.Load() })
	c.ranks = c.newRanks()
	if opts.Jobs != nil {
		if err := c.watchJobs(opts.Jobs); err != nil {
			return nil, fmt.Errorf("adding job event handler: %w", err)
		}
	}
	opts.Evaluator = c.withRanks(opts.Evaluator)
	c.opts.Evaluator = opts.Evaluator
	c.evaluator.Store(opts.Evaluator)
	if opts.Waves != nil {
		// One Spread for the namespaces' and the tenant policies' changes
		// (their controllers get it with the options), checked with the
		// other holds.
		w := *opts.Waves
		c.spread = newSpreadWaves(&w, c.pods, spreadWaves{clock: clk, reporter: c.reporter, requeue: c.feed.Add}, opts.Metrics.SetPodsHeld)
		w.Spread = c.spread.Spread
		opts.Waves, c.opts.Waves = &w, &w
		c.holders = append(c.holders, c.spread)
	}
	if w := opts.Waves; w != nil {
		c.waves = newPolicyWaves(w, opts.Evaluator, policyWaves{
			pods: c.pods, decider: c.decider, evaluator: c.evaluator.Load, now: c.now,
			clock: clk, reporter: c.reporter, requeue: c.feed.Add,
			decideWith: func(e *policy.Evaluator, pod *corev1.Pod, now time.Time) (policy.Decision, error) {
				return e.Decide(pod, c.namespaces.Info(pod.Namespace), now)
			},
			scope: opts.scope(),
		}, opts.Metrics.SetPodsHeld)
		c.holders = append(c.holders, c.waves)
	}
	ns, err := namespacecontroller.New(ctx, namespaceInformer, namespacecontroller.Config{
		Pods: c.pods, Decide: c.namespaceDecider, Now: c.now, Clock: clk, Reporter: c.reporter,
		Waves: opts.Waves, OnHeld: opts.Metrics.SetPodsHeld,
		Redecide: c.enqueueNamespace, Requeue: c.feed.Add,
		Terminating: c.tenantNamespaceTerminating,
		ConfigMaps:  client.CoreV1(),
	})
	if err != nil {
		return nil, err
	}
	c.namespaces, c.namespaceCache = ns, namespaceInformer.GetIndexer()
	go ns.Run(ctx)
	if h := ns.Holds(); h != nil {
		c.holders = append(c.holders, h)
	}
	// The workers wait for the handlers' registrations, not the informers:
	// an informer has synced once its cache holds the initial list, its
	// handlers may still be taking it (client-go's HasSynced says so).
	podHandler, err := podInformer.Informer().AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueue,
		UpdateFunc: func(old, cur interface{}) {
			oldMeta, err1 := meta.Accessor(old)
			curMeta, err2 := meta.Accessor(cur)
			if err1 != nil || err2 != nil || oldMeta.GetResourceVersion() != curMeta.GetResourceVersion() {
				c.enqueue(cur)
			}
		},
		DeleteFunc: func(obj interface{}) {
			c.unplace(obj)
			c.enqueue(obj)
		},
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding pod event handler: %w", err)
	}
	c.podsSynced = podHandler.HasSynced
	return c, nil
}

// Pending is the number of keys ready for a worker (parked keys not counted).
func (c *Controller) Pending() int { return c.queue.Len() + c.feed.Len() }

// Standby makes the controller keep no pod key until Run: a replica that
// waits for the lease would otherwise hold the key of every pod the cluster
// ever had (no worker takes them, and a deleted pod's key stays), and its
// takeover would walk them all. Run, once the caches have synced, feeds the
// keys of the cached pods, the live ones. Call it before the informers start.
func (c *Controller) Standby() { c.feed.setStandby(true) }

// FlushEvents records the removals held back for bulk events now; on
// shutdown, so that none is lost.
func (c *Controller) FlushEvents() { c.reporter.Flush() }

// enqueue adds the key of a pod, or of a deleted pod's tombstone.
func (c *Controller) enqueue(obj interface{}) {
	key, err := cache.DeletionHandlingObjectToName(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.feed.Add(key)
}

// enqueueNamespace decides every cached pod of namespace again: the
// namespace is marked for c.redecide, which feeds its pods to the queue
// after the keys already there, at most once per RedecisionInterval
// however many changes come.
func (c *Controller) enqueueNamespace(namespace string) { c.redecide.Add(namespace) }

// namespacePodKeys lists the keys of namespace's cached pods (the index).
func (c *Controller) namespacePodKeys(namespace string) []string {
	keys, err := c.pods.IndexKeys(cache.NamespaceIndex, namespace)
	if err != nil {
		utilruntime.HandleError(err)
	}
	return keys
}

// enqueueKey adds a pod key as the cache writes it.
func (c *Controller) enqueueKey(key string) {
	name, err := cache.ParseObjectName(key)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.feed.Add(name)
}

// SetTenantPolicies makes the controller honour the tenant policies of
// informer (a PodLifetimePolicy informer of the namespaces it watches),
// under restrictions, writing their status with client at most once per
// statusInterval each: it makes their controller (internal/tenantcontroller),
// whose store the evaluator reads from then on. Call it before Run, and
// before the informer starts.
func (c *Controller) SetTenantPolicies(ctx context.Context, informer cache.SharedIndexInformer, client versioned.Interface,
	r policy.Restrictions, statusInterval time.Duration) (*tenantcontroller.Controller, error) {
	t, err := tenantcontroller.New(ctx, tenantcontroller.Config{
		Informer: informer, Client: client, Restrictions: r, StatusInterval: statusInterval,
		Pods: c.pods, Namespaces: c.namespaceCache, NamespaceInfo: c.namespaces.Info, Evaluator: c.actedEvaluator, Now: c.now, Clock: c.clock,
		WriteTimeout: c.opts.WriteTimeout, Waves: c.opts.Waves, DryRun: c.opts.DryRun,
		Reporter: c.reporter, Metrics: c.metrics, Redecide: c.enqueueNamespace, Requeue: c.feed.Add,
	})
	if err != nil {
		return nil, err
	}
	c.tenants = t
	if h := t.Holds(); h != nil {
		c.holders = append(c.holders, h)
	}
	if c.spread != nil {
		// A tenant policy's change held with other namespaces' says so
		// in its status, which a restart reads as not acted on.
		c.spread.held = t.MarkNamespaces
	}
	e := *c.evaluator.Load()
	e.Tenants = t.Store()
	c.evaluator.Store(&e)
	return t, nil
}

// tenantNamespaceTerminating tells the tenant policies, if honoured, of a
// namespace whose deletion began.
func (c *Controller) tenantNamespaceTerminating(namespace string) {
	if c.tenants != nil {
		c.tenants.NamespaceTerminating(namespace)
	}
}

// SetEvaluator replaces the policy and decides every cached pod again. The
// tenant policies stay. A change whose wave is too large is held first
// (holdWave), before any worker decides by the new policy.
func (c *Controller) SetEvaluator(e *policy.Evaluator) error {
	e = c.withRanks(e)
	if c.tenants != nil {
		copied := *e
		copied.Tenants = c.tenants.Store()
		e = &copied
	}
	if c.waves != nil {
		c.waves.reload(e)
	}
	c.evaluator.Store(e)
	for _, key := range c.pods.ListKeys() {
		name, err := cache.ParseObjectName(key)
		if err != nil {
			return err
		}
		c.feed.Add(name)
	}
	return nil
}

// Run waits for the pod, namespace and tenant policy caches and for the
// controller's handlers to have taken their initial lists, then runs workers until ctx is cancelled. On
// cancellation workers stop taking keys and Run waits up to the shutdown timeout
// for removals in flight; those keep a context of their own until then.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	logger := klog.FromContext(ctx)

	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var wg sync.WaitGroup
	defer func() {
		c.metrics.SetWorkersRunning(false)
		c.queue.ShutDown()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
			logger.Info("All workers finished")
		case <-c.clock.After(c.opts.ShutdownTimeout):
			logger.Info("Shutdown timeout: cancelling removals still in flight", "timeout", c.opts.ShutdownTimeout)
			cancelWork()
			<-done
		}
	}()

	logger.Info("Starting controller", "workers", workers, "dryRun", c.opts.DryRun)
	synced := []cache.InformerSynced{c.podsSynced, c.namespaces.HasSynced}
	if c.tenants != nil {
		synced = append(synced, c.tenants.HasSynced)
	}
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return errors.New("pod, namespace and tenant policy caches did not sync")
	}
	// The leader reports holds in Events, those its start measures too.
	c.namespaces.Lead()
	if c.waves != nil {
		if err := c.startWave(ctx); err != nil {
			return err
		}
	}
	// The first pass decides every cached pod before a removal slot is
	// handed out, so that a backlog goes most overdue first, not in the
	// order the pods were listed; at most firstPassHold, so that a pass
	// that never ends (a queue never empty) holds no removal for long.
	c.state.holdBacklog()
	wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-c.clock.After(firstPassHold):
			c.state.openBacklog()
		}
	})
	if c.feed.setStandby(false) {
		// A new leader's removals start at the cap, not with a burst of
		// their own after the last leader's (docs/operations.md, "What a
		// handover does to the cap").
		if c.limiter.Limit() != rate.Inf {
			c.limiter.ReserveN(c.clock.Now(), c.limiter.Burst())
		}
		// A standby kept no key: every live pod is decided now, the
		// first pass of the takeover.
		for _, key := range c.pods.ListKeys() {
			c.enqueueKey(key)
		}
	}
	if c.Pending() == 0 {
		c.state.openBacklog() // no pod to decide
	}
	wg.Go(func() { c.state.run(ctx, c.feed.Add) })
	c.room.Store(int64(workers))
	c.feed.setLimit(max(queueFeedLimit, 2*workers))
	wg.Go(func() { c.redecide.Run(ctx) })
	if c.waves != nil {
		wg.Go(func() { c.waves.run(ctx) })
		wg.Go(func() { c.namespaces.RunRecord(ctx) })
		wg.Go(func() { c.spread.run(ctx) })
	}
	if c.tenants != nil {
		// The first status writes wait for the pods they count, all
		// decided after this.
		decided := c.tenants.Expect(c.pods.ListKeys())
		wg.Go(func() { c.tenants.RunStatus(ctx, decided) })
	}
	c.metrics.SetMaxConcurrency(workers)
	for range workers {
		wg.Go(func() {
			for c.processNextWorkItem(ctx, workCtx) {
			}
		})
	}
	c.metrics.SetWorkersRunning(true)
	logger.Info("Started workers")
	<-ctx.Done()
	logger.Info("Shutting down workers")
	return nil
}

// processNextWorkItem handles one key and applies the Result table of
// controller-runtime. It returns false when the worker should stop.
func (c *Controller) processNextWorkItem(ctx, workCtx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	// After Done: a key the first pass's end hands a slot to at once (the
	// last one decided) goes to the queue's head, not behind the others.
	defer c.firstPassDone()
	defer c.queue.Done(key)
	c.feed.drain()    // room for a held key
	c.redecide.Wake() // room for a key of a namespace decided again
	if ctx.Err() != nil {
		return false // shutting down: take no new work
	}

	c.metrics.WorkerStarted()
	start := c.clock.Now()
	result, err := c.safeSync(workCtx, key)
	c.metrics.WorkerFinished(c.clock.Since(start))

	logger := klog.FromContext(ctx)
	var retry *retryAfterError
	switch {
	case err != nil && isTerminal(err):
		c.queue.Forget(key)
		c.state.unpark(key)
		c.metrics.Reconciled(metrics.ResultError, true)
		logger.V(2).Info("Leaving pod alone until it changes", "pod", key, "err", events.CutNote(err.Error())) // a bad value can be 256 KiB
	case errors.As(err, &retry):
		c.queue.Forget(key)
		c.state.park(key, retry.after, untilRetry)
		c.metrics.Reconciled(metrics.ResultError, false)
		utilruntime.HandleErrorWithContext(ctx, err, "Syncing pod failed, will retry", "pod", key, "after", retry.after)
	case err != nil:
		c.queue.AddRateLimited(key)
		c.state.unpark(key)
		c.metrics.Reconciled(metrics.ResultError, false)
		utilruntime.HandleErrorWithContext(ctx, err, "Syncing pod failed, will retry", "pod", key, "retries", c.queue.NumRequeues(key))
	case result.queued: // in the backlog: its slot brings the key back
		c.queue.Forget(key)
		c.metrics.Reconciled(metrics.ResultRequeueAfter, false)
	case result.RequeueAfter > 0:
		c.queue.Forget(key)
		c.state.park(key, result.RequeueAfter, result.parking)
		c.metrics.Reconciled(metrics.ResultRequeueAfter, false)
	case result.Requeue:
		c.queue.AddRateLimited(key)
		c.state.unpark(key)
		c.metrics.Reconciled(metrics.ResultRequeue, false)
	default:
		c.queue.Forget(key)
		c.state.unpark(key)
		c.metrics.Reconciled(metrics.ResultSuccess, false)
	}
	return true
}

// firstPassDone opens the backlog held at Run's start once the queue has
// run empty: every cached pod is decided.
func (c *Controller) firstPassDone() {
	if c.state.backlogIsHeld() && c.Pending() == 0 {
		c.state.openBacklog()
	}
}

// safeSync runs syncHandler and turns a panic into a retryable error.
func (c *Controller) safeSync(ctx context.Context, key cache.ObjectName) (result Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.metrics.Panicked()
			err = fmt.Errorf("panic syncing pod %s: %v", key, r)
		}
	}()
	return c.syncHandler(ctx, key)
}

// removalNearHorizon is how far ahead RemovalNear looks: past the next
// calibration and the time one takes.
const removalNearHorizon = 30 * time.Second

// RemovalNear reports whether a parked pod comes due (or a retry comes)
// within removalNearHorizon: the API-server clock estimate is then measured
// again often, so that the pod goes at its deadline, not the allowance for
// this machine's clock running fast later.
func (c *Controller) RemovalNear() bool { return c.state.wakesWithin(removalNearHorizon) }

// ClockOffsetChanged tells the controller that Options.ClockOffset returns a
// new value, so that parked pods wake at their deadlines in the API server's
// time as now estimated.
func (c *Controller) ClockOffsetChanged() { c.state.offsetChanged() }

// now is the API server's current time as this process estimates it:
// creation, finish and transition times are the API server's, so deadlines
// are compared with its clock, not with this process's. c.clock is steady
// (apiclock.ProcessClock): a step of the wall clock moves neither it nor the offset.
func (c *Controller) now() time.Time {
	return c.clock.Now().Add(c.opts.ClockOffset())
}

// syncHandler decides what to do with one pod now.
func (c *Controller) syncHandler(ctx context.Context, key cache.ObjectName) (Result, error) {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "pod", key)
	obj, exists, err := c.pods.GetByKey(key.String())
	if err != nil {
		return Result{}, err
	}
	if !exists {
		logger.V(4).Info("Pod is gone")
		c.place(key, nil, nil, nil)
		c.state.forget(key)
		c.trackTenantDeadline(key, policy.Decision{})
		c.holdWave(logger, key, nil, policy.Decision{}, time.Time{})
		return Result{}, nil
	}
	pod, err := podcache.Pod(obj)
	if err != nil {
		return Result{}, err
	}

	if c.state.wasRemoved(key, pod.UID) {
		logger.V(4).Info("Pod already removed, waiting for the cache to catch up")
		return Result{}, nil
	}

	now := c.now()
	e, ns := c.evaluator.Load(), c.namespaces.Info(pod.Namespace)
	c.place(key, pod, e, ns)
	decision, err := e.Decide(pod, ns, now)
	c.trackTenantDeadline(key, decision)
	if err != nil {
		var invalid *policy.AnnotationError
		if errors.As(err, &invalid) {
			if invalid.Namespace != "" { // one warning per namespace and value, not per pod
				if c.namespaces.WarnOnce(invalid.Namespace, invalid.Value) {
					c.reporter.InvalidNamespaceAnnotation(invalid)
				}
			} else if c.state.warnOnce(key, pod.UID, invalid.Key, invalid.Value) {
				c.reporter.InvalidAnnotation(pod, invalid)
			}
			return Result{}, TerminalError(fmt.Errorf("pod %s: %w", key, err))
		}
		return Result{}, fmt.Errorf("pod %s: %w", key, err)
	}
	if held, result := c.holdWave(logger, key, pod, decision, now); held {
		return result, nil
	}
	if !decision.HasDeadline() {
		logger.V(4).Info("Pod has no deadline", "skipped", decision.Skipped, "kept", decision.Kept)
		return Result{}, nil
	}
	if decision.ClockSkew {
		logger.V(2).Info("Pod's finish time lies in the future, counting from now", "deadline", decision.Deadline)
	}
	if wait := decision.Deadline.Sub(now); wait > 0 {
		logger.V(4).Info("Pod is not due yet", "deadline", decision.Deadline, "wait", wait, "by", decision.Source)
		return c.untilDue(pod, decision, wait), nil
	}
	// The slot first, then the fresh reads: a pod waiting for its slot in
	// a backlog reads its namespace (and tenant policy) once, when it may
	// go, so the reads follow the removal cap, not the backlog's size.
	switch slot, delay := c.state.reserve(key, pod.UID, decision.Deadline); slot {
	case slotQueued:
		logger.V(4).Info("Removal rate limit reached, waiting for a slot, most overdue first", "deadline", decision.Deadline)
		return Result{queued: true}, nil
	case slotLater:
		logger.V(4).Info("Removal rate limit reached, waiting", "delay", delay)
		return Result{RequeueAfter: delay}, nil
	}
	decision, due, result, err := c.decideFresh(ctx, pod, c.now())
	if !due {
		return result, err
	}
	return c.removePod(ctx, pod, decision)
}

// untilDue parks a pod whose deadline d is wait away: until its deadline,
// or, with a removal notice (noticeWait), until the notice is due. Then the
// pod is told once per deadline (a RemovalScheduled event) and parked until
// its deadline: the notice never delays a removal. A pod decided again with
// a later deadline (a longer ttl) is told again; one kept is not decided
// here at all.
func (c *Controller) untilDue(pod *corev1.Pod, d policy.Decision, wait time.Duration) Result {
	notice := c.opts.RemovalNotice
	if d.RemovalNotice > 0 {
		notice = d.RemovalNotice
	}
	if early := noticeWait(wait, notice); early > 0 {
		return Result{RequeueAfter: early, parking: untilDeadline}
	}
	if notice > 0 && c.state.noticeOnce(cache.MetaObjectToName(pod), pod.UID, d.Deadline) {
		c.reporter.RemovalScheduled(pod, d, wait, c.evaluator.Load().AnnotationKey)
	}
	return Result{RequeueAfter: wait, parking: untilDeadline}
}

// noticeWait is how long until the notice of a removal wait away is due,
// notice before it; 0: now, or no notice (notice 0). A pod first seen (or
// given its deadline) less than notice before it is told at once.
func noticeWait(wait, notice time.Duration) time.Duration {
	if notice <= 0 || wait <= notice {
		return 0
	}
	return wait - notice
}

// holdWave asks the holds whether a pod is held: due by the running
// rules, not by the rules acted on, while a change of them waits for
// approval. A held pod waits for the old deadline, if it has one; the
// approval or the revert decides it again. pod nil: the pod is gone.
func (c *Controller) holdWave(logger klog.Logger, key cache.ObjectName, pod *corev1.Pod, d policy.Decision, now time.Time) (bool, Result) {
	if len(c.holders) == 0 {
		return false, Result{}
	}
	if pod == nil || !d.HasDeadline() || d.Deadline.After(now) {
		for _, h := range c.holders {
			h.ForgetPod(key)
		}
		return false, Result{}
	}
	// Each hold that holds the pod says when it would go by the decision
	// it holds back; the pod is decided again at the first of those.
	held, deadline := false, time.Time{}
	for _, h := range c.holders {
		if ok, dl := h.CheckPod(key, pod, now); ok {
			held = true
			if !dl.IsZero() && (deadline.IsZero() || dl.Before(deadline)) {
				deadline = dl
			}
		}
	}
	if !held {
		return false, Result{}
	}
	logger.V(2).Info("Holding pod: a held change of the policy made it due", "oldDeadline", deadline)
	if deadline.IsZero() {
		return true, Result{}
	}
	return true, Result{RequeueAfter: deadline.Sub(now), parking: untilDeadline}
}

// decider decides pods by the rules of e and the running tenant policies,
// for the wave guard.
func (c *Controller) decider(e *policy.Evaluator) wave.Decide {
	return func(pod *corev1.Pod, now time.Time) (policy.Decision, error) {
		running := *c.evaluator.Load()
		running.Policy = e.Policy
		return running.Decide(pod, c.namespaces.Info(pod.Namespace), now)
	}
}

// namespaceDecider decides pods by the rules acted on (actedEvaluator),
// with ns for their namespace, for a wave of a namespace's change.
func (c *Controller) namespaceDecider(ns *policy.Namespace) wave.Decide {
	return func(pod *corev1.Pod, now time.Time) (policy.Decision, error) {
		return c.actedEvaluator().Decide(pod, ns, now)
	}
}

// actedEvaluator is the evaluator of the cluster's rules acted on: the
// running one, but while a change of them is held (policyWaves.acted).
// The waves of the namespaces' and the tenant policies' changes are
// measured by it.
func (c *Controller) actedEvaluator() *policy.Evaluator {
	if c.waves != nil {
		return c.waves.acted()
	}
	return c.evaluator.Load()
}

// startWave measures the start against what the last leader acted on, as
// the record holds it, before any worker decides: the namespace
// changes it held are held again, and the cluster's policy is measured
// against the one recorded (policyWaves.start). The Lease cannot be read:
// the start fails, rather than act on a change it cannot measure. A record
// that does not parse is taken as nothing acted on: the start is measured
// as a first install's, its rules' wave held until approved, and the next
// write of the record replaces it (never a start that fails again and again).
func (c *Controller) startWave(ctx context.Context) error {
	stored, err := c.waves.readRecord(ctx)
	if err != nil {
		return err
	}
	if err := c.namespaces.Resume(ctx, stored); errors.Is(err, wave.ErrBadRecord) {
		klog.FromContext(ctx).Error(err, "The record of what the last leader acted on does not parse: starting as if nothing was acted on (a first install): the pods the rules make due are held until approved on the Lease")
		stored = wave.Stored{}
	} else if err != nil {
		return err
	}
	c.waves.start(ctx, stored)
	return nil
}

// trackTenantDeadline tells the tenant policies' status which policy, if
// any, gives the pod its deadline now.
func (c *Controller) trackTenantDeadline(key cache.ObjectName, d policy.Decision) {
	if c.tenants != nil {
		c.tenants.Observe(key.String(), d)
	}
}

// decideFresh decides once more a pod that the namespace cache made due, on
// its namespace as read from the API server (namespacecontroller.Reader): due says that
// the pod must go now by that read too, and d is then the decision to act on
// (its labels may select another rule). Otherwise result says what to do.
// A failed read is an error: the removal waits, with the workqueue's backoff,
// until the namespace can be read. A fresh read that disagrees with the cache
// (keep, an invalid value, a rule no longer matching) may be the older of the
// two, so the pod is decided again (with backoff) rather than forgotten, until
// the cache agrees; a later deadline parks it until then.
func (c *Controller) decideFresh(ctx context.Context, pod *corev1.Pod, now time.Time) (d policy.Decision, due bool, result Result, err error) {
	ns, err := c.nsReader.Read(ctx, pod.Namespace)
	if err != nil {
		return d, false, Result{}, fmt.Errorf("pod %s/%s is due, reading its namespace before removing it: %w", pod.Namespace, pod.Name, err)
	}
	d, err = c.evaluator.Load().Decide(pod, ns, now)
	switch {
	case err == nil && d.HasDeadline() && !d.Deadline.After(now):
		result, err := c.confirmTenantPolicy(ctx, pod, d)
		return d, err == nil && result == (Result{}), result, err
	case err == nil && d.HasDeadline():
		return d, false, c.untilDue(pod, d, d.Deadline.Sub(now)), nil
	}
	klog.FromContext(ctx).V(2).Info("Not removing pod: its namespace as read now disagrees with the namespace cache, deciding again",
		"pod", klog.KObj(pod), "kept", d.Kept, "err", err)
	return d, false, Result{Requeue: true}, nil
}

// confirmTenantPolicy checks, for a due pod that a tenant policy's rule
// decided, that the policy is still there as it was when it decided, by a
// fresh read (tenantcontroller's Confirm): deleting or changing it cancels its
// deadlines even while its watch lags. The zero Result and a nil error: the
// pod may go (as it may when no tenant policy decided).
func (c *Controller) confirmTenantPolicy(ctx context.Context, pod *corev1.Pod, d policy.Decision) (Result, error) {
	if d.Policy == "" {
		return Result{}, nil
	}
	switch err := c.tenants.Confirm(ctx, d); {
	case errors.Is(err, tenantcontroller.ErrChanged):
		klog.FromContext(ctx).V(2).Info("Not removing pod: its tenant policy as read now is not the one that decided, deciding again",
			"pod", klog.KObj(pod), "policy", d.Policy, "generation", d.PolicyGeneration)
		return Result{Requeue: true}, nil
	case err != nil:
		// As a failed namespace read: the removal waits, with backoff.
		return Result{}, fmt.Errorf("pod %s/%s is due, reading its tenant policy %s before removing it: %w", pod.Namespace, pod.Name, d.Policy, err)
	}
	return Result{}, nil
}

// removePod deletes or evicts a due pod, guarded by the cached UID and
// resourceVersion (in a dry run it only reports), and reports the outcome.
// An eviction is decided again on the pod read from the API server first
// (freshDecision), and guarded by what that read.
func (c *Controller) removePod(ctx context.Context, pod *corev1.Pod, d policy.Decision) (Result, error) {
	if !c.opts.DryRun {
		if d.Action == policy.ActionEvict {
			fresh, freshD, result, err := c.freshDecision(ctx, pod, d)
			if fresh == nil {
				return result, err
			}
			pod, d = fresh, freshD
		}
		if err := c.callRemoval(ctx, pod, d); err != nil {
			var not *mayNotRemove
			if errors.As(err, &not) {
				klog.FromContext(ctx).V(2).Info("Not removing: the leader lease is not renewed, or not yet", "pod", klog.KObj(pod), "retryAfter", not.after)
				if not.after > 0 {
					return Result{RequeueAfter: not.after}, nil
				}
				return Result{Requeue: true}, nil
			}
			return c.removalFailed(ctx, pod, d, err)
		}
	}
	c.recordRemoval(ctx, pod, d)
	return Result{}, nil
}

// freshDecision reads the pod from the API server (not the cache) and
// decides again, just before an eviction. The Eviction API drops the
// client's resourceVersion precondition for a pod that is not Ready when a
// PodDisruptionBudget covers it with healthy pods to spare: EvictionREST.Create
// (k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go, where it sets
// updateDeletionOptions) replaces it with the resourceVersion it read itself.
// An eviction decided on a stale cache could then remove a pod whose keep was
// added a moment ago. So the decision is made again on the fresh pod (as the
// in-tree TTL-after-finished controller reads a Job afresh before deleting
// it), and the eviction carries the fresh pod's UID and resourceVersion: the
// cache can make a removal late, never wrong. A delete needs none of this:
// the API server keeps its precondition, and a 409 decides again.
//
// The fresh pod is read as the pod informer reads pods (Options.FreshPods:
// its lean decoding, in the daemon) and goes through its transform, so that
// the policy reads what it reads of a cached pod. freshDecision returns the
// fresh pod and its decision when the pod is still due; otherwise nil, and what to do
// with the key: a pod no longer due waits for its new deadline; a pod kept,
// without a deadline, replaced, no longer matching --label-selector or with
// annotations that no longer parse is left to the informer, which is bound
// to bring the change. A failed read is sorted like a failed removal: a 404
// is not "gone" (only the informer says that), a 5xx is retried soon.
func (c *Controller) freshDecision(ctx context.Context, cached *corev1.Pod, d policy.Decision) (*corev1.Pod, policy.Decision, Result, error) {
	logger := klog.FromContext(ctx)
	getCtx, cancel := context.WithTimeout(ctx, c.opts.WriteTimeout)
	defer cancel()
	got, err := c.opts.FreshPods.Pods(cached.Namespace).Get(getCtx, cached.Name, metav1.GetOptions{})
	if err != nil {
		result, err := c.removalFailed(ctx, cached, d, fmt.Errorf("reading the pod before its eviction: %w", err))
		return nil, d, result, err
	}
	if got.UID != cached.UID {
		logger.V(2).Info("Pod was replaced since the decision, not evicting", "pod", klog.KObj(cached), "uid", cached.UID, "newUID", got.UID)
		return nil, d, Result{}, nil
	}
	if !c.opts.PodSelector.Matches(labels.Set(got.Labels)) {
		logger.V(2).Info("Pod no longer matches the label selector, not evicting", "pod", klog.KObj(cached), "selector", c.opts.PodSelector.String())
		return nil, d, Result{}, nil
	}
	obj, err := c.transform(got)
	if err != nil {
		return nil, d, Result{}, err
	}
	fresh, err := podcache.Pod(obj)
	if err != nil {
		return nil, d, Result{}, err
	}
	now := c.now()
	freshD, err := c.evaluator.Load().Decide(fresh, c.namespaces.Info(fresh.Namespace), now)
	switch {
	case err != nil:
		logger.V(2).Info("Pod changed since the decision and its annotations do not parse, not evicting", "pod", klog.KObj(cached), "err", events.CutNote(err.Error()))
		return nil, d, Result{}, nil
	case !freshD.HasDeadline():
		logger.V(2).Info("Pod changed since the decision and is not to be removed, not evicting", "pod", klog.KObj(cached),
			"kept", freshD.Kept, "skipped", freshD.Skipped, "resourceVersion", fresh.ResourceVersion)
		return nil, d, Result{}, nil
	case freshD.Deadline.After(now):
		wait := freshD.Deadline.Sub(now)
		logger.V(2).Info("Pod changed since the decision and is not due yet, not evicting", "pod", klog.KObj(cached),
			"deadline", freshD.Deadline, "wait", wait, "by", freshD.Source)
		return nil, d, c.untilDue(fresh, freshD, wait), nil
	}
	// The fresh pod may be another tenant policy's, or the same one's at a
	// newer generation: confirmed as the decision on the cached pod was.
	if result, err := c.confirmTenantPolicy(ctx, fresh, freshD); err != nil || result != (Result{}) {
		return nil, d, result, err
	}
	return fresh, freshD, Result{}, nil
}

// recordRemoval logs, reports (an event, the metrics) and marks removed a
// removal that the API server accepted, or in a dry run one that would have
// happened: no second API call, and in a dry run one report per pod.
func (c *Controller) recordRemoval(ctx context.Context, pod *corev1.Pod, d policy.Decision) {
	logger := klog.FromContext(ctx)
	key := cache.MetaObjectToName(pod)
	if c.opts.DryRun {
		logger.V(2).Info("Would remove pod (dry run)", "pod", klog.KObj(pod), "action", d.Action, "by", d.Source, "deadline", d.Deadline)
		c.reporter.ReportRemoval(pod, d)
		c.metrics.CountRemoval(d, true, 0)
		c.state.markRemoved(key, pod.UID)
		return
	}
	lateness := c.now().Sub(d.Deadline) // measured once the API server accepted the removal
	c.state.charge(key, pod.UID, c.limiter)
	c.state.markRemoved(key, pod.UID)
	c.reporter.ReportRemoval(pod, d)
	c.metrics.CountRemoval(d, false, lateness)
	logger.V(2).Info("Removed pod", "pod", klog.KObj(pod), "namespace", pod.Namespace, "uid", pod.UID,
		"action", d.Action, "reason", d.Reason, "by", d.Source, "deadline", d.Deadline, "lateness", lateness)
}

// mayNotRemove says that no removal may start now (Options.MayRemove), and
// when one may (0: not known).
type mayNotRemove struct{ after time.Duration }

func (e *mayNotRemove) Error() string { return "no removal may start now" }

// callRemoval makes the one API call that removes the pod, within the write
// timeout, or what is left of the leader's lease (Options.MayRemove).
func (c *Controller) callRemoval(ctx context.Context, pod *corev1.Pod, d policy.Decision) error {
	timeout := c.opts.WriteTimeout
	if c.opts.MayRemove != nil {
		within, ok := c.opts.MayRemove()
		if !ok {
			return &mayNotRemove{after: within}
		}
		timeout = min(timeout, within)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	uid, rv := pod.UID, pod.ResourceVersion
	opts := metav1.DeleteOptions{
		Preconditions:      &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
		GracePeriodSeconds: d.GracePeriodSeconds,
	}
	if d.Action == policy.ActionEvict {
		return c.client.CoreV1().Pods(pod.Namespace).EvictV1(ctx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
			DeleteOptions: &opts,
		})
	}
	return c.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opts)
}

// removalFailed sorts a failed removal: a conflict means the pod changed and is
// decided again; transient failures retry with the workqueue's short backoff;
// refusals that retrying soon cannot fix (removalerrors.Refusals) wait longer, are
// reported once per pod and kind, and their retries take no removal token a
// due pod needs (podStates.reserve). A 404 is not taken as "gone": only the
// informer says that a pod is gone, so a 404 from anything else (a proxy, an
// aggregated path) cannot make a due pod be forgotten. A pod that must be
// evicted is never deleted instead, however long its eviction is refused.
func (c *Controller) removalFailed(ctx context.Context, pod *corev1.Pod, d policy.Decision, err error) (Result, error) {
	logger := klog.FromContext(ctx)
	key := cache.MetaObjectToName(pod)
	if apierrors.IsConflict(err) {
		// The pod changed or was replaced since it was cached: decide again on fresh data.
		logger.V(2).Info("Pod changed since the decision, deciding again", "pod", klog.KObj(pod), "err", err)
		return Result{Requeue: true}, nil
	}
	kind := removalerrors.KindOf(err)
	c.metrics.CountRemovalError(d.Action, kind)
	err = fmt.Errorf("removing pod %s (%s): %w", key, d.Action, err)
	if !removalerrors.IsRefusal(kind) {
		c.state.charge(key, pod.UID, c.limiter) // a call that timed out may have removed the pod
		return Result{}, err
	}
	after, firstOfKind := c.state.recordRefusal(key, pod.UID, kind)
	if firstOfKind {
		c.reporter.RemovalRefused(pod, d.Action, kind, err)
	}
	return Result{}, &retryAfterError{err: err, after: after}
}
