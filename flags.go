package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/secureserving"
	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// flagValues are the command-line flags (the Controller's are its Options).
type flagValues struct {
	cluster              clusterFlags // --kubeconfig, --master, --kube-api-*
	scope                scopeFlags   // --namespace, --label-selector, --annotation-prefix
	configFile           string
	workers              int
	dryRun               bool
	removalEvents        bool
	removalNotice        time.Duration
	maxRemovalsPerSecond float64 // --max-deletions-per-second
	removalBurst         int     // --deletion-burst
	leaderElect          bool
	lease                leaseConfig     // --leader-elect-*
	endpoints            endpointsConfig // --metrics-*, --health-probe-bind-address, --profiling, --http-*-timeout
	shutdownTimeout      time.Duration
	writeTimeout         time.Duration
	redecisionInterval   time.Duration // --namespace-redecision-interval
	showVersion          bool
	loggingFormat        string
	verbosity            int         // klog's -v, for --logging-format=json
	output               string      // plan only
	tenants              tenantFlags // --tenant-*
	waves                waveFlags   // --hold-waves, --wave-*
}

// waveFlags say when a policy reload's wave of removals is held for a
// person to approve (internal/wave).
type waveFlags struct {
	hold      bool
	threshold wave.Threshold
	window    time.Duration
}

// tenantFlags say whether tenant policies (PodLifetimePolicy resources)
// are honoured and what the cluster admin forbids them.
type tenantFlags struct {
	enabled                           bool
	forbiddenClocks, forbiddenActions string
	protectedNamespaces               string // --tenant-protected-namespaces
	protectedClasses                  string // --tenant-protected-priority-classes
	runningPods                       bool
	minAfter                          string
	maxAfter                          string
	crdCheckInterval                  time.Duration       // --tenant-crd-check-interval
	restrictions                      policy.Restrictions // parsed by validate
	maxPolicies, maxRules             int                 // --tenant-max-{policies,rules}-per-namespace
	maxBytes                          string              // --tenant-max-bytes-per-namespace
	limits                            tenant.Limits       // parsed by validate
}

// clusterFlags say how to reach the API server and how hard to press it.
type clusterFlags struct {
	kubeconfig, master string
	kubeAPIQPS         float64
	kubeAPIBurst       int
	kubeAPIContentType string
	kubeAPICompression bool
}

// scopeFlags say which pods and namespaces podjanitor reads, and which
// annotations are its own.
type scopeFlags struct {
	namespace, labelSelector string
	annotationPrefix         string
}

// command is the command whose flags are parsed: the daemon's or plan's.
type command string

const (
	daemonCommand command = "podjanitor"
	planCommand   command = "podjanitor plan"
)

// usageError is a bad flag value: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// exitCode maps a flag error to the conventional status.
func exitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(os.Stderr, "podjanitor: %v\n", err)
	return 2
}

func newFlagSet(cmd command, o *flagValues) *flag.FlagSet {
	fs := flag.NewFlagSet(string(cmd), flag.ContinueOnError)
	fs.StringVar(&o.cluster.kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Default: $KUBECONFIG, else in-cluster configuration, else ~/.kube/config.")
	fs.StringVar(&o.cluster.master, "master", "", "The address of the Kubernetes API server. Overrides any value in kubeconfig.")
	fs.StringVar(&o.scope.namespace, "namespace", "", "Only watch pods in this namespace. Default: all namespaces.")
	fs.StringVar(&o.scope.labelSelector, "label-selector", "", "Only watch pods matching this label selector (applied by the API server), e.g. 'team=ci,!keep'.")
	fs.StringVar(&o.configFile, "config", "", "Policy file (YAML, kind PodJanitorPolicy) with cluster-wide rules. Default: annotations only. Changes are reloaded without a restart.")
	fs.StringVar(&o.scope.annotationPrefix, "annotation-prefix", policy.DefaultAnnotationPrefix, "Prefix of the per-pod annotations (<prefix>/ttl, /expires-at, /ttl-after-finished, /keep). Every key under it is podjanitor's: a pod with any other is left alone as invalid.")
	fs.Float64Var(&o.cluster.kubeAPIQPS, "kube-api-qps", 0, "Queries per second to the API server, on each of podjanitor's clients. 0: three per removal the cap allows (3 × --max-deletions-per-second: a removal takes up to three requests), at least 50; 50 with no cap.")
	fs.IntVar(&o.cluster.kubeAPIBurst, "kube-api-burst", 0, "Burst of queries to the API server, on each of podjanitor's clients. 0: 3 × --deletion-burst, at least 100; 100 with no cap.")
	fs.StringVar(&o.cluster.kubeAPIContentType, "kube-api-content-type", runtime.ContentTypeProtobuf,
		"Content type of requests to the API server: "+runtime.ContentTypeProtobuf+" or "+runtime.ContentTypeJSON+".")
	fs.BoolVar(&o.cluster.kubeAPICompression, "kube-api-compression", false,
		"Ask the API server to gzip its responses, the pod watch included. Saves network bytes when podjanitor runs far from the API server; costs the API server CPU for every pod event.")
	fs.BoolVar(&o.showVersion, "version", false, "Print the version and exit.")
	fs.BoolVar(&o.tenants.enabled, "tenant-policies", false,
		"Honour tenant policies: the rules namespace owners write in PodLifetimePolicy resources (podjanitor.io/v1alpha1) for the pods of their namespace, tried after the pods' annotations and before --config's rules. Needs the CRD installed: without it podjanitor runs without tenant policies (a logged error, podjanitor_tenant_policies_available 0) and takes them up once the API server serves the resource, checked every --tenant-crd-check-interval.")
	fs.StringVar(&o.tenants.protectedNamespaces, "tenant-protected-namespaces", "",
		"Comma-separated namespaces whose pods no tenant policy removes, besides kube-system (always); a policy in one is not used (Ready=False, ProtectedNamespace). The policy file's rules and the pods' own annotations still apply there.")
	fs.StringVar(&o.tenants.protectedClasses, "tenant-protected-priority-classes", "",
		"Comma-separated priority classes whose pods no tenant policy removes, besides system-node-critical and system-cluster-critical (always); a policy whose rule includes one is not used. The policy file's rules and the pods' own annotations still apply to them.")
	fs.DurationVar(&o.tenants.crdCheckInterval, "tenant-crd-check-interval", 30*time.Second,
		"With --tenant-policies, while the API server does not serve PodLifetimePolicy (its CRD not installed), how often to ask again (at least 1s).")
	fs.StringVar(&o.tenants.forbiddenClocks, "tenant-forbidden-clocks", "",
		"Comma-separated clocks (finished, pending, crashLooping, created) no tenant policy may use; a policy with such a rule is not used (Ready=False).")
	fs.StringVar(&o.tenants.forbiddenActions, "tenant-forbidden-actions", "",
		"Comma-separated actions (delete, evict) no tenant policy may remove pods with, its rules' default actions included (evict for Running pods, delete for the others).")
	fs.BoolVar(&o.tenants.runningPods, "tenant-running-pods", true,
		"Allow tenant policies to remove Running pods. false refuses every tenant rule that may match a Running pod (one whose phases or clock do not leave Running out).")
	fs.IntVar(&o.tenants.maxPolicies, "tenant-max-policies-per-namespace", 16,
		"The most tenant policies podjanitor uses in one namespace; those past it, by name, are not used (Ready=False, reason TooManyPolicies). 0: no bound.")
	fs.IntVar(&o.tenants.maxRules, "tenant-max-rules-per-namespace", 64,
		"The most rules the tenant policies podjanitor uses in one namespace may have in all; a policy that would pass it, by name, is not used (Ready=False, reason TooManyRules). 0: no bound.")
	fs.StringVar(&o.tenants.maxBytes, "tenant-max-bytes-per-namespace", "256Ki",
		"The most bytes the rules of the tenant policies podjanitor uses in one namespace may hold in all (their strings, 64 bytes per rule and 16 per list item); a policy that would pass it, by name, is not used (Ready=False, reason TooLarge), and the rules of a policy larger on its own are not kept in memory. A quantity: 256Ki, 1Mi. 0: no bound.")
	fs.StringVar(&o.tenants.minAfter, "tenant-min-after", "0s",
		"The least after a tenant policy's rule may have (90m, 1d); a policy with a shorter one is not used.")
	fs.StringVar(&o.tenants.maxAfter, "tenant-max-after", "0s",
		"The most after a tenant policy's rule may have (7d); a policy with a longer one is not used. Tenant rules come before --config's, so this bounds how much longer than a cluster rule a tenant may keep a pod. 0s: no bound.")
	fs.StringVar(&o.lease.name, "leader-elect-resource-name", "podjanitor", "Name of the Lease object. Installations that share a namespace need one each; RBAC can then limit get and update to it (resourceNames). Held waves and their approvals are recorded on it.")
	fs.StringVar(&o.lease.namespace, "leader-elect-resource-namespace", "", "Namespace of the Lease. Default: the pod's own namespace, else kube-system.")
	if cmd == planCommand {
		fs.StringVar(&o.output, "o", "table", "Output format: table or json.")
		fs.StringVar(&o.output, "output", "table", "Output format: table or json (same as -o).")
		return fs
	}
	fs.StringVar(&o.loggingFormat, "logging-format", loggingText,
		"Log format: text (klog's) or json (Kubernetes components' JSON: ts, caller, msg, v, then the keys).")
	fs.IntVar(&o.workers, "workers", 16, "Number of pods removed concurrently.")
	fs.BoolVar(&o.dryRun, "dry-run", false, "Decide and report (logs, WouldRemove events, metrics) but remove nothing.")
	fs.BoolVar(&o.removalEvents, "removal-events", true,
		"Record LifetimeExpired events of removals: on each pod, and in bulk one per owner and 10 s. false records none; warnings, removal notices (--removal-notice) and dry-run events are recorded regardless.")
	fs.DurationVar(&o.removalNotice, "removal-notice", 0,
		"Tell a pod this long before its deadline that it goes then, by a Normal RemovalScheduled event on it (once per pod and deadline, within the removal events' budget), saying how to keep it longer; a rule's removalNotice overrides it. 0: no notice. A notice never delays a removal.")
	fs.Float64Var(&o.maxRemovalsPerSecond, "max-deletions-per-second", 50, "Cluster-wide cap on removals per second; 0 means no cap. Removals over the cap wait, they are never dropped.")
	fs.IntVar(&o.removalBurst, "deletion-burst", 100, "Removals allowed at once above --max-deletions-per-second.")
	fs.BoolVar(&o.waves.hold, "hold-waves", true,
		"Hold a change that makes many pods due at once (its wave: due within --wave-window of each other, within --wave-horizon, earlier than before) until a person approves it: a policy file reload or a start with a policy other than the one recorded on the Lease (--leader-elect-resource-name; none recorded: a first install), approved on the Lease; a tenant policy's change, approved on the policy; a namespace's labels or keep, approved on the Namespace; see docs/policy.md.")
	fs.IntVar(&o.waves.threshold.Pods, "wave-hold-pods", 100, "A wave of more than this many pods is held.")
	fs.Float64Var(&o.waves.threshold.Percent, "wave-hold-percent", 10, "A wave of more than this percentage of the watched pods (of the namespace's, for a tenant policy or a namespace) is held (when it has more than --wave-hold-min-pods); 0 turns this test off.")
	fs.IntVar(&o.waves.threshold.MinPods, "wave-hold-min-pods", 10, "A wave of at most this many pods is never held for its percentage.")
	fs.DurationVar(&o.waves.window, "wave-window", 5*time.Minute, "Pods a change makes due within this time of each other come due at once: its wave.")
	fs.DurationVar(&o.waves.threshold.Horizon, "wave-horizon", 24*time.Hour,
		"How far ahead a change's wave is looked for: the pods it makes due earlier than before, within this time, the most of them due within --wave-window of each other. At most --wave-window: the pods due within the window alone.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Elect a leader on a Lease before acting; only the leader removes pods.")
	fs.DurationVar(&o.lease.duration, "leader-elect-lease-duration", 15*time.Second, "How long followers wait before taking over a lease that is not renewed.")
	fs.DurationVar(&o.lease.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "How long the leader keeps trying to renew before it gives up (and exits).")
	fs.DurationVar(&o.lease.retryPeriod, "leader-elect-retry-period", 2*time.Second, "How often to try to acquire or renew the lease.")
	fs.StringVar(&o.endpoints.metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus /metrics endpoint; 0 disables it.")
	fs.BoolVar(&o.endpoints.metricsSecure, "metrics-secure", false,
		"Serve /metrics (and pprof) over HTTPS to callers allowed to get the path: each caller's bearer token is checked by a TokenReview, its access by a SubjectAccessReview (answers cached: a minute for a token, 5 minutes for an allowed request), which needs RBAC to create both. "+
			"false serves plain HTTP to anyone, for local runs. The health endpoints are plain HTTP either way.")
	fs.StringVar(&o.endpoints.metricsCertDir, "metrics-cert-dir", "",
		"Directory with the metrics endpoint's serving certificate and key, tls.crt and tls.key (a kubernetes.io/tls Secret's mount); they are read again every 10 s and a changed pair is served. Default: a self-signed certificate made at start. Needs --metrics-secure.")
	fs.BoolVar(&o.endpoints.metricsHTTP2, "metrics-enable-http2", false,
		"Offer HTTP/2 on the HTTPS metrics endpoint. Off by default, as kubebuilder's scaffold has it since the HTTP/2 rapid-reset and stream-cancellation advisories; scrapers use HTTP/1.1. Needs --metrics-secure.")
	fs.StringVar(&o.endpoints.tokenAudiences, "metrics-token-audiences", "",
		"Comma-separated audiences a metrics caller's token must be valid for (one of them), asked for in its TokenReview, e.g. a projected token's audience. Default: the API server's own. Needs --metrics-secure.")
	fs.StringVar(&o.endpoints.healthAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz; 0 disables them.")
	fs.DurationVar(&o.endpoints.readTimeout, "http-read-timeout", secureserving.DefaultReadTimeout,
		"How long the metrics and health endpoints wait for a whole request (its headers within 10 s, at most 32 KiB of them) before they close its connection.")
	fs.DurationVar(&o.endpoints.idleTimeout, "http-idle-timeout", secureserving.DefaultIdleTimeout,
		"How long the metrics and health endpoints keep a keep-alive connection open without a request.")
	fs.IntVar(&o.endpoints.maxConnections, "http-max-connections", secureserving.DefaultMaxConnections,
		"The most connections the metrics endpoint, and the health endpoint, each have open at once; one more is closed at once (podjanitor_http_connections_refused_total).")
	fs.BoolVar(&o.endpoints.profiling, "profiling", false, "Serve Go's pprof profiles under /debug/pprof/ on the metrics address.")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 30*time.Second, "On SIGTERM, how long to wait for removals in flight.")
	fs.DurationVar(&o.redecisionInterval, "namespace-redecision-interval", time.Second,
		"The least time between two re-decisions of all of a namespace's pods, which a change of its labels, keep annotation or tenant policies starts; changes in between are coalesced into one. Pod events and pods that come due never wait for these.")
	fs.DurationVar(&o.writeTimeout, "write-timeout", 15*time.Second, "Timeout of each removal call to the API server, its retries included; a call that times out is retried with backoff.")
	return fs
}

// parseCommand is the preamble of the daemon and of plan: it parses args
// and handles --version. done says that the command has nothing more to do
// (--help, --version, a bad flag), with its exit code.
func parseCommand(cmd command, args []string) (o *flagValues, code int, done bool) {
	o, err := parseFlags(cmd, args)
	if err != nil {
		return nil, exitCode(err), true
	}
	if o.showVersion {
		printVersion()
		return nil, 0, true
	}
	return o, 0, false
}

// parseFlags parses and validates args; klog's flags are added to the set.
func parseFlags(cmd command, args []string) (*flagValues, error) {
	o := &flagValues{}
	fs := newFlagSet(cmd, o)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for _, name := range []string{"v", "vmodule"} {
		fs.Var(klogFlags.Lookup(name).Value, name, klogFlags.Lookup(name).Usage)
	}
	fs.Usage = func() {
		out := fs.Output()
		if cmd == planCommand {
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
	return o, o.validate(cmd)
}

func (o *flagValues) validate(cmd command) error {
	bad := func(flag, why string, args ...any) error {
		return usageError{fmt.Sprintf("invalid value for --%s: %s", flag, fmt.Sprintf(why, args...))}
	}
	if _, err := labels.Parse(o.scope.labelSelector); err != nil {
		return bad("label-selector", "%v", err)
	}
	if o.scope.namespace != "" {
		if errs := validation.IsDNS1123Label(o.scope.namespace); len(errs) > 0 {
			return bad("namespace", "%q: %s", o.scope.namespace, strings.Join(errs, "; "))
		}
	}
	if errs := validation.IsDNS1123Subdomain(o.scope.annotationPrefix); len(errs) > 0 {
		return bad("annotation-prefix", "%q must be a DNS subdomain such as podjanitor.io: %s", o.scope.annotationPrefix, strings.Join(errs, "; "))
	}
	if o.cluster.kubeAPIQPS < 0 {
		return bad("kube-api-qps", "%v: must not be negative (0: derived from the removal cap)", o.cluster.kubeAPIQPS)
	}
	if o.cluster.kubeAPIBurst < 0 {
		return bad("kube-api-burst", "%d: must not be negative (0: derived from the removal burst)", o.cluster.kubeAPIBurst)
	}
	if o.cluster.kubeAPIContentType != runtime.ContentTypeProtobuf && o.cluster.kubeAPIContentType != runtime.ContentTypeJSON {
		return bad("kube-api-content-type", "%q: want %s or %s", o.cluster.kubeAPIContentType, runtime.ContentTypeProtobuf, runtime.ContentTypeJSON)
	}
	if err := o.tenants.validate(bad); err != nil {
		return err
	}
	o.cluster.kubeAPIQPS, o.cluster.kubeAPIBurst = apiLimits(o.cluster.kubeAPIQPS, o.cluster.kubeAPIBurst, o.maxRemovalsPerSecond, o.removalBurst)
	if cmd == planCommand {
		if o.output != "table" && o.output != "json" {
			return bad("output", "%q: want table or json", o.output)
		}
		return nil
	}
	switch {
	case o.workers < 1:
		return bad("workers", "%d: must be at least 1", o.workers)
	case o.removalNotice < 0:
		return bad("removal-notice", "%v: must not be negative", o.removalNotice)
	case o.maxRemovalsPerSecond < 0:
		return bad("max-deletions-per-second", "%v: must not be negative", o.maxRemovalsPerSecond)
	case o.removalBurst < 1:
		return bad("deletion-burst", "%d: must be at least 1", o.removalBurst)
	case o.loggingFormat != loggingText && o.loggingFormat != loggingJSON:
		return bad("logging-format", "%q: want %s or %s", o.loggingFormat, loggingText, loggingJSON)
	case o.shutdownTimeout <= 0:
		return bad("shutdown-timeout", "%v: must be positive", o.shutdownTimeout)
	case o.redecisionInterval < 0:
		return bad("namespace-redecision-interval", "%v: must not be negative", o.redecisionInterval)
	case o.writeTimeout <= 0:
		return bad("write-timeout", "%v: must be positive", o.writeTimeout)
	case o.leaderElect && o.lease.duration <= o.lease.renewDeadline:
		return bad("leader-elect-lease-duration", "%v must be greater than --leader-elect-renew-deadline (%v)", o.lease.duration, o.lease.renewDeadline)
	case o.leaderElect && o.lease.renewDeadline <= time.Duration(leaderelection.JitterFactor*float64(o.lease.retryPeriod)):
		// client-go's own check, which would otherwise stop the start.
		return bad("leader-elect-renew-deadline", "%v must be greater than %v × --leader-elect-retry-period (%v)",
			o.lease.renewDeadline, leaderelection.JitterFactor, o.lease.retryPeriod)
	case (o.leaderElect || o.waves.hold) && o.lease.name == "":
		return bad("leader-elect-resource-name", "must not be empty")
	case o.waves.hold && len(o.lease.name) > wave.MaxLeaseName:
		return bad("leader-elect-resource-name", "%d characters: with --hold-waves at most %d (the ConfigMap %s is named after it)",
			len(o.lease.name), wave.MaxLeaseName, wave.RecordName("NAME"))
	case o.waves.threshold.Pods < 0:
		return bad("wave-hold-pods", "%d: must not be negative", o.waves.threshold.Pods)
	case o.waves.threshold.Percent < 0 || o.waves.threshold.Percent > 100:
		return bad("wave-hold-percent", "%v: must be between 0 and 100", o.waves.threshold.Percent)
	case o.waves.threshold.MinPods < 0:
		return bad("wave-hold-min-pods", "%d: must not be negative", o.waves.threshold.MinPods)
	case o.waves.window < 0:
		return bad("wave-window", "%v: must not be negative", o.waves.window)
	case o.waves.threshold.Horizon < 0:
		return bad("wave-horizon", "%v: must not be negative", o.waves.threshold.Horizon)
	}
	if o.endpoints.metricsCertDir != "" && !o.endpoints.metricsSecure {
		return bad("metrics-cert-dir", "%q needs --metrics-secure", o.endpoints.metricsCertDir)
	}
	if o.endpoints.metricsHTTP2 && !o.endpoints.metricsSecure {
		return bad("metrics-enable-http2", "needs --metrics-secure (plain HTTP is HTTP/1.1)")
	}
	if o.endpoints.tokenAudiences != "" && !o.endpoints.metricsSecure {
		return bad("metrics-token-audiences", "%q needs --metrics-secure", o.endpoints.tokenAudiences)
	}
	o.endpoints.audiences = splitList(o.endpoints.tokenAudiences)
	if o.endpoints.tokenAudiences != "" && len(o.endpoints.audiences) == 0 {
		return bad("metrics-token-audiences", "%q has no audience", o.endpoints.tokenAudiences)
	}
	if o.endpoints.maxConnections < 1 {
		return bad("http-max-connections", "%d: must be at least 1", o.endpoints.maxConnections)
	}
	for flag, d := range map[string]time.Duration{"http-read-timeout": o.endpoints.readTimeout, "http-idle-timeout": o.endpoints.idleTimeout} {
		if d <= 0 {
			return bad(flag, "%v: must be positive", d)
		}
	}
	for flag, addr := range map[string]string{"metrics-bind-address": o.endpoints.metricsAddr, "health-probe-bind-address": o.endpoints.healthAddr} {
		if addr != "0" {
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return bad(flag, "%q: %v (use host:port, :port or 0)", addr, err)
			}
		}
	}
	return nil
}

// validate parses the restrictions.
func (t *tenantFlags) validate(bad func(flag, why string, args ...any) error) error {
	r := &t.restrictions
	for _, name := range splitList(t.forbiddenClocks) {
		clock := policy.Clock(name)
		if !slices.Contains(policy.Clocks(), clock) {
			return bad("tenant-forbidden-clocks", "unknown clock %q, want finished, pending, crashLooping or created", name)
		}
		r.ForbiddenClocks = append(r.ForbiddenClocks, clock)
	}
	for _, name := range splitList(t.forbiddenActions) {
		action := policy.Action(name)
		if action != policy.ActionDelete && action != policy.ActionEvict {
			return bad("tenant-forbidden-actions", "unknown action %q, want delete or evict", name)
		}
		r.ForbiddenActions = append(r.ForbiddenActions, action)
	}
	for _, name := range splitList(t.protectedNamespaces) {
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			return bad("tenant-protected-namespaces", "%q is not a namespace name: %s", name, strings.Join(errs, "; "))
		}
		r.ProtectedNamespaces = append(r.ProtectedNamespaces, name)
	}
	for _, name := range splitList(t.protectedClasses) {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return bad("tenant-protected-priority-classes", "%q is not a priority class name: %s", name, strings.Join(errs, "; "))
		}
		r.ProtectedPriorityClasses = append(r.ProtectedPriorityClasses, name)
	}
	r.NoRunningPods = !t.runningPods
	minAfter, err := policy.ParseDuration(t.minAfter)
	if err != nil {
		return bad("tenant-min-after", "%q: %v", t.minAfter, err)
	}
	r.MinAfter = minAfter
	maxAfter, err := policy.ParseDuration(t.maxAfter)
	if err != nil {
		return bad("tenant-max-after", "%q: %v", t.maxAfter, err)
	}
	if maxAfter > 0 && maxAfter < minAfter {
		return bad("tenant-max-after", "%s is less than --tenant-min-after=%s: no tenant rule could be used", t.maxAfter, t.minAfter)
	}
	r.MaxAfter = maxAfter
	if t.crdCheckInterval < time.Second {
		return bad("tenant-crd-check-interval", "%v: must be at least 1s", t.crdCheckInterval)
	}
	if t.maxPolicies < 0 {
		return bad("tenant-max-policies-per-namespace", "%d: must not be negative", t.maxPolicies)
	}
	if t.maxRules < 0 {
		return bad("tenant-max-rules-per-namespace", "%d: must not be negative", t.maxRules)
	}
	q, err := resource.ParseQuantity(t.maxBytes)
	if err != nil || q.Sign() < 0 || !q.IsZero() && q.Value() > math.MaxInt32 {
		return bad("tenant-max-bytes-per-namespace", "%q: want a quantity of bytes from 0 to 2Gi (256Ki, 1Mi)", t.maxBytes)
	}
	t.limits = tenant.Limits{Policies: t.maxPolicies, Rules: t.maxRules, Bytes: int(q.Value())}
	return nil
}

// options are the controller's wave options; nil when waves are not held.
// Holds and approvals live on the Lease, what was acted on in the ConfigMap
// beside it (wave.Record).
func (w waveFlags) options(client kubernetes.Interface, lease leaseConfig) *wave.Options {
	if !w.hold {
		return nil
	}
	return &wave.Options{Threshold: w.threshold, Window: w.window, StartReadFor: lease.renewDeadline,
		Record: wave.Record{Client: client, Namespace: cmp.Or(lease.namespace, ownNamespace()), Name: lease.name}}
}

// requestsPerRemoval is the most requests one removal makes on a client: the
// pod read before an eviction, the eviction, its namespace's read
// (docs/operations.md, "Request budget").
const requestsPerRemoval = 3

// apiLimits are the client-side limits: qps and burst as set, and for 0 (the
// defaults) requestsPerRemoval times the removal cap and its burst, so that
// the cap, not the client, bounds a backlog of evictions or one spread over
// many namespaces; at least 50 and 100 (with no cap, and plan's, those).
func apiLimits(qps float64, burst int, maxRemovals float64, removalBurst int) (float64, int) {
	if qps == 0 {
		qps = max(50, requestsPerRemoval*maxRemovals)
	}
	if burst == 0 {
		burst = 100
		if maxRemovals > 0 {
			burst = max(burst, requestsPerRemoval*removalBurst)
		}
	}
	return qps, burst
}

// splitList splits a comma-separated flag value, without empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
