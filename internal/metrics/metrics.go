// Package metrics owns every series podjanitor exports, in one Prometheus
// registry: controller-runtime's reconcile series (under the controller's
// name), podjanitor's own (removals, removal errors by kind, parked pods, the
// clock offset, the namespace watch, the leader and whether its workers run,
// policy reloads, the HTTPS
// metrics endpoint's refusals and certificate), and
// client-go's REST client, workqueue and leader-election series.
//
// It promises that no label takes a pod name or another unbounded value, that
// every series with a fixed set of label values is present at 0 from the
// start (the monitoring kit's alerts match on them), and that the names do not
// change: artifacts/monitoring/testdata lists them (TestMetricNamesFile).
package metrics

import (
	"context"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/tools/leaderelection"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/util/workqueue"

	"github.com/podjanitor/podjanitor/internal/removalerrors"
	"github.com/podjanitor/podjanitor/policy"
)

// Reconcile results, as controller-runtime labels them.
const (
	ResultSuccess      = "success"
	ResultError        = "error"
	ResultRequeue      = "requeue"
	ResultRequeueAfter = "requeue_after"
)

// Metrics holds every series podjanitor exports. The methods the controller
// calls (WorkqueueProvider, the Set*, Count* and worker methods, Reconciled,
// Panicked, PolicyReloaded) are safe on a nil *Metrics, which records
// nothing (unit tests that do not look at metrics); RegisterClientMetrics and
// LeaderElectionProvider need a real one. No label takes a pod name or
// another unbounded value.
type Metrics struct {
	Registry *prometheus.Registry

	reconcileTotal     *prometheus.CounterVec
	reconcileErrors    prometheus.Counter
	terminalErrors     prometheus.Counter
	reconcilePanics    prometheus.Counter
	reconcileTime      prometheus.Histogram
	activeWorkers      prometheus.Gauge
	maxConcurrent      prometheus.Gauge
	podsRemoved        *prometheus.CounterVec
	removalErrors      *prometheus.CounterVec
	podsScheduled      prometheus.Gauge
	podsWaiting        prometheus.Gauge
	backlogSeconds     prometheus.Gauge
	backlogNamespaces  prometheus.Gauge
	namespaceWatch     prometheus.Gauge
	clockOffset        prometheus.Gauge
	removalLateness    prometheus.Histogram
	leader             prometheus.Gauge
	workersRunning     prometheus.Gauge
	working            atomic.Bool // what workersRunning says, for /readyz
	policyReloads      *prometheus.CounterVec
	tenantPolicies     *prometheus.GaugeVec
	tenantAPI          prometheus.Gauge
	warningsDropped    *prometheus.CounterVec
	tenantOverLimit    *prometheus.GaugeVec
	podsHeld           *prometheus.GaugeVec
	workqueue          workqueueMetrics
	restRequestResults *prometheus.CounterVec
	restLatency        *prometheus.HistogramVec
	leaderStatus       *prometheus.GaugeVec
	leaderSlowpath     *prometheus.CounterVec
	endpoint           endpointMetrics
	podWatch           prometheus.Gauge
}

// New creates all series in a new registry, each present at 0; controller
// names the controller in controller-runtime's series.
func New(controller, version, commit string) *Metrics {
	reg := prometheus.NewRegistry()
	ctrl := prometheus.Labels{"controller": controller}
	m := &Metrics{
		Registry: reg,
		reconcileTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "controller_runtime_reconcile_total", ConstLabels: ctrl,
			Help: "Total number of reconciliations per controller, by result.",
		}, []string{"result"}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_runtime_reconcile_errors_total", ConstLabels: ctrl,
			Help: "Total number of reconciliation errors per controller.",
		}),
		terminalErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_runtime_terminal_reconcile_errors_total", ConstLabels: ctrl,
			Help: "Total number of terminal reconciliation errors (not retried) per controller.",
		}),
		reconcilePanics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "controller_runtime_reconcile_panics_total", ConstLabels: ctrl,
			Help: "Total number of reconciliation panics per controller.",
		}),
		reconcileTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "controller_runtime_reconcile_time_seconds", ConstLabels: ctrl,
			Help:    "Length of time per reconciliation per controller.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 12),
		}),
		activeWorkers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "controller_runtime_active_workers", ConstLabels: ctrl,
			Help: "Number of currently used workers per controller.",
		}),
		maxConcurrent: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "controller_runtime_max_concurrent_reconciles", ConstLabels: ctrl,
			Help: "Maximum number of concurrent reconciles per controller.",
		}),
		podsRemoved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podjanitor_pods_removed_total",
			Help: "Pods removed (or, with dry_run=\"true\", that would have been), by action and reason.",
		}, []string{"action", "reason", "dry_run"}),
		removalErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podjanitor_removal_errors_total",
			Help: "Failed removal API calls (including refusals: by a PodDisruptionBudget, by admission control), by action and kind of error: " +
				"timeout, unavailable, throttled, not_found, disruption_budget, multiple_budgets, admission_denied, refused, other.",
		}, []string{"action", "error"}),
		podsHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "podjanitor_pods_held",
			Help: "Pods that are due but held, by what changed (source: file, startup, tenant, namespace, namespaces): a change that made more pods due at once than --wave-hold-pods or --wave-hold-percent allow waits for a person's approval.",
		}, []string{"source"}),
		podsScheduled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_pods_scheduled",
			Help: "Pods parked until a future deadline.",
		}),
		podsWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_pods_waiting_for_removal",
			Help: "Pods due and waiting for a removal slot under the removal cap (--max-deletions-per-second): the backlog.",
		}),
		backlogSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_removal_backlog_seconds",
			Help: "How long the pods waiting for a removal slot take to go at the removal cap: their number over --max-deletions-per-second (0 without a cap).",
		}),
		backlogNamespaces: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_removal_backlog_namespaces",
			Help: "Namespaces with pods in the backlog: they take turns for the removal slots, a slot each.",
		}),
		namespaceWatch: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_namespace_watch_healthy",
			Help: "1 while the namespace informer's list and watch requests succeed, 0 from one that fails until one succeeds; while 0, /readyz fails and namespace changes reach podjanitor late (removals read the namespace from the API server first regardless).",
		}),
		clockOffset: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_clock_offset_seconds",
			Help: "How far the API server's clock is ahead of this process's (negative: behind), estimated from the Date header of API responses; deadlines are compared in the API server's time.",
		}),
		removalLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "podjanitor_removal_lateness_seconds",
			Help:    "Time from a pod's deadline to its successful removal.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_leader",
			Help: "1 while this process holds the leader lease (or runs without leader election), else 0.",
		}),
		workersRunning: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_workers_running",
			Help: "1 while the controller's workers run (from its start, once the caches have synced, until it stops), else 0. A leader (podjanitor_leader 1) at 0 removes nothing.",
		}),
		policyReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podjanitor_policy_reloads_total",
			Help: "Policy file reloads, by result (success, or error when the new file was rejected).",
		}, []string{"result"}),
		warningsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "podjanitor_warnings_dropped_total",
			Help: "Warnings and removal notices left out over their budget, by reason (PolicyNotUsed: a tenant policy's, whose Ready condition still says why it is not used; RemovalScheduled: a pod's removal notice, over the removal events' budget).",
		}, []string{"reason"}),
		tenantPolicies: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "podjanitor_tenant_policies",
			Help: "Tenant policies (PodLifetimePolicy resources) podjanitor has read, by whether it uses their rules (ready=\"true\") or not (ready=\"false\": see their Ready condition). 0 with --tenant-policies=false.",
		}, []string{"ready"}),
		tenantAPI: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "podjanitor_tenant_policies_available",
			Help: "1 while podjanitor honours tenant policies (--tenant-policies and the API server serves PodLifetimePolicy); 0 while the API server does not serve it (the CRD not installed: podjanitor runs without tenant policies and checks again every --tenant-crd-check-interval), and with --tenant-policies=false.",
		}),
		tenantOverLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "podjanitor_tenant_policies_over_limit",
			Help: "Tenant policies podjanitor does not use because their namespace's usable policies would pass a limit, by reason: TooManyPolicies (--tenant-max-policies-per-namespace), TooManyRules (--tenant-max-rules-per-namespace), TooLarge (--tenant-max-bytes-per-namespace). Counted in podjanitor_tenant_policies{ready=\"false\"} too.",
		}, []string{"reason"}),
		restRequestResults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rest_client_requests_total",
			Help: "Number of HTTP requests to the API server, by status code, method and host.",
		}, []string{"code", "method", "host"}),
		restLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rest_client_request_duration_seconds",
			Help:    "Request latency in seconds, by verb.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"verb"}),
		// client-go's leader-election metrics, as Kubernetes components name them
		// (k8s.io/component-base/metrics/prometheus/clientgo/leaderelection).
		leaderStatus: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "leader_election_master_status",
			Help: "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
		}, []string{"name"}),
		leaderSlowpath: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leader_election_slowpath_total",
			Help: "Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease.",
		}, []string{"name"}),
	}
	m.workqueue = newWorkqueueMetrics()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "podjanitor_build_info", Help: "Build information; always 1.",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit},
	})
	buildInfo.Set(1)
	reg.MustRegister(m.reconcileTotal, m.reconcileErrors, m.terminalErrors, m.reconcilePanics,
		m.reconcileTime, m.activeWorkers, m.maxConcurrent, m.podsRemoved, m.removalErrors,
		m.podsScheduled, m.podsWaiting, m.backlogSeconds, m.backlogNamespaces, m.namespaceWatch, m.clockOffset, m.removalLateness, m.leader, m.workersRunning, m.policyReloads, m.tenantPolicies, m.tenantAPI, m.warningsDropped, m.tenantOverLimit, m.podsHeld, buildInfo, m.restRequestResults, m.restLatency,
		m.leaderStatus, m.leaderSlowpath,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.workqueue.register(reg)
	m.endpoint = newEndpointMetrics(reg)
	m.podWatch = newPodWatchGauge(reg)

	for _, r := range []string{ResultSuccess, ResultError, ResultRequeue, ResultRequeueAfter} {
		m.reconcileTotal.WithLabelValues(r)
	}
	for _, a := range []policy.Action{policy.ActionDelete, policy.ActionEvict} {
		for _, kind := range removalerrors.Kinds {
			m.removalErrors.WithLabelValues(string(a), kind)
		}
	}
	m.policyReloads.WithLabelValues(ResultSuccess)
	m.policyReloads.WithLabelValues(ResultError)
	m.podsHeld.WithLabelValues("file")
	m.podsHeld.WithLabelValues("tenant")
	m.podsHeld.WithLabelValues("startup")
	m.podsHeld.WithLabelValues("namespace")
	m.tenantPolicies.WithLabelValues("true")
	m.warningsDropped.WithLabelValues("PolicyNotUsed")
	m.warningsDropped.WithLabelValues("RemovalScheduled")
	m.tenantPolicies.WithLabelValues("false")
	for _, reason := range TenantLimitReasons {
		m.tenantOverLimit.WithLabelValues(reason)
	}
	return m
}

// RegisterClientMetrics routes client-go's REST client measurements into m.
// client-go accepts this once per process.
func (m *Metrics) RegisterClientMetrics() {
	clientmetrics.Register(clientmetrics.RegisterOpts{
		RequestResult:  restResult{m.restRequestResults},
		RequestLatency: restLatency{m.restLatency},
	})
}

type restResult struct{ v *prometheus.CounterVec }

func (r restResult) Increment(_ context.Context, code, method, host string) {
	r.v.WithLabelValues(code, method, host).Inc()
}

type restLatency struct{ v *prometheus.HistogramVec }

func (r restLatency) Observe(_ context.Context, verb string, _ url.URL, latency time.Duration) {
	r.v.WithLabelValues(verb).Observe(latency.Seconds())
}

// LeaderElectionProvider feeds client-go's leader-election metrics into the
// registry (leaderelection.SetProvider; client-go accepts one per process).
func (m *Metrics) LeaderElectionProvider() leaderelection.MetricsProvider {
	return leaderMetrics{m}
}

type leaderMetrics struct{ m *Metrics }

func (l leaderMetrics) NewLeaderMetric() leaderelection.LeaderMetric { return l }
func (l leaderMetrics) On(name string)                               { l.m.leaderStatus.WithLabelValues(name).Set(1) }
func (l leaderMetrics) Off(name string)                              { l.m.leaderStatus.WithLabelValues(name).Set(0) }
func (l leaderMetrics) SlowpathExercised(name string)                { l.m.leaderSlowpath.WithLabelValues(name).Inc() }

// WorkqueueProvider feeds the workqueue's metrics into the registry.
func (m *Metrics) WorkqueueProvider() workqueue.MetricsProvider {
	if m == nil {
		return nil
	}
	return m.workqueue
}

func (m *Metrics) SetMaxConcurrency(n int) {
	if m != nil {
		m.maxConcurrent.Set(float64(n))
	}
}

func (m *Metrics) WorkerStarted() {
	if m != nil {
		m.activeWorkers.Inc()
	}
}

func (m *Metrics) WorkerFinished(took time.Duration) {
	if m != nil {
		m.activeWorkers.Dec()
		m.reconcileTime.Observe(took.Seconds())
	}
}

func (m *Metrics) Reconciled(result string, terminal bool) {
	if m == nil {
		return
	}
	m.reconcileTotal.WithLabelValues(result).Inc()
	if result == ResultError {
		m.reconcileErrors.Inc()
	}
	if terminal {
		m.terminalErrors.Inc()
	}
}

func (m *Metrics) Panicked() {
	if m != nil {
		m.reconcilePanics.Inc()
	}
}

func (m *Metrics) CountRemoval(d policy.Decision, dryRun bool, lateness time.Duration) {
	if m == nil {
		return
	}
	dry := "false"
	if dryRun {
		dry = "true"
	}
	m.podsRemoved.WithLabelValues(string(d.Action), d.Reason, dry).Inc()
	if !dryRun {
		m.removalLateness.Observe(max(lateness, 0).Seconds())
	}
}

func (m *Metrics) PolicyReloaded(ok bool) {
	if m == nil {
		return
	}
	result := ResultSuccess
	if !ok {
		result = ResultError
	}
	m.policyReloads.WithLabelValues(result).Inc()
}

func (m *Metrics) CountRemovalError(a policy.Action, kind string) {
	if m != nil {
		m.removalErrors.WithLabelValues(string(a), kind).Inc()
	}
}

// SetLeader records whether this process is the acting leader.
func (m *Metrics) SetLeader(leading bool) {
	if m != nil {
		setBool(m.leader, leading)
	}
}

// SetWorkersRunning records whether the controller's workers run.
func (m *Metrics) SetWorkersRunning(running bool) {
	if m != nil {
		m.working.Store(running)
		setBool(m.workersRunning, running)
	}
}

// WorkersRunning is what SetWorkersRunning was last told (false on a nil
// *Metrics).
func (m *Metrics) WorkersRunning() bool {
	return m != nil && m.working.Load()
}

// SetPodsParked sets podjanitor_pods_scheduled, the number of pods parked
// until a future deadline.
func (m *Metrics) SetPodsParked(n int) {
	if m != nil {
		m.podsScheduled.Set(float64(n))
	}
}

// SetRemovalsWaiting sets podjanitor_pods_waiting_for_removal to n,
// podjanitor_removal_backlog_seconds to the time n removals take at
// perSecond (0: no cap, none) and podjanitor_removal_backlog_namespaces to
// namespaces.
func (m *Metrics) SetRemovalsWaiting(n, namespaces int, perSecond float64) {
	if m == nil {
		return
	}
	m.podsWaiting.Set(float64(n))
	m.backlogNamespaces.Set(float64(namespaces))
	if perSecond > 0 {
		m.backlogSeconds.Set(float64(n) / perSecond)
	} else {
		m.backlogSeconds.Set(0)
	}
}

// SetPodsHeld sets podjanitor_pods_held for a source of waves.
func (m *Metrics) SetPodsHeld(source string, n int) {
	if m != nil {
		m.podsHeld.WithLabelValues(source).Set(float64(n))
	}
}

// SetNamespaceWatchHealthy sets podjanitor_namespace_watch_healthy.
func (m *Metrics) SetNamespaceWatchHealthy(healthy bool) {
	if m != nil {
		setBool(m.namespaceWatch, healthy)
	}
}

// SetTenantPolicies sets podjanitor_tenant_policies: how many tenant
// policies podjanitor uses (ready) and how many it does not (notReady).
func (m *Metrics) SetTenantPolicies(ready, notReady int) {
	if m != nil {
		m.tenantPolicies.WithLabelValues("true").Set(float64(ready))
		m.tenantPolicies.WithLabelValues("false").Set(float64(notReady))
	}
}

// SetTenantPoliciesAvailable sets podjanitor_tenant_policies_available:
// whether the tenant policies are honoured (their informer runs).
func (m *Metrics) SetTenantPoliciesAvailable(available bool) {
	if m != nil {
		setBool(m.tenantAPI, available)
	}
}

// setBool sets a 0/1 gauge.
func setBool(g prometheus.Gauge, b bool) {
	v := 0.0
	if b {
		v = 1
	}
	g.Set(v)
}

// CountWarningDropped counts a Warning, or a removal notice, left out over its budget.
func (m *Metrics) CountWarningDropped(reason string) {
	if m != nil {
		m.warningsDropped.WithLabelValues(reason).Inc()
	}
}

// TenantLimitReasons are the reason label's values of
// podjanitor_tenant_policies_over_limit (tenant.Reason*).
var TenantLimitReasons = []string{"TooManyPolicies", "TooManyRules", "TooLarge"}

// SetTenantPoliciesOverLimit sets podjanitor_tenant_policies_over_limit
// for reason (one of TenantLimitReasons).
func (m *Metrics) SetTenantPoliciesOverLimit(reason string, n int) {
	if m != nil {
		m.tenantOverLimit.WithLabelValues(reason).Set(float64(n))
	}
}

func (m *Metrics) SetClockOffset(d time.Duration) {
	if m != nil {
		m.clockOffset.Set(d.Seconds())
	}
}

// workqueueMetrics implements workqueue.MetricsProvider with the series names
// that Kubernetes components export (workqueue_*, label "name").
type workqueueMetrics struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, workDuration      *prometheus.HistogramVec
}

func newWorkqueueMetrics() workqueueMetrics {
	name := []string{"name"}
	buckets := prometheus.ExponentialBuckets(10e-9, 10, 12)
	return workqueueMetrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "workqueue_depth",
			Help: "Current depth of workqueue."}, name),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "workqueue_adds_total",
			Help: "Total number of adds handled by workqueue."}, name),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "workqueue_queue_duration_seconds",
			Help: "How long in seconds an item stays in workqueue before being requested.", Buckets: buckets}, name),
		workDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "workqueue_work_duration_seconds",
			Help: "How long in seconds processing an item from workqueue takes.", Buckets: buckets}, name),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "workqueue_unfinished_work_seconds",
			Help: "How many seconds of work has been done that is in progress and hasn't been observed by work_duration."}, name),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "workqueue_longest_running_processor_seconds",
			Help: "How many seconds has the longest running processor for workqueue been running."}, name),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "workqueue_retries_total",
			Help: "Total number of retries handled by workqueue."}, name),
	}
}

func (w workqueueMetrics) register(reg *prometheus.Registry) {
	reg.MustRegister(w.depth, w.adds, w.latency, w.workDuration, w.unfinished, w.longest, w.retries)
}

func (w workqueueMetrics) NewDepthMetric(n string) workqueue.GaugeMetric {
	return w.depth.WithLabelValues(n)
}
func (w workqueueMetrics) NewAddsMetric(n string) workqueue.CounterMetric {
	return w.adds.WithLabelValues(n)
}
func (w workqueueMetrics) NewLatencyMetric(n string) workqueue.HistogramMetric {
	return w.latency.WithLabelValues(n)
}
func (w workqueueMetrics) NewWorkDurationMetric(n string) workqueue.HistogramMetric {
	return w.workDuration.WithLabelValues(n)
}
func (w workqueueMetrics) NewUnfinishedWorkSecondsMetric(n string) workqueue.SettableGaugeMetric {
	return w.unfinished.WithLabelValues(n)
}
func (w workqueueMetrics) NewLongestRunningProcessorSecondsMetric(n string) workqueue.SettableGaugeMetric {
	return w.longest.WithLabelValues(n)
}
func (w workqueueMetrics) NewRetriesMetric(n string) workqueue.CounterMetric {
	return w.retries.WithLabelValues(n)
}

// WorkqueueDepth is workqueue_depth's gauge for the named queue, for keys
// held on the way into it: they count in its depth. Nil without metrics.
func (m *Metrics) WorkqueueDepth(name string) workqueue.GaugeMetric {
	if m == nil {
		return nil
	}
	return m.workqueue.depth.WithLabelValues(name)
}
