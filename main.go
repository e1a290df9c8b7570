// Command podjanitor removes Kubernetes pods whose lifetime is over, exactly when
// it is over. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	goruntime "runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/policy"
	"github.com/podjanitor/podjanitor/signals"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

// options are the command-line flags.
type options struct {
	kubeconfig, master        string
	namespace, labelSelector  string
	configFile                string
	workers                   int
	dryRun                    bool
	removalEvents             bool
	annotationPrefix          string
	maxDeletionsPerSecond     float64
	deletionBurst             int
	kubeAPIQPS                float64
	kubeAPIBurst              int
	kubeAPIContentType        string
	leaderElect               bool
	leaseDuration             time.Duration
	renewDeadline             time.Duration
	retryPeriod               time.Duration
	leaseName, leaseNamespace string
	metricsAddr, healthAddr   string
	profiling                 bool
	shutdownTimeout           time.Duration
	writeTimeout              time.Duration
	showVersion               bool
	loggingFormat             string
	verbosity                 int    // klog's -v, for --logging-format=json
	output                    string // plan only
}

// usageError is a bad flag value: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func newFlagSet(name string, o *options, plan bool) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Default: $KUBECONFIG, else in-cluster configuration, else ~/.kube/config.")
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server. Overrides any value in kubeconfig.")
	fs.StringVar(&o.namespace, "namespace", "", "Only watch pods in this namespace. Default: all namespaces.")
	fs.StringVar(&o.labelSelector, "label-selector", "", "Only watch pods matching this label selector (applied by the API server), e.g. 'team=ci,!keep'.")
	fs.StringVar(&o.configFile, "config", "", "Policy file (YAML, kind PodJanitorPolicy) with cluster-wide rules. Default: annotations only. Changes are reloaded without a restart.")
	fs.StringVar(&o.annotationPrefix, "annotation-prefix", policy.DefaultAnnotationPrefix, "Prefix of the per-pod annotations (<prefix>/ttl, /expires-at, /ttl-after-finished, /keep).")
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", 50, "Queries per second to the API server.")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", 100, "Burst of queries to the API server.")
	fs.StringVar(&o.kubeAPIContentType, "kube-api-content-type", runtime.ContentTypeProtobuf,
		"Content type of requests to the API server: "+runtime.ContentTypeProtobuf+" or "+runtime.ContentTypeJSON+".")
	fs.BoolVar(&o.showVersion, "version", false, "Print the version and exit.")
	if plan {
		fs.StringVar(&o.output, "o", "table", "Output format: table or json.")
		fs.StringVar(&o.output, "output", "table", "Output format: table or json (same as -o).")
		return fs
	}
	fs.StringVar(&o.loggingFormat, "logging-format", loggingText,
		"Log format: text (klog's) or json (Kubernetes components' JSON: ts, caller, msg, v, then the keys).")
	fs.IntVar(&o.workers, "workers", 4, "Number of pods removed concurrently.")
	fs.BoolVar(&o.dryRun, "dry-run", false, "Decide and report (logs, WouldRemove events, metrics) but remove nothing.")
	fs.BoolVar(&o.removalEvents, "removal-events", true,
		"Record LifetimeExpired events of removals: on each pod, and in bulk one per owner and 10 s. false records none; warnings and dry-run events are recorded regardless.")
	fs.Float64Var(&o.maxDeletionsPerSecond, "max-deletions-per-second", 50, "Cluster-wide cap on removals per second; 0 means no cap. Removals over the cap wait, they are never dropped.")
	fs.IntVar(&o.deletionBurst, "deletion-burst", 100, "Removals allowed at once above --max-deletions-per-second.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Elect a leader on a Lease before acting; only the leader removes pods.")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "How long followers wait before taking over a lease that is not renewed.")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "How long the leader keeps trying to renew before it gives up (and exits).")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "How often to try to acquire or renew the lease.")
	fs.StringVar(&o.leaseName, "leader-elect-resource-name", "podjanitor", "Name of the Lease object.")
	fs.StringVar(&o.leaseNamespace, "leader-elect-resource-namespace", "", "Namespace of the Lease. Default: the pod's own namespace, else kube-system.")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus /metrics endpoint; 0 disables it.")
	fs.StringVar(&o.healthAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz; 0 disables them.")
	fs.BoolVar(&o.profiling, "profiling", false, "Serve Go's pprof profiles under /debug/pprof/ on the metrics address.")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "On SIGTERM, how long to wait for removals in flight.")
	fs.DurationVar(&o.writeTimeout, "write-timeout", 15*time.Second, "Timeout of each removal call to the API server, its retries included; a call that times out is retried with backoff.")
	return fs
}

// parseFlags parses and validates args; klog's flags are added to the set.
func parseFlags(name string, args []string, plan bool) (*options, error) {
	o := &options{}
	fs := newFlagSet(name, o, plan)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for _, name := range []string{"v", "vmodule"} {
		fs.Var(klogFlags.Lookup(name).Value, name, klogFlags.Lookup(name).Usage)
	}
	fs.Usage = func() {
		out := fs.Output()
		if plan {
			fmt.Fprintf(out, "Usage: podjanitor plan [flags]\n\nLists every pod that has a deadline under the current annotations and policy, sorted by deadline. Changes nothing.\n\nFlags:\n")
		} else {
			fmt.Fprintf(out, "Usage: podjanitor [flags]\n       podjanitor plan [flags]\n\nRemoves pods whose lifetime is over, exactly when it is over.\n\nFlags:\n")
		}
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.verbosity, _ = strconv.Atoi(fs.Lookup("v").Value.String())
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	return o, o.validate(plan)
}

func (o *options) validate(plan bool) error {
	bad := func(flag, why string, args ...any) error {
		return usageError{fmt.Sprintf("invalid value for --%s: %s", flag, fmt.Sprintf(why, args...))}
	}
	if _, err := labels.Parse(o.labelSelector); err != nil {
		return bad("label-selector", "%v", err)
	}
	if o.namespace != "" {
		if errs := validation.IsDNS1123Label(o.namespace); len(errs) > 0 {
			return bad("namespace", "%q: %s", o.namespace, strings.Join(errs, "; "))
		}
	}
	if errs := validation.IsDNS1123Subdomain(o.annotationPrefix); len(errs) > 0 {
		return bad("annotation-prefix", "%q must be a DNS subdomain such as podjanitor.io: %s", o.annotationPrefix, strings.Join(errs, "; "))
	}
	if o.kubeAPIQPS <= 0 {
		return bad("kube-api-qps", "%v: must be positive", o.kubeAPIQPS)
	}
	if o.kubeAPIBurst <= 0 {
		return bad("kube-api-burst", "%d: must be positive", o.kubeAPIBurst)
	}
	if o.kubeAPIContentType != runtime.ContentTypeProtobuf && o.kubeAPIContentType != runtime.ContentTypeJSON {
		return bad("kube-api-content-type", "%q: want %s or %s", o.kubeAPIContentType, runtime.ContentTypeProtobuf, runtime.ContentTypeJSON)
	}
	if plan {
		if o.output != "table" && o.output != "json" {
			return bad("output", "%q: want table or json", o.output)
		}
		return nil
	}
	switch {
	case o.workers < 1:
		return bad("workers", "%d: must be at least 1", o.workers)
	case o.maxDeletionsPerSecond < 0:
		return bad("max-deletions-per-second", "%v: must not be negative", o.maxDeletionsPerSecond)
	case o.deletionBurst < 1:
		return bad("deletion-burst", "%d: must be at least 1", o.deletionBurst)
	case o.loggingFormat != loggingText && o.loggingFormat != loggingJSON:
		return bad("logging-format", "%q: want %s or %s", o.loggingFormat, loggingText, loggingJSON)
	case o.shutdownTimeout <= 0:
		return bad("shutdown-timeout", "%v: must be positive", o.shutdownTimeout)
	case o.writeTimeout <= 0:
		return bad("write-timeout", "%v: must be positive", o.writeTimeout)
	case o.leaderElect && o.leaseDuration <= o.renewDeadline:
		return bad("leader-elect-lease-duration", "%v must be greater than --leader-elect-renew-deadline (%v)", o.leaseDuration, o.renewDeadline)
	case o.leaderElect && o.renewDeadline <= o.retryPeriod:
		return bad("leader-elect-renew-deadline", "%v must be greater than --leader-elect-retry-period (%v)", o.renewDeadline, o.retryPeriod)
	case o.leaderElect && o.leaseName == "":
		return bad("leader-elect-resource-name", "must not be empty")
	}
	for flag, addr := range map[string]string{"metrics-bind-address": o.metricsAddr, "health-probe-bind-address": o.healthAddr} {
		if addr != "0" {
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return bad(flag, "%q: %v (use host:port, :port or 0)", addr, err)
			}
		}
	}
	return nil
}

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

// exitCode maps a flag error to the conventional status.
func exitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(os.Stderr, "podjanitor: %v\n", err)
	return 2
}

func restConfig(o *options) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if o.kubeconfig != "" {
		rules.ExplicitPath = o.kubeconfig
	}
	if o.kubeconfig == "" && os.Getenv("KUBECONFIG") == "" && o.master == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return withLimits(cfg, o), nil
		}
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: o.master}}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("building client configuration: %w", err)
	}
	return withLimits(cfg, o), nil
}

func withLimits(cfg *rest.Config, o *options) *rest.Config {
	cfg.QPS = float32(o.kubeAPIQPS)
	cfg.Burst = o.kubeAPIBurst
	// Protobuf, as Kubernetes' own controllers use: decoding the pod list and
	// watch costs a fraction of JSON's CPU and garbage. Every type podjanitor
	// reads or writes (pods, evictions, events, leases) supports it.
	cfg.ContentType = o.kubeAPIContentType
	if o.kubeAPIContentType == runtime.ContentTypeProtobuf {
		cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	cfg.UserAgent = "podjanitor/" + version
	return cfg
}

func loadEvaluator(o *options) (*policy.Evaluator, error) {
	e := &policy.Evaluator{Prefix: o.annotationPrefix}
	if o.configFile != "" {
		p, err := policy.LoadFile(o.configFile)
		if err != nil {
			return nil, err
		}
		e.Policy = p
	}
	return e, nil
}

func informerFactory(client kubernetes.Interface, o *options) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(o.namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = o.labelSelector }),
		informers.WithTransform(podTransform(o.annotationPrefix)),
	)
}

// newNamespaceInformer watches the metadata of namespaces, only of
// --namespace when it is set, keeping their labels and keep annotation.
func newNamespaceInformer(client metadata.Interface, o *options) (cache.SharedIndexInformer, error) {
	informer := metadatainformer.NewFilteredMetadataInformer(client, corev1.SchemeGroupVersion.WithResource("namespaces"),
		metav1.NamespaceAll, 0, cache.Indexers{},
		func(lo *metav1.ListOptions) { lo.FieldSelector = namespaceFieldSelector(o) }).Informer()
	if err := informer.SetTransform(namespaceTransform(keepAnnotationKey(o))); err != nil {
		return nil, fmt.Errorf("namespace informer: %w", err)
	}
	return informer, nil
}

// namespaceFieldSelector selects the namespace of --namespace, else every namespace.
func namespaceFieldSelector(o *options) string {
	if o.namespace == "" {
		return ""
	}
	return fields.OneTermEqualSelector("metadata.name", o.namespace).String()
}

func keepAnnotationKey(o *options) string {
	return (&policy.Evaluator{Prefix: o.annotationPrefix}).AnnotationKey(policy.AnnotationKeep)
}

func runDaemon(args []string) int {
	o, err := parseFlags("podjanitor", args, false)
	if err != nil {
		return exitCode(err)
	}
	if o.showVersion {
		fmt.Printf("podjanitor %s (commit %s)\n", version, commit)
		return 0
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

func daemon(ctx context.Context, o *options) error {
	logger := klog.FromContext(ctx)
	applyMemoryDefaults(logger)
	evaluator, err := loadEvaluator(o)
	if err != nil {
		return err
	}
	cfg, err := restConfig(o)
	if err != nil {
		return err
	}
	metrics := NewMetrics(version, commit)
	metrics.RegisterClientMetrics()
	leaderelection.SetProvider(metrics.LeaderElectionProvider())
	clk, err := processClock(logger)
	if err != nil {
		return err
	}
	var offsetChanged atomic.Pointer[func()] // set once the controller exists
	apiClk := newAPIClock(clk, func(offset time.Duration) {
		metrics.setClockOffset(offset)
		if f := offsetChanged.Load(); f != nil {
			(*f)()
		}
	})
	cfg.Wrap(apiClk.wrap)
	cfg.Wrap(withoutDisruptionBudgetRetryAfter)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating clientset: %w", err)
	}
	logger.Info("Starting podjanitor", "version", version, "apiServer", cfg.Host,
		"namespace", valueOr(o.namespace, "<all>"), "labelSelector", o.labelSelector, "config", o.configFile, "dryRun", o.dryRun)

	// Events outlive ctx so that removals finishing during shutdown are still
	// reported; on exit the broadcaster is shut down and its writes drained.
	// A client of its own, so that event writes do not take removals' share of --kube-api-qps.
	eventClient, err := kubernetes.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		return fmt.Errorf("creating event clientset: %w", err)
	}
	sink := &drainingSink{EventSink: &events.EventSinkImpl{Interface: eventClient.EventsV1()}}
	broadcaster := events.NewBroadcaster(sink)
	if err := broadcaster.StartRecordingToSinkWithContext(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("starting event recording: %w", err)
	}
	defer func() {
		broadcaster.Shutdown()
		sink.drain(100*time.Millisecond, 5*time.Second)
	}()
	recorder := broadcaster.NewRecorder(scheme.Scheme, controllerName)

	factory := informerFactory(client, o)
	podInformer := factory.Core().V1().Pods()
	metadataClient, err := metadata.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating metadata client: %w", err)
	}
	namespaceInformer, err := newNamespaceInformer(metadataClient, o)
	if err != nil {
		return err
	}
	controller, err := NewController(ctx, podInformer, namespaceInformer, client, recorder, clk, Options{
		Evaluator:            evaluator,
		DryRun:               o.dryRun,
		NoRemovalEvents:      !o.removalEvents,
		MaxRemovalsPerSecond: o.maxDeletionsPerSecond,
		RemovalBurst:         o.deletionBurst,
		ShutdownTimeout:      o.shutdownTimeout,
		WriteTimeout:         o.writeTimeout,
		ClockOffset:          apiClk.Offset,
		Metrics:              metrics,
	})
	if err != nil {
		return err
	}
	onOffset := controller.ClockOffsetChanged
	offsetChanged.Store(&onOffset)
	defer func() { // before the broadcaster shuts down: removals reported in bulk, and time for them to be queued
		controller.reporter.flush()
		sink.drain(100*time.Millisecond, 5*time.Second)
	}()
	if o.configFile != "" {
		go watchPolicyFile(ctx, o, controller)
	}

	var watchdog *leaderelection.HealthzAdaptor
	if o.leaderElect {
		watchdog = leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	}
	serveErr := make(chan error, 2)
	synced := func() bool { return podInformer.Informer().HasSynced() && namespaceInformer.HasSynced() }
	if err := serveEndpoints(ctx, o, metrics, watchdog, synced, serveErr); err != nil {
		return err
	}

	go apiClk.runCalibration(ctx, func(ctx context.Context) error {
		return client.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
	})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	go namespaceInformer.RunWithContext(ctx)
	go releaseSyncMemory(ctx, podInformer.Informer().HasSynced, controller.Pending)

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	go func() {
		if err := <-serveErr; err != nil {
			logger.Error(err, "HTTP endpoint failed, stopping")
			cancelRun()
		}
	}()

	if !o.leaderElect {
		metrics.SetLeader(true)
		return controller.Run(runCtx, o.workers)
	}
	return runAsLeader(runCtx, o, client, metrics, watchdog, func(ctx context.Context) error {
		return controller.Run(ctx, o.workers)
	})
}

// processClock is the real clock, or, for tests of clock skew, one that reads
// PODJANITOR_TESTING_CLOCK_OFFSET (a duration) ahead of it.
func processClock(logger klog.Logger) (clock.WithTicker, error) {
	value := os.Getenv("PODJANITOR_TESTING_CLOCK_OFFSET")
	if value == "" {
		return clock.RealClock{}, nil
	}
	offset, err := time.ParseDuration(value)
	if err != nil {
		return nil, fmt.Errorf("PODJANITOR_TESTING_CLOCK_OFFSET=%q: %w", value, err)
	}
	logger.Info("Warning: testing clock in use, reading ahead of the real clock", "offset", offset)
	return shiftedClock{offset: offset}, nil
}

// runAsLeader runs work only while this process holds the lease. On ctx
// cancellation work finishes first, then the lease is released; a lease lost
// for any other reason ends the process with status 1.
func runAsLeader(ctx context.Context, o *options, client kubernetes.Interface, metrics *Metrics,
	watchdog *leaderelection.HealthzAdaptor, work func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	hostname, _ := os.Hostname()
	id := hostname + "_" + uuid.NewString()
	ns := o.leaseNamespace
	if ns == "" {
		ns = ownNamespace()
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: o.leaseName, Namespace: ns},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}

	leCtx, cancelLE := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelLE()
	var (
		started      atomic.Bool
		workErr      error
		workFinished = make(chan struct{})
	)
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   o.leaseDuration,
		RenewDeadline:   o.renewDeadline,
		RetryPeriod:     o.retryPeriod,
		ReleaseOnCancel: true,
		Name:            controllerName,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				started.Store(true)
				defer close(workFinished)
				metrics.SetLeader(true)
				logger.Info("Became the leader", "lease", klog.KRef(ns, o.leaseName), "identity", id)
				workCtx, cancel := context.WithCancel(ctx)
				stop := context.AfterFunc(leading, cancel)
				defer stop()
				workErr = work(workCtx)
			},
			OnStoppedLeading: func() {
				metrics.SetLeader(false)
				if ctx.Err() == nil {
					logger.Error(nil, "Lost the leader lease, exiting", "lease", klog.KRef(ns, o.leaseName))
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
	logger.Info("Waiting to become the leader", "lease", klog.KRef(ns, o.leaseName), "identity", id)
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

// serveEndpoints starts /metrics and /healthz+/readyz; they serve before the cache syncs.
func serveEndpoints(ctx context.Context, o *options, metrics *Metrics, watchdog *leaderelection.HealthzAdaptor,
	synced func() bool, errs chan<- error) error {
	if o.metricsAddr != "0" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{Registry: metrics.Registry}))
		if o.profiling {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		if err := serve(ctx, "metrics", o.metricsAddr, mux, errs); err != nil {
			return err
		}
	}
	if o.healthAddr != "0" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if watchdog != nil {
				if err := watchdog.Check(r); err != nil {
					http.Error(w, "leader election: "+err.Error(), http.StatusInternalServerError)
					return
				}
			}
			fmt.Fprintln(w, "ok")
		})
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
			if !synced() {
				http.Error(w, "pod and namespace caches not synced", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		if err := serve(ctx, "health", o.healthAddr, mux, errs); err != nil {
			return err
		}
	}
	return nil
}

func serve(ctx context.Context, name, addr string, handler http.Handler, errs chan<- error) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s endpoint: %w", name, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	klog.FromContext(ctx).Info("Serving "+name+" endpoint", "address", ln.Addr().String())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("%s endpoint: %w", name, err)
		}
	}()
	context.AfterFunc(ctx, func() { _ = srv.Close() })
	return nil
}

func valueOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// releaseWait bounds how long releaseSyncMemory waits for the first pass.
const releaseWait = 2 * time.Minute

// releaseSyncMemory returns the heap that the initial sync left behind to the
// operating system: decoding the initial pod list, and the workers' first
// pass over its keys (each decision unpacks a pod). It waits until the cache
// has synced and the queue holds no ready key (every pod removed or parked),
// or at most releaseWait after the sync (a follower's workers wait for the
// lease). Without it the process keeps the heap that the sync grew to (up to
// 1.5 times the live heap with GOGC=50) long after, although an idle
// controller allocates almost nothing.
func releaseSyncMemory(ctx context.Context, synced cache.InformerSynced, pending func() int) {
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return
	}
	deadline := time.Now().Add(releaseWait)
	for pending() > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
	debug.FreeOSMemory()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	klog.FromContext(ctx).V(2).Info("Returned the initial sync's memory to the OS", "heapInUse", m.HeapInuse, "heapReleased", m.HeapReleased)
}
