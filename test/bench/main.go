// Command bench is podjanitor's load benchmark (`make bench`, see BENCHMARKS.md).
//
// It runs against a cluster given by -kubeconfig (hack/bench.sh brings up a
// local one), starts the podjanitor binary given by -podjanitor as a separate
// process per measurement, creates pods, watches for their removal, scrapes
// podjanitor's /metrics and /proc/<pid>, and prints a table and writes JSON.
//
// Scenarios (-scenarios, comma-separated):
//
//	idle     N pods with far-future deadlines: cache sync time, RSS, Go heap
//	         in use, heap bytes per cached pod (N vs 0 pods), CPU and API
//	         requests over an idle period
//	backlog  pods already past their deadline when podjanitor starts: drain
//	         time and pods/s, next to a plain client-go deleter with the same
//	         concurrency and QPS/burst
//	idle-standin
//	         idle, with the N pods served from memory by a stand-in API
//	         server (standin.go) instead of a cluster: podjanitor's memory at
//	         N a local kube-apiserver cannot hold; needs no -kubeconfig when
//	         it is the only scenario
//	steady   N pods whose deadlines are spread uniformly over a window, one
//	         run per -windows entry: lateness (removal seen by a watcher -
//	         deadline) p50/p90/p99/max and podjanitor's own histogram
//	churn    -churn-pods pods created and deleted under a 7-day `created`
//	         rule, -churn-live of them live at a time: heap (after a forced
//	         GC), heap objects and RSS versus pods seen and versus live pods
//	recovery kube-apiserver stopped for -outage while N pods come due (the
//	         local cluster's, through hack/local-cluster.sh; needs
//	         -cluster-dir): time from its return to the last removal
//	peer     the same N pods twice, on kwok nodes, with a -peer-lifetime
//	         from creation: podjanitor removes one copy, the descheduler's
//	         PodLifeTime (-descheduler) the other, in one run (peer.go)
//	kyverno  the same N pods three times, deadlines creationTimestamp + ttl
//	         spread over -kyverno-window: podjanitor removes one copy,
//	         Kyverno's cleanup controller (-kyverno) the second, the ideal
//	         remover the third, in one run (kyverno.go)
//	clock    the lateness the API-server clock estimate alone adds: its
//	         lower end sampled for -clock-duration while it is measured as
//	         when a removal is near (clock.go)
//	fair-backlog
//	         the cap shared between namespaces: one namespace's -fair-pods
//	         pods overdue, then -fair-quiet namespaces of -fair-quiet-pods
//	         pods due while they drain at -fair-cap: the quiet pods'
//	         lateness beside the busy ones' wait (fairness.go)
//	takeover two podjanitors with --leader-elect on -takeover-pods pods, the
//	         leader SIGKILLed once the other is a synced standby, with
//	         -takeover-due pods due over -takeover-spread from the kill: the
//	         time from the kill to the Lease taken and to the first and last
//	         due pod removed, their lateness, and pods removed early
//	         (takeover.go)
//
// API requests per removed pod are reported for backlog and steady.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
)

type config struct {
	kubeconfig, podjanitor, outDir string
	podjanitorAlt                  string
	podjanitorEnv                  []string
	pods, backlogPods, runs        int
	capPods, capNamespaces         int // evict-backlog, ns-backlog (capbacklog.go)
	fairPods, fairQuiet            int // fair-backlog (fairness.go)
	fairQuietPods                  int
	fairCap                        float64
	workers, burst, createConc     int
	qps, maxDeletions              float64
	scenarios                      []string
	windows                        []time.Duration
	idle, lead                     time.Duration
	metricsPort                    int
	idleBound, rawEvents           bool
	nodes                          int
	podManifests                   string
	churnPods, churnLive           int
	churnBatch                     int
	outage                         time.Duration
	clusterDir                     string
	descheduler                    string // peer (peer.go)
	peerLifetime, peerInterval     time.Duration
	peerNodes                      int
	ideal                          bool   // steady: the ideal remover beside podjanitor (ideal.go)
	kyverno, kyvernoCRDs           string // kyverno (kyverno.go)
	kyvernoWindow, kyvernoInterval time.Duration
	clockDuration                  time.Duration // clock (clock.go)
	tenantPolicies                 int           // PodLifetimePolicy resources per namespace (tenant.go)
	tenantCRD                      string
	takeoverPods, takeoverDue      int // takeover (takeover.go)
	takeoverNamespace              string
	takeoverSpread                 time.Duration
	leaseDuration, renewDeadline   time.Duration
	retryPeriod                    time.Duration
	command, commit                string // recorded with the results and every chart's data
}

func main() {
	cfg := &config{}
	var scen, wins, env string
	flag.StringVar(&cfg.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (required unless idle-standin is the only scenario)")
	flag.StringVar(&cfg.podjanitor, "podjanitor", "_output/bin/podjanitor", "podjanitor binary, optionally followed by extra flags (\"_output/bin/podjanitor --profiling\")")
	flag.StringVar(&cfg.outDir, "out", "_output/bench", "directory for results JSON and podjanitor logs")
	flag.IntVar(&cfg.pods, "pods", 10000, "N: pods for the idle and steady scenarios")
	flag.IntVar(&cfg.backlogPods, "backlog-pods", 0, "pods per backlog run (each for podjanitor and for the raw deleter); 0 = -pods")
	flag.IntVar(&cfg.capPods, "cap-pods", 600, "evict-backlog, ns-backlog: overdue pods for podjanitor at its default flags, and as many for the raw remover")
	flag.IntVar(&cfg.capNamespaces, "cap-namespaces", 200, "ns-backlog: namespaces the -cap-pods pods are spread over (each side)")
	flag.IntVar(&cfg.fairPods, "fair-pods", 1500, "fair-backlog: overdue pods in the busy namespace")
	flag.IntVar(&cfg.fairQuiet, "fair-quiet", 4, "fair-backlog: quiet namespaces whose pods come due while the busy one drains")
	flag.IntVar(&cfg.fairQuietPods, "fair-quiet-pods", 20, "fair-backlog: pods in each quiet namespace")
	flag.Float64Var(&cfg.fairCap, "fair-cap", 10, "fair-backlog: podjanitor --max-deletions-per-second (burst: as many)")
	flag.IntVar(&cfg.runs, "runs", 3, "runs of the short measurements (backlog; idle cache sync/heap restarts); the median is reported")
	flag.StringVar(&scen, "scenarios", "idle,backlog,evict-backlog,ns-backlog,steady", "scenarios to run: idle, idle-standin, backlog, evict-backlog, ns-backlog, fair-backlog, steady, churn, recovery, peer, kyverno, clock, takeover")
	flag.StringVar(&wins, "windows", "5m,1m", "steady scenario: windows over which the N deadlines are spread, one run each")
	flag.IntVar(&cfg.workers, "workers", 16, "podjanitor --workers, and the raw deleter's goroutines")
	flag.Float64Var(&cfg.qps, "qps", 1000, "podjanitor --kube-api-qps, and the raw deleter's client QPS")
	flag.IntVar(&cfg.burst, "burst", 1000, "podjanitor --kube-api-burst, and the raw deleter's client burst")
	flag.Float64Var(&cfg.maxDeletions, "max-deletions-per-second", 0, "podjanitor --max-deletions-per-second (0: no cap)")
	flag.IntVar(&cfg.createConc, "create-concurrency", 32, "goroutines creating pods")
	flag.DurationVar(&cfg.idle, "idle", 60*time.Second, "idle scenario: how long CPU and API requests are measured")
	flag.DurationVar(&cfg.lead, "lead", 0, "steady scenario: time from the start of creation to the first deadline; 0 = auto: creation (at the rate measured so far) ends before the first deadline")
	flag.IntVar(&cfg.metricsPort, "metrics-port", 29490, "podjanitor's metrics port on 127.0.0.1 (health probes on the next port)")
	flag.BoolVar(&cfg.idleBound, "idle-bound", true, "idle scenario: bind pods to fake (unmanaged) nodes and give them a Running status, as a kubelet would")
	flag.StringVar(&cfg.podjanitorAlt, "podjanitor-alt", "", "backlog, fair-backlog: also drain a backlog with this second podjanitor binary, optionally followed by extra flags (\"_output/bin/podjanitor --removal-events=false\"), to compare a change")
	flag.BoolVar(&cfg.rawEvents, "backlog-raw-events", false, "backlog: also run the raw deleter with an Event per deleted pod, as podjanitor records")
	flag.IntVar(&cfg.nodes, "nodes", 4, "fake nodes for -idle-bound")
	flag.StringVar(&cfg.podManifests, "pod-manifests", "", "run podjanitor as a pod of the Deployment in this file (artifacts/deploy rendered for the local cluster's real node; hack/bench.sh with BENCH_PODJANITOR=pod), with the driver's flags; -podjanitor still gives its version and extra flags")
	flag.IntVar(&cfg.churnPods, "churn-pods", 0, "churn: pods created and deleted; 0 = -pods")
	flag.IntVar(&cfg.churnLive, "churn-live", 1000, "churn: pods live at a time (a multiple of -churn-batch)")
	flag.IntVar(&cfg.churnBatch, "churn-batch", 500, "churn: pods created, and later deleted, at once")
	flag.DurationVar(&cfg.outage, "outage", 60*time.Second, "recovery: how long kube-apiserver is stopped")
	flag.StringVar(&cfg.clusterDir, "cluster-dir", "", "recovery: the local cluster's CLUSTER_DIR, whose kube-apiserver hack/local-cluster.sh stops and starts")
	flag.StringVar(&cfg.descheduler, "descheduler", "_output/bin/descheduler", "peer: descheduler binary (hack/build-descheduler.sh), optionally followed by extra flags (\"_output/bin/descheduler --v=3\")")
	flag.DurationVar(&cfg.peerLifetime, "peer-lifetime", 5*time.Minute, "peer: pod lifetime from creation, whole seconds (podjanitor `created` rule, descheduler maxPodLifeTimeSeconds)")
	flag.DurationVar(&cfg.peerInterval, "peer-interval", 2*time.Minute, "peer: the descheduler's --descheduling-interval")
	flag.IntVar(&cfg.peerNodes, "peer-nodes", 2, "peer: kwok-managed nodes the pods are bound to (at least 2)")
	flag.StringVar(&cfg.kyverno, "kyverno", "_output/bin/kyverno-cleanup-controller", "kyverno: Kyverno's cleanup controller binary (hack/build-kyverno.sh), optionally followed by extra flags (\"_output/bin/kyverno-cleanup-controller --v=4\")")
	flag.StringVar(&cfg.kyvernoCRDs, "kyverno-crds", "", "kyverno: Kyverno's config/crds directory, applied before it starts (hack/bench.sh passes the one of the module hack/kyverno)")
	flag.DurationVar(&cfg.kyvernoWindow, "kyverno-window", 5*time.Minute, "kyverno: window over which the -pods deadlines of each remover are spread")
	flag.DurationVar(&cfg.kyvernoInterval, "kyverno-interval", time.Minute, "kyverno: Kyverno's --ttlReconciliationInterval, its default (its TTL manager starts its informers one interval after it leads, and checks its permissions on every resource type every interval; timing starts after the first)")
	flag.DurationVar(&cfg.clockDuration, "clock-duration", 3*time.Minute, "clock: how long the API-server clock estimate is sampled")
	flag.BoolVar(&cfg.ideal, "ideal", true, "steady: also create each pod in a second namespace whose pods the driver removes itself, each at its deadline (the ideal remover), in the same run; doubles the API server's load (-ideal=false: podjanitor's namespace only, as before)")
	flag.IntVar(&cfg.tenantPolicies, "tenant-policies", 0, "PodLifetimePolicy resources created in every namespace a podjanitor watches, podjanitor run with --tenant-policies (0: neither, the CRD not applied); their rules give no bench pod a deadline; the run fails unless all are Ready=True at the end")
	flag.StringVar(&cfg.tenantCRD, "tenant-crd", "artifacts/crd/podjanitor.io_podlifetimepolicies.yaml", "-tenant-policies: the PodLifetimePolicy CRD (a file or directory), applied before the first podjanitor starts")
	flag.IntVar(&cfg.takeoverPods, "takeover-pods", 0, "takeover: pods in -takeover-namespace at the kill, the due ones included (pods already there count; none may be due); 0 = -pods")
	flag.IntVar(&cfg.takeoverDue, "takeover-due", 3000, "takeover: pods due over -takeover-spread after the leader is killed, created once both replicas have synced")
	flag.DurationVar(&cfg.takeoverSpread, "takeover-spread", 30*time.Second, "takeover: the due pods' deadlines are spread uniformly over this time after the kill")
	flag.StringVar(&cfg.takeoverNamespace, "takeover-namespace", "bench-takeover", "takeover: the namespace of its pods and Lease (bench-idle: the idle scenario's pods, run before it, are the ones not due)")
	flag.DurationVar(&cfg.leaseDuration, "takeover-lease-duration", 15*time.Second, "takeover: both podjanitors' --leader-elect-lease-duration")
	flag.DurationVar(&cfg.renewDeadline, "takeover-renew-deadline", 10*time.Second, "takeover: both podjanitors' --leader-elect-renew-deadline")
	flag.DurationVar(&cfg.retryPeriod, "takeover-retry-period", 2*time.Second, "takeover: both podjanitors' --leader-elect-retry-period")
	flag.StringVar(&cfg.command, "command", "", "the command that ran the bench (hack/bench.sh passes the make command), recorded with the results and charts; default: the driver's command line")
	flag.StringVar(&cfg.commit, "commit", "", "the commit the bench ran (hack/bench.sh passes git's), recorded with the results and charts; default: podjanitor --version's")
	flag.StringVar(&env, "podjanitor-env", "", "comma-separated NAME=value pairs added to every podjanitor's environment (GOGC=100,GOMEMLIMIT=200MiB)")
	flag.Parse()
	if cfg.backlogPods == 0 {
		cfg.backlogPods = cfg.pods
	}
	cfg.scenarios = splitList(scen)
	if cfg.kubeconfig == "" && !slices.Equal(cfg.scenarios, []string{"idle-standin"}) {
		fmt.Fprintln(os.Stderr, "bench: -kubeconfig is required (all scenarios but idle-standin need a cluster)")
		os.Exit(2)
	}
	for _, e := range splitList(env) {
		if !strings.Contains(e, "=") {
			fmt.Fprintf(os.Stderr, "bench: -podjanitor-env: %q is not NAME=value\n", e)
			os.Exit(2)
		}
		cfg.podjanitorEnv = append(cfg.podjanitorEnv, e)
	}
	for _, w := range splitList(wins) {
		d, err := time.ParseDuration(w)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: bad window %q: %v\n", w, err)
			os.Exit(2)
		}
		cfg.windows = append(cfg.windows, d)
	}
	if err := os.MkdirAll(cfg.outDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// commitOf is the commit in podjanitor --version's "podjanitor v1.2.3 (commit abc1234)".
func commitOf(version string) string {
	_, after, ok := strings.Cut(version, "(commit ")
	if !ok {
		return ""
	}
	c, _, _ := strings.Cut(after, ")")
	return c
}

// shellJoin quotes args for a shell where they need it.
func shellJoin(args []string) string {
	var out []string
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"$`\\*?[]{}()<>|&;#~") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// ------------------------------------------------------------------ results

type results struct {
	Started  time.Time      `json:"started"`
	Finished time.Time      `json:"finished"`
	Machine  machine        `json:"machine"`
	Config   map[string]any `json:"config"`
	PodJSON  map[string]int `json:"pod_json_bytes"`
	Idle     *idleResult    `json:"idle,omitempty"`
	Backlog  *backlogResult `json:"backlog,omitempty"`
	// AtCap are evict-backlog and ns-backlog, podjanitor at its default flags.
	AtCap    []*capBacklogResult `json:"backlogs_at_cap,omitempty"`
	Fair     []*fairResult       `json:"fair_backlog,omitempty"` // fair-backlog, podjanitor and -podjanitor-alt
	Steady   []*steadyResult     `json:"steady,omitempty"`
	Churn    *churnResult        `json:"churn,omitempty"`
	Recovery *recoveryResult     `json:"recovery,omitempty"`
	Peer     *peerResult         `json:"peer,omitempty"`
	Kyverno  *kyvernoResult      `json:"kyverno,omitempty"`
	Clock    *clockResult        `json:"clock,omitempty"`
	Takeover *takeoverResult     `json:"takeover,omitempty"`
	Tenants  *tenantResult       `json:"tenant_policies,omitempty"` // with -tenant-policies (tenant.go)
	Charts   []string            `json:"charts,omitempty"`          // PNGs and their data (chart.go)
}

type machine struct {
	CPUs    int    `json:"nproc"`
	GoVer   string `json:"go"`
	Kernel  string `json:"kernel"`
	MemInfo string `json:"mem_total"`
}

// apiRequests are podjanitor's client requests by HTTP method (GET = LIST and WATCH).
type apiRequests struct {
	ByMethod      map[string]float64 `json:"by_method"`
	ByCode        map[string]float64 `json:"by_code"`
	Removed       float64            `json:"pods_removed"`
	WritesPerPod  float64            `json:"writes_per_removed_pod"`
	DeletesPerPod float64            `json:"deletes_per_removed_pod"`
	EventsPerPod  float64            `json:"event_posts_per_removed_pod"`
	GetsTotal     float64            `json:"gets_total"`
}

func requestsFrom(m metrics) apiRequests {
	r := apiRequests{
		ByMethod: m.byLabel("rest_client_requests_total", "method"),
		ByCode:   m.byLabel("rest_client_requests_total", "code"),
		Removed:  m.sum("podjanitor_pods_removed_total", `dry_run="false"`),
	}
	r.GetsTotal = r.ByMethod["GET"]
	if r.Removed > 0 {
		writes := 0.0
		for meth, v := range r.ByMethod {
			if meth != "GET" {
				writes += v
			}
		}
		r.WritesPerPod = writes / r.Removed
		r.DeletesPerPod = r.ByMethod["DELETE"] / r.Removed
		r.EventsPerPod = r.ByMethod["POST"] / r.Removed
	}
	return r
}

func run(ctx context.Context, cfg *config) error {
	res := &results{Started: time.Now(), PodJSON: map[string]int{}, Config: map[string]any{
		"pods": cfg.pods, "backlog_pods": cfg.backlogPods, "cap_pods": cfg.capPods, "cap_namespaces": cfg.capNamespaces,
		"fair_pods": cfg.fairPods, "fair_quiet": cfg.fairQuiet, "fair_quiet_pods": cfg.fairQuietPods, "fair_cap": cfg.fairCap, "runs": cfg.runs, "scenarios": cfg.scenarios,
		"windows": fmtDurations(cfg.windows), "workers": cfg.workers, "kube_api_qps": cfg.qps, "kube_api_burst": cfg.burst,
		"max_deletions_per_second": cfg.maxDeletions, "create_concurrency": cfg.createConc, "idle": cfg.idle.String(),
		"idle_bound": cfg.idleBound, "nodes": cfg.nodes, "churn_pods": cfg.churnPods, "churn_live": cfg.churnLive,
		"churn_batch": cfg.churnBatch, "outage": cfg.outage.String(),
		"peer_lifetime": cfg.peerLifetime.String(), "peer_interval": cfg.peerInterval.String(), "peer_nodes": cfg.peerNodes,
		"kyverno_window": cfg.kyvernoWindow.String(), "kyverno_interval": cfg.kyvernoInterval.String(),
		"tenant_policies": cfg.tenantPolicies, "takeover_pods": cfg.takeoverPods, "takeover_due": cfg.takeoverDue,
		"takeover_spread": cfg.takeoverSpread.String(), "takeover_namespace": cfg.takeoverNamespace,
		"takeover_lease_duration": cfg.leaseDuration.String(),
		"takeover_renew_deadline": cfg.renewDeadline.String(), "takeover_retry_period": cfg.retryPeriod.String(),
	}}
	res.Machine = describeMachine()
	if out, err := exec.Command(strings.Fields(cfg.podjanitor)[0], "--version").Output(); err == nil {
		res.Config["podjanitor_version"] = strings.TrimSpace(string(out))
		if cfg.commit == "" {
			cfg.commit = commitOf(string(out))
		}
	}
	if cfg.command == "" {
		cfg.command = shellJoin(os.Args)
	}
	res.Config["command"], res.Config["commit"], res.Config["ideal"] = cfg.command, cfg.commit, cfg.ideal

	res.Config["podjanitor_env"] = cfg.podjanitorEnv
	b := &bench{cfg: cfg, res: res, createRate: 100}
	if cfg.kubeconfig != "" { // empty only for idle-standin alone, which needs no cluster
		restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
		if err != nil {
			return err
		}
		// The driver's own client: protobuf, no client-side rate limit.
		fast := rest.CopyConfig(restCfg)
		fast.QPS, fast.Burst = 1e6, 1e6
		fast.ContentType = "application/vnd.kubernetes.protobuf"
		fast.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
		fast.UserAgent = "podjanitor-bench"
		if b.cs, err = kubernetes.NewForConfig(fast); err != nil {
			return err
		}
		b.rest = restCfg
	}
	if cfg.podManifests != "" {
		if cfg.kubeconfig == "" {
			return fmt.Errorf("-pod-manifests needs a cluster (-kubeconfig)")
		}
		var err error
		if podMode, err = setupPodMode(ctx, b.cs, cfg.podManifests); err != nil {
			return err
		}
		res.Config["podjanitor_as"] = "pod on the local cluster's real node (" + cfg.podManifests + ")"
	}
	if cfg.tenantPolicies > 0 {
		if cfg.kubeconfig == "" || cfg.podManifests != "" {
			return fmt.Errorf("-tenant-policies needs a cluster (-kubeconfig) and podjanitor as a process (not -pod-manifests: artifacts/deploy has neither the CRD nor its RBAC)")
		}
		var err error
		if tenants, err = b.setupTenants(ctx, cfg.tenantCRD); err != nil {
			return fmt.Errorf("-tenant-policies: %w", err)
		}
	}

	for _, s := range cfg.scenarios {
		var err error
		switch s {
		case "idle":
			res.Idle, err = b.idle(ctx)
		case "idle-standin":
			res.Idle, err = b.idleStandin()
		case "backlog":
			res.Backlog, err = b.backlog(ctx)
		case "evict-backlog", "ns-backlog":
			var r *capBacklogResult
			r, err = b.capBacklog(ctx, s)
			if r != nil {
				res.AtCap = append(res.AtCap, r)
			}
		case "fair-backlog":
			res.Fair, err = b.fairBacklog(ctx)
		case "steady":
			for _, w := range cfg.windows {
				var r *steadyResult
				r, err = b.steady(ctx, w)
				if r != nil {
					res.Steady = append(res.Steady, r)
				}
				if err != nil {
					break
				}
			}
		case "churn":
			res.Churn, err = b.churn(ctx)
		case "recovery":
			res.Recovery, err = b.recovery(ctx)
		case "peer":
			res.Peer, err = b.peer(ctx)
		case "kyverno":
			res.Kyverno, err = b.kyverno(ctx)
		case "clock":
			res.Clock, err = b.clock(ctx)
		case "takeover":
			res.Takeover, err = b.takeover(ctx)
		default:
			err = fmt.Errorf("unknown scenario %q (want idle, idle-standin, backlog, evict-backlog, ns-backlog, fair-backlog, steady, churn, recovery, peer, kyverno, clock, takeover)", s)
		}
		if err != nil {
			b.write()
			return fmt.Errorf("scenario %s: %w", s, err)
		}
		if ctx.Err() != nil {
			b.write()
			return ctx.Err()
		}
	}
	var tenantErr error
	if tenants != nil {
		var err error
		if res.Tenants, err = tenants.report(ctx); err != nil {
			b.write()
			return fmt.Errorf("reading the tenant policies: %w", err)
		}
		if len(res.Tenants.NotReady) > 0 {
			tenantErr = fmt.Errorf("-tenant-policies: %d of %d policies not Ready=True (%s): the figures may not measure podjanitor with tenant policies",
				len(res.Tenants.NotReady), res.Tenants.Total, res.Tenants.NotReady[0])
		}
	}
	res.Finished = time.Now()
	path := b.write()
	printReport(os.Stdout, res)
	if len(res.Charts) > 0 {
		fmt.Printf("\nCharts and their data: %s\n", strings.Join(res.Charts, " "))
	}
	fmt.Printf("\nResults: %s (total %s)\n", path, res.Finished.Sub(res.Started).Round(time.Second))
	return tenantErr
}

type bench struct {
	cfg        *config
	cs         kubernetes.Interface
	rest       *rest.Config
	res        *results
	createRate float64 // last measured pods/s, for the steady scenario's auto lead
}

func (b *bench) write() string {
	data, err := json.MarshalIndent(finite(b.res), "", "  ")
	if err != nil {
		logf("writing results: %v", err)
	}
	path := filepath.Join(b.cfg.outDir, "results-"+b.res.Started.Format("20060102-150405")+".json")
	_ = os.WriteFile(path, data, 0o644)
	_ = os.WriteFile(filepath.Join(b.cfg.outDir, "results.json"), data, 0o644)
	return path
}

// finite returns v (a pointer to a struct) as generic JSON with NaN and ±Inf
// numbers (not measured) replaced by null, which encoding/json cannot encode.
func finite(v any) any {
	var walk func(reflect.Value) any
	walk = func(x reflect.Value) any {
		switch x.Kind() {
		case reflect.Pointer, reflect.Interface:
			if x.IsNil() {
				return nil
			}
			return walk(x.Elem())
		case reflect.Float32, reflect.Float64:
			if f := x.Float(); math.IsNaN(f) || math.IsInf(f, 0) {
				return nil
			}
			return x.Interface()
		case reflect.Struct:
			if _, ok := x.Interface().(time.Time); ok {
				return x.Interface()
			}
			m := map[string]any{}
			for i := range x.NumField() {
				f := x.Type().Field(i)
				if !f.IsExported() {
					continue
				}
				name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
				if name == "-" {
					continue
				}
				if name == "" {
					name = f.Name
				}
				if strings.Contains(opts, "omitempty") && x.Field(i).IsZero() {
					continue
				}
				m[name] = walk(x.Field(i))
			}
			return m
		case reflect.Slice, reflect.Array:
			if x.Kind() == reflect.Slice && x.IsNil() {
				return nil
			}
			out := make([]any, x.Len())
			for i := range x.Len() {
				out[i] = walk(x.Index(i))
			}
			return out
		case reflect.Map:
			m := map[string]any{}
			for _, k := range x.MapKeys() {
				m[fmt.Sprint(k.Interface())] = walk(x.MapIndex(k))
			}
			return m
		default:
			return x.Interface()
		}
	}
	return walk(reflect.ValueOf(v))
}

func describeMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), GoVer: runtime.Version()}
	if out, err := exec.Command("uname", "-sr").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(data), "\n")
		m.MemInfo = strings.Join(strings.Fields(line)[1:], " ")
	}
	return m
}

func fmtDurations(ds []time.Duration) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.String())
	}
	return out
}

// ensureNamespace creates ns (recreating it if a previous bench left it) and
// waits for its default ServiceAccount, which pod admission needs.
func (b *bench) ensureNamespace(ctx context.Context, ns string) error {
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	_, err := b.cs.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := b.cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

// podJSONSize records the size of one stored pod as JSON.
func (b *bench) podJSONSize(ctx context.Context, key, ns, name string) {
	jcs, err := kubernetes.NewForConfig(b.rest)
	if err != nil {
		return
	}
	raw, err := jcs.CoreV1().RESTClient().Get().Namespace(ns).Resource("pods").Name(name).DoRaw(ctx)
	if err == nil {
		var v any
		if json.Unmarshal(raw, &v) == nil {
			if compact, err := json.Marshal(v); err == nil {
				b.res.PodJSON[key] = len(compact)
			}
		}
	}
}

// ------------------------------------------------------------------- stats

type latency struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

func latencyOf(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{P50: math.NaN(), P90: math.NaN(), P99: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(ds)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(ds)))) - 1
		return float64(ds[max(i, 0)]) / 1e6
	}
	return latency{Count: len(ds), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: float64(ds[len(ds)-1]) / 1e6}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// rawDelete deletes the named pods with `workers` goroutines through a plain
// client-go clientset with the same QPS/burst (and JSON, like podjanitor).
//
// With withEvents it also records an Event per deleted pod through the same
// client with client-go's events broadcaster, as podjanitor does: the
// difference to the plain run is what the events cost.
func rawDelete(ctx context.Context, restCfg *rest.Config, ns string, names []string, workers int, qps float64, burst int, withEvents bool) (errs int, err error) {
	c := rest.CopyConfig(restCfg)
	c.QPS, c.Burst, c.UserAgent = float32(qps), burst, "podjanitor-bench-raw-deleter"
	// The same content type as podjanitor's default (--kube-api-content-type).
	c.ContentType = "application/vnd.kubernetes.protobuf"
	c.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return 0, err
	}
	var recorder events.EventRecorder
	if withEvents {
		broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
		broadcaster.StartRecordingToSinkWithContext(ctx)
		defer broadcaster.Shutdown()
		recorder = broadcaster.NewRecorder(scheme.Scheme, "podjanitor-bench")
	}
	ch := make(chan string)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for name := range ch {
				err := cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
				if err != nil && !apierrors.IsNotFound(err) {
					mu.Lock()
					errs++
					mu.Unlock()
				}
				if err == nil && recorder != nil {
					pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
					recorder.Eventf(pod, nil, corev1.EventTypeNormal, "Expired", "Delete", "Pod deleted: its deadline %s has passed", "bench")
				}
			}
		})
	}
	for _, n := range names {
		ch <- n
	}
	close(ch)
	wg.Wait()
	return errs, nil
}

// ------------------------------------------------------------------ report

func printReport(w0 *os.File, r *results) {
	w := tabwriter.NewWriter(w0, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "\npodjanitor benchmark — %d CPUs, %s, %s, memory %s\n", r.Machine.CPUs, r.Machine.GoVer, r.Machine.Kernel, r.Machine.MemInfo)
	fmt.Fprintf(w, "config: %v\n", compactConfig(r.Config))
	if len(r.PodJSON) > 0 {
		fmt.Fprintf(w, "pod size as stored (JSON): %v bytes\n", r.PodJSON)
	}
	if i := r.Idle; i != nil {
		fmt.Fprintf(w, "\n== Scenario 3: idle at scale (median of %d podjanitor starts; idle measured over %s)\n", len(i.Runs), i.IdleWindow)
		if i.StandIn {
			fmt.Fprintln(w, "   pods served by the stand-in API server (test/bench/standin.go), not a cluster: sync times are not comparable")
		}
		fmt.Fprintln(w, "pods\tcache sync\tRSS\tpeak RSS\tGo heap in use\tpods parked")
		fmt.Fprintf(w, "0\t%.2f s\t%s\t%s\t%s\t-\n", i.Empty.SyncSeconds, mib(i.Empty.RSS), mib(i.Empty.PeakRSS), mib(i.Empty.HeapInuse))
		fmt.Fprintf(w, "%d\t%.2f s\t%s\t%s\t%s\t%.0f\n", i.Pods, i.Full.SyncSeconds, mib(i.Full.RSS), mib(i.Full.PeakRSS), mib(i.Full.HeapInuse), i.Full.Parked)
		fmt.Fprintf(w, "per cached pod\t\t%.2f KiB RSS\t%.2f KiB peak\t%.2f KiB heap\t\n", i.RSSPerPod/1024, i.PeakRSSPerPod/1024, i.HeapPerPod/1024)
		if i.HeapAfterGCPerPod > 0 || i.LivePerPod > 0 {
			fmt.Fprintf(w, "after the first GC past sync:\theap in use %s = %.2f KiB/pod\tlive heap (gctrace) %s = %.2f KiB/pod (0 pods: %s)\t\t\n",
				mib(i.Full.AfterGC), i.HeapAfterGCPerPod/1024, mib(i.Full.LiveAtGC), i.LivePerPod/1024, mib(i.EmptyLiveHeap))
		}
		fmt.Fprintf(w, "idle %s with %d pods:\tCPU %.3f%% of one core\tAPI requests %.0f\t\t\n", i.IdleWindow, i.Pods, i.IdleCPUPercent, i.IdleRequests)
		if len(i.Runs) > 0 {
			last := i.Runs[len(i.Runs)-1]
			fmt.Fprintf(w, "first pass done (the log's %q) %.1f s after the start (median; 0 pods: %.1f s); RSS at the end of the idle period %s\n",
				firstPassDone, i.Full.FirstPass, i.Empty.FirstPass, mib(last.RSSAfterIdle))
		}
	}
	if bl := r.Backlog; bl != nil {
		fmt.Fprintf(w, "\n== Scenario 2: backlog of %d overdue pods (workers/goroutines %d, QPS %g, burst %d; median of %d runs)\n",
			bl.Pods, bl.Workers, bl.QPS, bl.Burst, len(bl.Runs))
		fmt.Fprintln(w, "run\tpodjanitor sync\tpodjanitor drain\tpodjanitor pods/s\traw drain\traw pods/s\tratio")
		for k, run := range bl.Runs {
			fmt.Fprintf(w, "%d\t%.2f s\t%.1f s\t%.0f\t%.1f s\t%.0f\t%.0f%%\n", k+1, run.SyncSeconds, run.DrainSeconds, run.Rate, run.RawSeconds, run.RawRate, 100*run.Ratio)
		}
		fmt.Fprintf(w, "median\t\t\t%.0f\t\t%.0f\t%.0f%%\n", bl.MedianRate, bl.MedianRawRate, 100*bl.MedianRatio)
		for k, run := range bl.Runs {
			if run.AltRate > 0 {
				fmt.Fprintf(w, "run %d: -podjanitor-alt binary: %.1f s, %.0f pods/s (CPU %.1f s); alt / raw = %.0f%%\n",
					k+1, run.AltSeconds, run.AltRate, run.AltCPUSeconds, 100*run.AltRate/run.RawRate)
			}
			if run.RawEvRate > 0 {
				fmt.Fprintf(w, "run %d: raw deleter that also records an Event per pod (as podjanitor does): %.1f s, %.0f pods/s; podjanitor / that = %.0f%%\n",
					k+1, run.RawEvSeconds, run.RawEvRate, 100*run.Rate/run.RawEvRate)
			}
		}
		fmt.Fprintf(w, "podjanitor during drain: CPU %.1f s, peak RSS %s\n", bl.Runs[0].CPUSeconds, mib(bl.Runs[0].PeakRSS))
		printRequests(w, "Scenario 4 (backlog run 1)", bl.Runs[0].Requests)
	}
	printCapBacklog(w, r.AtCap)
	printFair(w, r.Fair)
	if len(r.Steady) > 0 {
		fmt.Fprintf(w, "\n== Scenario 1: steady expiry (lateness = removal seen by a watcher − deadline; podjanitor's histogram beside it)\n")
		fmt.Fprintln(w, "pods\twindow\trate\tmeasured\tp50\tp90\tp99\tmax\tpodjanitor p50\tp90\tp99\tnot removed\tcreated late")
		for _, s := range r.Steady {
			fmt.Fprintf(w, "%d\t%s\t%.0f/s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", s.Pods, s.Window, s.Rate, s.All.Count,
				ms(s.All.P50), ms(s.All.P90), ms(s.All.P99), ms(s.All.Max),
				ms(s.Histogram.P50*1000), ms(s.Histogram.P90*1000), ms(s.Histogram.P99*1000), s.NotRemoved, s.CreatedLate)
			if s.AfterCreation.Count > 0 && s.AfterCreation.Count != s.All.Count {
				fmt.Fprintf(w, "\t\t- deadlines after creation ended\t%d\t%s\t%s\t%s\t%s\t\t\t\t\t\n", s.AfterCreation.Count,
					ms(s.AfterCreation.P50), ms(s.AfterCreation.P90), ms(s.AfterCreation.P99), ms(s.AfterCreation.Max))
				fmt.Fprintf(w, "\t\t- deadlines during creation\t%d\t%s\t%s\t%s\t%s\t\t\t\t\t\n", s.DuringCreation.Count,
					ms(s.DuringCreation.P50), ms(s.DuringCreation.P90), ms(s.DuringCreation.P99), ms(s.DuringCreation.Max))
			}
		}
		for _, s := range r.Steady {
			fmt.Fprintf(w, "window %s: podjanitor CPU %.1f s (%.1f%% of one core), peak RSS %s\n", s.Window, s.CPUSeconds,
				100*s.CPUSeconds/s.WallSeconds, mib(s.PeakRSS))
			t := s.Tail
			fmt.Fprintf(w, "window %s, what sets the tail: share of removals over 25 ms: watcher %.2f%%, DELETE in the API server %.2f%%, DELETE at podjanitor's client %.2f%%\n",
				s.Window, 100*t.WatcherOver, 100*t.ServerDeleteOver, 100*t.ClientDeleteOver)
			fmt.Fprintf(w, "  API server: DELETE pods p50 %s p90 %s p99 %s (%.0f); POST events p50 %s p99 %s (%.0f); APF: %.0f requests waited %.3f s in all; CPU %.1f s (%.1f%% of one core)\n",
				ms(t.ServerDelete.P50*1000), ms(t.ServerDelete.P90*1000), ms(t.ServerDelete.P99*1000), t.ServerDelete.Count,
				ms(t.ServerCreateEvent.P50*1000), ms(t.ServerCreateEvent.P99*1000), t.ServerCreateEvent.Count, t.APFWaitCount, t.APFWaitSeconds,
				t.ServerCPUSeconds, 100*t.ServerCPUSeconds/max(t.ServerSeconds, 1))
			fmt.Fprintf(w, "  podjanitor: client DELETE p50 %s p90 %s p99 %s; %d GCs in the window, longest stop-the-world pause %.2f ms; clock offset used %s (the API server runs on this machine: every ms below 0 is a ms late)\n",
				ms(t.ClientDelete.P50*1000), ms(t.ClientDelete.P90*1000), ms(t.ClientDelete.P99*1000), t.GCs, t.GCMaxPauseMs, ms(t.ClockOffset*1000))
			if s.Ideal != nil {
				fmt.Fprintf(w, "  (the API server's DELETE and CPU figures count the ideal remover's namespace too)\n")
			}
			printRequests(w, "Scenario 4 (steady "+s.Window+")", s.Requests)
		}
		printIdeal(w, r.Steady)
	}
	if c := r.Churn; c != nil {
		fmt.Fprintf(w, "\n== Scenario 5: churn — %d pods created and deleted under a 7-day rule, %d live at a time (%.0f pods/s); heap after a forced GC\n", c.Pods, c.Live, c.Rate)
		fmt.Fprintln(w, "pods seen\tlive\theap in use\theap objects\tRSS\tpods scheduled")
		for _, p := range append(c.Points, c.Final) {
			fmt.Fprintf(w, "%d\t%d\t%s\t%.0f\t%s\t%.0f\n", p.Seen, p.Live, mib(p.HeapInuse), p.HeapObjects, mib(p.RSS), p.Scheduled)
		}
		fmt.Fprintf(w, "per pod seen:\t\t%.0f B\t%.3f\t%.0f B\t\n", c.PerSeen.HeapBytes, c.PerSeen.Objects, c.PerSeen.RSSBytes)
		fmt.Fprintf(w, "per live pod:\t\t%.0f B\t%.2f\t%.0f B\t\n", c.PerLive.HeapBytes, c.PerLive.Objects, c.PerLive.RSSBytes)
		fmt.Fprintf(w, "podjanitor: CPU %.1f s, peak RSS %s\n", c.CPU, mib(c.PeakRSS))
	}
	if rc := r.Recovery; rc != nil {
		fmt.Fprintf(w, "\n== Scenario 6: recovery — %d pods come due while kube-apiserver is stopped (%.1f s from stop to ready again; start took %.1f s)\n",
			rc.Pods, rc.OutageSeconds, rc.StartSeconds)
		fmt.Fprintln(w, "removal − API server ready\tp50\tp90\tp99\tlast\tnot removed")
		a := rc.AfterRecovery
		fmt.Fprintf(w, "\t%s\t%s\t%s\t%s\t%d\n", ms(a.P50), ms(a.P90), ms(a.P99), ms(a.Max), rc.NotRemoved)
		printRequests(w, "recovery", rc.Requests)
	}
	if p := r.Peer; p != nil {
		printPeer(w, p)
	}
	if k := r.Kyverno; k != nil {
		printKyverno(w, k)
	}
	if c := r.Clock; c != nil {
		printClock(w, c)
	}
	if t := r.Takeover; t != nil {
		printTakeover(w, t)
	}
	_ = w.Flush()
	if t := r.Tenants; t != nil {
		printTenants(w0, t)
	}
}

// printIdeal prints the steady runs' ideal remover beside podjanitor.
func printIdeal(w *tabwriter.Writer, runs []*steadyResult) {
	header := false
	for _, s := range runs {
		id := s.Ideal
		if id == nil {
			continue
		}
		if !header {
			fmt.Fprintf(w, "\n== Scenario 1 beside the ideal remover (the driver removes the same pods in a namespace of its own, a timer per pod at its deadline, a DELETE with podjanitor's client settings; the same watcher, the same run)\n")
			fmt.Fprintln(w, "window\tremover\tremoved\tp50\tp90\tp99\tmax\tearly\tnot removed\tcreated late")
			header = true
		}
		for _, x := range []struct {
			name                             string
			l                                latency
			removed, early, notRemoved, late int
		}{
			{"podjanitor", s.All, s.Removed, s.Early, s.NotRemoved, s.CreatedLate},
			{"ideal", id.Lateness, id.Removed, id.Early, id.NotRemoved, id.CreatedLate},
		} {
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", s.Window, x.name, x.removed,
				ms(x.l.P50), ms(x.l.P90), ms(x.l.P99), ms(x.l.Max), x.early, x.notRemoved, x.late)
		}
		if v := s.VsIdeal; v != nil {
			fmt.Fprintf(w, "window %s: podjanitor / ideal: p50 %.2f× (%+.1f ms), p99 %.2f× (%+.1f ms)\n", s.Window, v.P50Ratio, v.P50DiffMs, v.P99Ratio, v.P99DiffMs)
		}
		fmt.Fprintf(w, "window %s: ideal's timer ran p50 %s, p99 %s, max %s after the deadline; its DELETE took p50 %s, p99 %s, max %s; %d DELETE errors\n",
			s.Window, ms(id.TimerLate.P50), ms(id.TimerLate.P99), ms(id.TimerLate.Max), ms(id.Delete.P50), ms(id.Delete.P99), ms(id.Delete.Max), id.DeleteErrors)
	}
}

func printRequests(w *tabwriter.Writer, title string, r apiRequests) {
	fmt.Fprintf(w, "%s: %.0f pods removed; API requests by method %v, by code %v; per removed pod: %.3f writes (%.3f DELETE, %.3f event POST); GET (LIST/WATCH) total %.0f\n",
		title, r.Removed, roundMap(r.ByMethod), roundMap(r.ByCode), r.WritesPerPod, r.DeletesPerPod, r.EventsPerPod, r.GetsTotal)
}

func roundMap(m map[string]float64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range m {
		if v != 0 {
			out[k] = int64(math.Round(v))
		}
	}
	return out
}

func compactConfig(c map[string]any) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%v", k, c[k]))
	}
	return strings.Join(parts, " ")
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

func ms(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	if v >= 1000 {
		return fmt.Sprintf("%.2f s", v/1000)
	}
	return fmt.Sprintf("%.1f ms", v)
}
