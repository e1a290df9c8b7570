//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
)

// alertMargin is how long after its (shortened) `for:` an alert may take to
// fire once its fault is in place: the fault must first show in a scrape
// (every 2 s) and a rule evaluation (every 1 s), and the machine is busy.
const alertMargin = 45 * time.Second

// promEnv is what the Prometheus scenarios share: the real node's address, on
// which every podjanitor serves /metrics, and the PodMonitor they are
// scraped through.
type promEnv struct {
	nodeIP string
	pm     podMonitor

	mu   sync.Mutex
	rows []firingRow
}

// firingRow is one alert's line in the table the test logs.
type firingRow struct {
	alert, namespace    string
	shippedFor, testFor time.Duration
	took, bound         time.Duration
	fired               bool
	fault               string
}

// ran says whether the scenario of alert has run.
func (e *promEnv) ran(alert string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.ContainsFunc(e.rows, func(r firingRow) bool { return r.alert == alert })
}

func (e *promEnv) record(r firingRow) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rows = append(e.rows, r)
}

// promNamespace creates a namespace named for a scenario, as newNamespace does.
func promNamespace(t *testing.T, scenario string) string {
	t.Helper()
	ctx := ctxFor(t)
	name := fmt.Sprintf("e2e-prom-%s-%04d", scenario, rand.IntN(10000))
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("namespace %s: default ServiceAccount never appeared: %v", name, err)
	}
	return name
}

// realNodeAddress returns the real node's InternalIP: the host's address on
// the node's bridge, which is the address of the node's hostNetwork pods.
func realNodeAddress(t *testing.T) string {
	t.Helper()
	node, err := client.CoreV1().Nodes().Get(ctxFor(t), realNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Prometheus tests need the local cluster's real node (REAL_NODE=1): %v", err)
	}
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	t.Fatalf("node %s has no InternalIP: %v", realNodeName, node.Status.Addresses)
	return ""
}

// janitor starts a podjanitor process for namespace ns that serves /metrics
// on the real node's address, and its stand-in pod: a hostNetwork pod on the
// real node with the Deployment's labels and container port, so that
// Prometheus discovers it through the Kubernetes API (role: pod) and scrapes
// the process at the pod's address (the node's) as it scrapes a replica of
// the Deployment. waitFor is the log line to wait for ("" for startDaemon's).
func (e *promEnv) janitor(t *testing.T, ns, pod, waitFor string, args ...string) *daemon {
	t.Helper()
	d, port := e.process(t, ns, waitFor, args...)
	e.standIn(t, ns, pod, e.pm.Spec.Selector.MatchLabels, "metrics", port)
	return d
}

// process is janitor without the stand-in pod; it returns the metrics port.
func (e *promEnv) process(t *testing.T, ns, waitFor string, args ...string) (*daemon, string) {
	t.Helper()
	if waitFor == "" {
		waitFor = "Started workers"
	}
	// HTTPS with TokenReview and SubjectAccessReview, as artifacts/deploy runs it.
	d := startDaemonWaiting(t, waitFor, append([]string{"--namespace", ns, "--metrics-bind-address", e.nodeIP + ":0", "--metrics-secure"}, args...)...)
	d.waitLog("Serving metrics endpoint", 30*time.Second)
	_, port, err := net.SplitHostPort(d.endpoints()["metrics"])
	if err != nil {
		t.Fatalf("metrics endpoint %q: %v", d.endpoints()["metrics"], err)
	}
	return d, port
}

// standIn creates a hostNetwork pod on the real node running the pause image,
// with labels and one container port, and waits until it runs.
func (e *promEnv) standIn(t *testing.T, ns, name string, labels map[string]string, portName, port string) *corev1.Pod {
	t.Helper()
	var n int32
	if _, err := fmt.Sscan(port, &n); err != nil {
		t.Fatalf("port %q: %v", port, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels,
			// Not podjanitor's to remove, whatever its policy.
			Annotations: map[string]string{prefix + "keep": "true"}},
		Spec: corev1.PodSpec{
			NodeName:    realNodeName,
			HostNetwork: true,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "podjanitor", Image: "local/pause:1", ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{Name: portName, ContainerPort: n, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
	created, err := client.CoreV1().Pods(ns).Create(ctxFor(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("stand-in pod %s/%s: %v", ns, name, err)
	}
	var got *corev1.Pod
	err = wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err = client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning && got.Status.PodIP != "", nil
	})
	if err != nil {
		t.Fatalf("stand-in pod %s/%s does not run on %s: %v (status %+v)", ns, name, realNodeName, err, got.Status)
	}
	return created
}

// waitScraped waits until Prometheus has podjanitor_build_info from n or more
// targets of namespace ns.
func waitScraped(t *testing.T, p *promServer, ns string, n int) time.Time {
	t.Helper()
	expr := fmt.Sprintf(`count(podjanitor_build_info{namespace=%q})`, ns)
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		// At least n: two replicas' first scrapes may land in one round.
		if r, err := p.query(expr); err == nil && len(r) == 1 {
			if got, err := strconv.Atoi(fmt.Sprint(r[0].Value[1])); err == nil && got >= n {
				return time.Now()
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	targets, _ := p.targets()
	t.Fatalf("prometheus does not scrape %d podjanitor(s) of namespace %s after 90s (%s); its active targets: %+v", n, ns, expr, targets)
	return time.Time{}
}

// expectFiring waits until alert fires for namespace ns (no namespace: the
// alert without one) and records how long that took after faultAt.
func (e *promEnv) expectFiring(t *testing.T, p *promServer, alert, ns, fault string, faultAt time.Time, shipped, short map[string]time.Duration, extra time.Duration) {
	t.Helper()
	bound := short[alert] + extra + alertMargin
	match := map[string]string{}
	if ns != "" {
		match["namespace"] = ns
	}
	at, ok := p.waitFiring(alert, match, time.Until(faultAt.Add(bound)))
	row := firingRow{alert: alert, namespace: ns, shippedFor: shipped[alert], testFor: short[alert], bound: bound, fired: ok, fault: fault}
	if ok {
		row.took = at.Sub(faultAt)
		t.Logf("%s fired %v after the fault (%s); for: %v, bound %v", alert, row.took.Round(100*time.Millisecond), fault, short[alert], bound)
	} else {
		alerts, _ := p.alerts()
		t.Errorf("%s did not fire for namespace %q within %v of the fault (%s); alerts: %v", alert, ns, bound, fault, alerts)
	}
	e.record(row)
}

// firingOver returns the alerts (name/namespace) that fired in Prometheus at
// any time between from and to whose labels match the selector.
func firingOver(t *testing.T, p *promServer, selector string, from, to time.Time) []string {
	t.Helper()
	res, err := p.queryRange(fmt.Sprintf(`ALERTS{alertstate="firing"%s}`, selector), from, to, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range res {
		out = append(out, r.Metric["alertname"]+"/"+r.Metric["namespace"])
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// TestPrometheusAlerts runs a real Prometheus (hack/install-prometheus.sh)
// against the local cluster, configured from the shipped monitoring kit:
// the scrape configuration prometheus-operator generates from
// artifacts/monitoring/podmonitor.yaml (Kubernetes service discovery of
// pods, role: pod, with its selection and relabelling) and the shipped
// PrometheusRule's groups as its rule file, each `for:` divided by 60 (15m
// becomes 15s) and evaluated every second; the expressions are the shipped
// ones. podjanitor runs as processes on the host, each with a stand-in pod
// (hostNetwork, on the real node, with the Deployment's labels and port
// name) that Prometheus discovers and scrapes as it does a replica of the
// Deployment, over HTTPS with the token of artifacts/monitoring's metrics
// reader (podjanitor runs with --metrics-secure, as artifacts/deploy does:
// each scrape passes its TokenReview and SubjectAccessReview); each
// installation has a namespace of its own, so alerts,
// which are per namespace and job, tell them apart (PodJanitorAbsent, which
// has no namespace, gets a Prometheus of its own). Processes rather than the
// Deployment's pods: the faults need the fault proxy between podjanitor and
// the API server, and each installation is scoped (--namespace) to run beside
// the rest of the suite; what Prometheus does (discovery, relabelling, the
// pod's address and named port, TLS, the token) is what it does with the
// Deployment.
//
// Each scenario breaks one installation and waits for its alert to fire
// within the shortened `for:` plus alertMargin: the target absent
// (process killed), no leader (two replicas, the Lease held by another
// holder), a leader without workers (the fault proxy answers 500 to its
// pod list, so its caches never sync), a rejected policy reload, removal errors (the fault proxy
// answers 500 to DELETE), refused removals (two PodDisruptionBudgets over
// the pod), evictions blocked (a PodDisruptionBudget), removals late (the
// fault proxy holds each DELETE 63 s) and the namespace watch failing (403
// to the namespace list and watch). Asserted too: only the scenario's alert
// fires in its namespace; a healthy installation and a dry-run one, scraped
// for the whole run, fire none; Prometheus scrapes the stand-in pods only,
// not pods without the labels or without the port name. Then every query of
// the shipped Grafana dashboard returns data over the run
// (TestPrometheusAlerts/Dashboard).
func TestPrometheusAlerts(t *testing.T) {
	t.Parallel()
	start := time.Now()
	e := &promEnv{nodeIP: realNodeAddress(t), pm: readPodMonitor(t)}
	rules, shipped, short := shortenedRuleGroups(t)
	t.Logf("rule file (the shipped groups, `for:` divided by %d):\n%s", forDivisor, rules)
	if len(short) < 8 {
		t.Fatalf("only %d alerts in %s", len(short), prometheusRuleFile)
	}

	scenarios := []string{"healthy", "dryrun", "noleader", "noworkers", "policy", "errors", "refused", "blocked", "late", "backlog", "nswatch", "held"}
	ns := map[string]string{}
	for _, s := range scenarios {
		ns[s] = promNamespace(t, s)
	}
	absentNS := promNamespace(t, "absent")
	secretFile := installMetricsReader(t, append(slices.Collect(maps.Values(ns)), absentNS))
	var scrape []map[string]any
	for _, s := range scenarios {
		scrape = append(scrape, podMonitorScrapeConfigs(t, e.pm, ns[s], kubeconfig, promScrapeInterval, secretFile(ns[s]))...)
	}

	// The healthy installations run for the whole test, the shipped default
	// policy and the Deployment's leader election included; pods due every
	// few seconds give them removals to report.
	defaultPolicy, err := os.ReadFile("../../artifacts/policy-default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policyPath := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyPath, defaultPolicy, 0o644); err != nil {
		t.Fatal(err)
	}
	elect := func(n string) []string {
		return []string{"--leader-elect", "--leader-elect-resource-namespace", n, "--leader-elect-lease-duration", "15s"}
	}
	e.janitor(t, ns["healthy"], "podjanitor-healthy", "", append(elect(ns["healthy"]), "--config", policyPath)...)
	e.janitor(t, ns["dryrun"], "podjanitor-dryrun", "", "--dry-run", "--config", policyPath)
	// Decoys that the PodMonitor must not select: the labels without the
	// port name, and the port name without the labels.
	e.standIn(t, ns["healthy"], "decoy-other-port", e.pm.Spec.Selector.MatchLabels, "health", freePort(t, e.nodeIP))
	e.standIn(t, ns["healthy"], "decoy-no-labels", map[string]string{"app": "other"}, "metrics", freePort(t, e.nodeIP))
	stopRemovals := make(chan struct{})
	removalsDone := make(chan struct{})
	go func() { // a pod due every 3 s in each healthy namespace, deleted and evicted in turn
		defer close(removalsDone)
		for i := 0; ; i++ {
			select {
			case <-stopRemovals:
				return
			case <-time.After(3 * time.Second):
			}
			for _, n := range []string{ns["healthy"], ns["dryrun"]} {
				opts := []podOpt{ttl(2 * time.Second), unscheduled}
				if i%2 == 1 {
					opts = []podOpt{ttl(2 * time.Second), onNode}
				}
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("due-%d", i), Namespace: n},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "fake-image"}}}}
				for _, o := range opts {
					o(pod)
				}
				_, _ = client.CoreV1().Pods(n).Create(context.Background(), pod, metav1.CreateOptions{})
			}
		}
	}()
	t.Cleanup(func() { close(stopRemovals); <-removalsDone })

	// PodJanitorAbsent's installation, started before its Prometheus, as
	// the others are before theirs: the alert is pending until the first
	// scrape, which a `for:` of seconds must not outlast.
	absent := e.janitor(t, absentNS, "podjanitor-absent", "")

	prom := startPrometheus(t, "shared", scrape, rules)
	promAbsent := startPrometheus(t, "absent", podMonitorScrapeConfigs(t, e.pm, absentNS, kubeconfig, promScrapeInterval, secretFile(absentNS)), rules)
	waitScraped(t, prom, ns["healthy"], 1)
	waitScraped(t, prom, ns["dryrun"], 1)

	t.Run("SelectsTheStandInPodsOnly", func(t *testing.T) {
		targets, err := prom.targets()
		if err != nil {
			t.Fatal(err)
		}
		var pods []string
		for _, tg := range targets {
			if tg.Labels["namespace"] != ns["healthy"] {
				continue
			}
			pods = append(pods, tg.Labels["pod"])
			want := map[string]string{"job": ns["healthy"] + "/" + e.pm.Metadata.Name, "namespace": ns["healthy"],
				"pod": "podjanitor-healthy", "container": "podjanitor", "endpoint": "metrics"}
			for k, v := range want {
				if tg.Labels[k] != v {
					t.Errorf("target %s: label %s=%q, want %q (labels %v)", tg.ScrapeURL, k, tg.Labels[k], v, tg.Labels)
				}
			}
			if !strings.HasPrefix(tg.ScrapeURL, "https://") {
				t.Errorf("target %s: not scraped over HTTPS", tg.ScrapeURL)
			}
			if tg.Health != "up" {
				t.Errorf("target %s: health %s (%s)", tg.ScrapeURL, tg.Health, tg.LastError)
			}
		}
		if !slices.Equal(pods, []string{"podjanitor-healthy"}) {
			t.Errorf("scraped pods of %s: %q, want only the stand-in podjanitor-healthy (not the decoys)", ns["healthy"], pods)
		}
	})

	t.Run("Alerts", func(t *testing.T) {
		t.Run("PodJanitorAbsent", func(t *testing.T) {
			t.Parallel()
			waitScraped(t, promAbsent, absentNS, 1)
			time.Sleep(short["PodJanitorAbsent"] + 5*time.Second) // healthy for longer than the alert's for:
			if f := firingOver(t, promAbsent, "", start, time.Now()); len(f) > 0 {
				t.Errorf("alerts fired while podjanitor ran: %q", f)
			}
			absent.kill()
			e.expectFiring(t, promAbsent, "PodJanitorAbsent", "", "process killed", time.Now(), shipped, short, 0)
		})

		t.Run("PodJanitorNoLeader", func(t *testing.T) {
			t.Parallel()
			n := ns["noleader"]
			holdLease(t, n, "podjanitor", "elsewhere")
			var ports []string
			for range 2 {
				d, port := e.process(t, n, "Serving metrics endpoint", elect(n)...)
				d.waitLog("Failed to acquire lease", 30*time.Second) // another holds it
				ports = append(ports, port)
			}
			for i, port := range ports {
				e.standIn(t, n, fmt.Sprintf("podjanitor-%d", i), e.pm.Spec.Selector.MatchLabels, "metrics", port)
			}
			// No replica leads from the first scrape on.
			at := waitScraped(t, prom, n, 1)
			e.expectFiring(t, prom, "PodJanitorNoLeader", n, "two replicas, the Lease held by another holder", at, shipped, short, 0)
			waitScraped(t, prom, n, 2)
			if _, ok := prom.waitFiring("PodJanitorNoLeader", map[string]string{"namespace": n}, 5*time.Second); !ok {
				t.Error("PodJanitorNoLeader stopped firing with both replicas scraped")
			}
		})

		t.Run("PodJanitorLeaderWithoutWorkers", func(t *testing.T) {
			t.Parallel()
			n := ns["noworkers"]
			proxy := newFaultProxy(t)
			proxy.inject(&fault{Method: http.MethodGet, Namespace: n, Status: http.StatusInternalServerError,
				Match: func(r proxiedRequest) bool { return r.isList() }})
			d := e.janitor(t, n, "podjanitor-noworkers", "Starting controller", append(elect(n), "--kubeconfig", proxy.kubeconfig(t))...)
			at := waitScraped(t, prom, n, 1)
			e.expectFiring(t, prom, "PodJanitorLeaderWithoutWorkers", n, "500 to the leader's pod list", at, shipped, short, 0)
			if d.logContains("Started workers") {
				t.Error("workers started with the pod list failing")
			}
		})

		t.Run("PodJanitorPolicyRejected", func(t *testing.T) {
			t.Parallel()
			n := ns["policy"]
			cfg := writePolicy(t, "", "  - name: nothing\n    match: {labelSelector: \"never=ever\"}\n    clock: created\n    after: 1h\n")
			d := e.janitor(t, n, "podjanitor-policy", "", "--config", cfg)
			waitScraped(t, prom, n, 1)
			writePolicy(t, cfg, "  - name: invalid\n    clock: created\n    after: soon\n")
			at := time.Now()
			d.waitLog("Rejected the changed policy file", 30*time.Second)
			e.expectFiring(t, prom, "PodJanitorPolicyRejected", n, "an invalid policy file", at, shipped, short, 0)
		})

		t.Run("PodJanitorRemovalErrors", func(t *testing.T) {
			t.Parallel()
			n := ns["errors"]
			proxy := newFaultProxy(t)
			proxy.inject(&fault{Method: http.MethodDelete, Namespace: n, Status: http.StatusInternalServerError})
			e.janitor(t, n, "podjanitor-errors", "", "--kubeconfig", proxy.kubeconfig(t))
			waitScraped(t, prom, n, 1)
			due := time.Now().Add(3 * time.Second)
			for i := range 3 {
				createPod(t, n, fmt.Sprintf("failing-%d", i), unscheduled, expiresAt(due))
			}
			e.expectFiring(t, prom, "PodJanitorRemovalErrors", n, "500 to every DELETE", due, shipped, short, 0)
		})

		// Scenario's Running pod, with a ttl of 1s, under PodDisruptionBudgets
		// that refuse its eviction: alert fires in its namespace.
		guarded := func(t *testing.T, scenario, alert, cause string, budgets ...policyv1.PodDisruptionBudgetSpec) {
			n := ns[scenario]
			for i, spec := range budgets {
				createBudget(t, n, fmt.Sprintf("budget-%d", i), "guarded", spec)
			}
			e.janitor(t, n, "podjanitor-"+scenario, "")
			waitScraped(t, prom, n, 1)
			pod := createPod(t, n, "guarded", onNode, label("app", "guarded"))
			waitPod(t, pod, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
			patchPodAnnotation(t, pod, prefix+"ttl", "1s")
			e.expectFiring(t, prom, alert, n, cause, time.Now(), shipped, short, 0)
		}
		t.Run("PodJanitorRemovalsRefused", func(t *testing.T) {
			t.Parallel()
			none := policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrTo(intstr.FromInt32(0))}
			guarded(t, "refused", "PodJanitorRemovalsRefused", "two PodDisruptionBudgets over the pod", none, none)
		})
		t.Run("PodJanitorEvictionsBlocked", func(t *testing.T) {
			t.Parallel()
			guarded(t, "blocked", "PodJanitorEvictionsBlocked", "a PodDisruptionBudget refuses the eviction",
				policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrTo(intstr.FromInt32(1))})
		})

		t.Run("PodJanitorRemovalsLate", func(t *testing.T) {
			t.Parallel()
			const slow = 63 * time.Second // over the alert's 60 s
			n := ns["late"]
			proxy := newFaultProxy(t)
			proxy.inject(&fault{Method: http.MethodDelete, Namespace: n, Delay: slow})
			e.janitor(t, n, "podjanitor-late", "", "--kubeconfig", proxy.kubeconfig(t), "--write-timeout", "2m")
			waitScraped(t, prom, n, 1)
			due := time.Now().Add(3 * time.Second)
			for i := range 2 {
				createPod(t, n, fmt.Sprintf("slow-%d", i), unscheduled, expiresAt(due))
			}
			e.expectFiring(t, prom, "PodJanitorRemovalsLate", n, fmt.Sprintf("each DELETE held %v", slow), due, shipped, short, slow)
		})

		t.Run("PodJanitorRemovalBacklog", func(t *testing.T) {
			t.Parallel()
			// 30 overdue pods at one removal per 100 s: 29 wait, 2,900 s
			// to remove, over the alert's 30 minutes. The second removal
			// would be 100 s late, so the installation stops once the alert
			// fired, before PodJanitorRemovalsLate could.
			n := ns["backlog"]
			due := time.Now().Add(-time.Second)
			for i := range 30 {
				createPod(t, n, fmt.Sprintf("overdue-%d", i), unscheduled, expiresAt(due))
			}
			d := e.janitor(t, n, "podjanitor-backlog", "", "--max-deletions-per-second", "0.01", "--deletion-burst", "1", "--hold-waves=false")
			at := time.Now()
			waitScraped(t, prom, n, 1)
			e.expectFiring(t, prom, "PodJanitorRemovalBacklog", n, "29 pods waiting at 0.01 removals/s", at, shipped, short, 0)
			d.kill()
		})

		t.Run("PodJanitorRemovalsHeld", func(t *testing.T) {
			t.Parallel()
			n := ns["held"]
			r := watchRemovals(t, n)
			pods := wavePods(t, n, "yes", 150)
			cfg := writePolicy(t, "", fmt.Sprintf(waveRule, "168h"))
			d := e.janitor(t, n, "podjanitor-held", "", "--config", cfg, "--leader-elect-resource-namespace", n)
			waitScraped(t, prom, n, 1)
			writePolicy(t, cfg, fmt.Sprintf(waveRule, "1s")) // every pod due at once: held
			at := time.Now()
			d.waitLog("Holding the removals of the reloaded policy", 30*time.Second)
			e.expectFiring(t, prom, "PodJanitorRemovalsHeld", n, "a policy reload making 150 pods due at once", at, shipped, short, 0)
			noneRemoved(t, r, pods)
		})

		t.Run("PodJanitorNamespaceWatchFailing", func(t *testing.T) {
			t.Parallel()
			n := ns["nswatch"]
			proxy := newFaultProxy(t)
			e.janitor(t, n, "podjanitor-nswatch", "", "--kubeconfig", proxy.kubeconfig(t))
			waitScraped(t, prom, n, 1)
			f := &fault{Status: http.StatusForbidden, Match: namespaceRequests(false)}
			proxy.inject(f)
			at := time.Now()
			proxy.endWatches()
			e.expectFiring(t, prom, "PodJanitorNamespaceWatchFailing", n, "403 to the namespace list and watch", at, shipped, short, 0)
		})
	})
	end := time.Now()

	t.Run("OnlyTheBrokenInstallationsAlert", func(t *testing.T) {
		want := map[string]string{"noleader": "PodJanitorNoLeader", "noworkers": "PodJanitorLeaderWithoutWorkers", "policy": "PodJanitorPolicyRejected", "errors": "PodJanitorRemovalErrors",
			"refused": "PodJanitorRemovalsRefused", "blocked": "PodJanitorEvictionsBlocked", "late": "PodJanitorRemovalsLate",
			"backlog": "PodJanitorRemovalBacklog", "nswatch": "PodJanitorNamespaceWatchFailing", "held": "PodJanitorRemovalsHeld"}
		for _, s := range scenarios {
			if want[s] != "" && !e.ran(want[s]) {
				continue // not run (go test -run)
			}
			got := firingOver(t, prom, fmt.Sprintf(",namespace=%q", ns[s]), start, end)
			var w []string
			if want[s] != "" {
				w = []string{want[s] + "/" + ns[s]}
			}
			if !slices.Equal(got, w) {
				t.Errorf("namespace %s (%s): fired %q, want %q", ns[s], s, got, w)
			}
		}
		if got := firingOver(t, prom, `,namespace=""`, start, end); len(got) > 0 {
			t.Errorf("alerts without a namespace fired while podjanitor ran: %q", got)
		}
		t.Logf("healthy run of %v: no alert fired for %s and %s", end.Sub(start).Round(time.Second), ns["healthy"], ns["dryrun"])
	})

	t.Run("Dashboard", func(t *testing.T) {
		// A run with removals, real and dry-run, seen by more than one scrape.
		for _, q := range []string{
			fmt.Sprintf(`sum(podjanitor_pods_removed_total{dry_run="false",namespace=%q})`, ns["healthy"]),
			fmt.Sprintf(`sum(podjanitor_pods_removed_total{dry_run="true",namespace=%q})`, ns["dryrun"]),
		} {
			prom.waitQuery(t, q, time.Minute, func(r []promResult) bool { return len(r) == 1 && fmt.Sprint(r[0].Value[1]) != "0" })
		}
		time.Sleep(3 * 2 * time.Second)
		// Only the broken installations give the API-error panel's failed
		// requests.
		var skip []string
		if !e.ran("PodJanitorRemovalErrors") {
			skip = append(skip, `code!~"2.."`)
		}
		checkDashboard(t, prom, start, time.Now(), ns["healthy"], skip...)
	})

	e.mu.Lock()
	defer e.mu.Unlock()
	sort.Slice(e.rows, func(i, j int) bool { return e.rows[i].alert < e.rows[j].alert })
	var b strings.Builder
	fmt.Fprintf(&b, "%-32s %-10s %-9s %-12s %-10s %s\n", "alert", "shipped for", "test for", "fired after", "bound", "fault")
	for _, r := range e.rows {
		took := "NOT FIRED"
		if r.fired {
			took = r.took.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, "%-32s %-10v %-9v %-12s %-10v %s\n", r.alert, r.shippedFor, r.testFor, took, r.bound, r.fault)
	}
	t.Logf("alerts (for: divided by %d, scrape every %s, rules every %s):\n%s", forDivisor, promScrapeInterval, promEvalInterval, b.String())
}

// freePort returns a port nothing listens on at host.
func freePort(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// holdLease creates the Lease as held by holder and renews it every 2 s
// until the test ends.
func holdLease(t *testing.T, ns, name, holder string) {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: ptrTo(int32(15)), AcquireTime: &now, RenewTime: &now}}
	if _, err := client.CoordinationV1().Leases(ns).Create(ctxFor(t), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			l, err := client.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != holder {
				t.Errorf("the Lease %s/%s was taken by %v", ns, name, l.Spec.HolderIdentity)
				return
			}
			renew := metav1.NewMicroTime(time.Now())
			l.Spec.RenewTime = &renew
			_, _ = client.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
		}
	}()
}

func patchPodAnnotation(t *testing.T, pod *corev1.Pod, key, value string) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if _, err := client.CoreV1().Pods(pod.Namespace).Patch(ctxFor(t), pod.Name, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// grafanaVariable matches the dashboard's template variables and Grafana's
// built-in interval variables.
var grafanaVariable = regexp.MustCompile(`\$\{?(__rate_interval|__interval|__range|namespace)\}?`)

// checkDashboard runs every panel query of the shipped dashboard, its
// template variables substituted as Grafana would with "All" selected, over
// the run, and fails for each that returns no series.
func checkDashboard(t *testing.T, p *promServer, from, to time.Time, healthyNS string, skip ...string) {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				AllValue   string `json:"allValue"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dashboard); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	// The namespace variable: label_values(metric, label), as Grafana asks
	// Prometheus for it; "All" is its allValue.
	all := map[string]string{}
	labelValues := regexp.MustCompile(`^label_values\((\w+), *(\w+)\)$`)
	for _, v := range dashboard.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		var values []string
		if err := p.api("/api/v1/label/"+m[2]+"/values", url.Values{"match[]": {m[1]}}, &values); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(values, healthyNS) {
			t.Errorf("variable %s (%s) = %q, without the healthy installation's %s", v.Name, v.Definition, values, healthyNS)
		}
		all[v.Name] = v.AllValue
	}
	// Grafana's $__rate_interval with Prometheus's default 15 s scrape
	// interval in the data source: max(4 × 15s, $__interval + 15s).
	const rateInterval = "1m"
	queries := 0
	for _, panel := range dashboard.Panels {
		for _, target := range panel.Targets {
			expr := grafanaVariable.ReplaceAllStringFunc(target.Expr, func(v string) string {
				name := grafanaVariable.FindStringSubmatch(v)[1]
				if value, ok := all[name]; ok {
					return value
				}
				return rateInterval
			})
			if strings.Contains(expr, "$") {
				t.Errorf("panel %q: an unknown variable in %s", panel.Title, target.Expr)
				continue
			}
			queries++
			if slices.ContainsFunc(skip, func(s string) bool { return strings.Contains(expr, s) }) {
				t.Logf("panel %q: not checked (the scenario that gives it data did not run): %s", panel.Title, expr)
				continue
			}
			res, err := p.queryRange(expr, from, to, 5*time.Second)
			switch {
			case err != nil:
				t.Errorf("panel %q: %s: %v", panel.Title, expr, err)
			case len(res) == 0:
				t.Errorf("panel %q: %s returned no series over the run", panel.Title, expr)
			default:
				t.Logf("panel %q: %d series: %s", panel.Title, len(res), expr)
			}
		}
	}
	if queries < 10 {
		t.Errorf("only %d queries in %s", queries, dashboardFile)
	}
}

// TestPlainPrometheusScrapeConfigDocumented: docs/operations.md shows the
// scrape configuration that the Prometheus tests generate from the shipped
// PodMonitor, for artifacts/deploy's namespace, its interval and Prometheus's
// in-cluster service discovery.
func TestPlainPrometheusScrapeConfigDocumented(t *testing.T) {
	t.Parallel()
	pm := readPodMonitor(t)
	// Where prometheus-operator mounts the Secrets of a Prometheus's spec.secrets.
	mounted := func(name, key string) string { return "/etc/prometheus/secrets/" + name + "/" + key }
	cfg, err := yaml.Marshal(map[string]any{"scrape_configs": podMonitorScrapeConfigs(t, pm, pm.Metadata.Namespace, "", "", mounted)})
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(docs), "```yaml\n"+string(cfg)+"```\n") {
		t.Errorf("docs/operations.md does not show the scrape configuration of the shipped PodMonitor; want this block:\n```yaml\n%s```", cfg)
	}
}

// installMetricsReader installs artifacts/monitoring/metrics-reader.yaml for
// each namespace: its ServiceAccount and token Secret there, and its
// ClusterRole bound to all of them (renamed for the test, so that it is
// nobody else's). It returns, per namespace, the secretFile of
// podMonitorScrapeConfigs: the Secret's key written to a file once the
// token controller has filled it in.
func installMetricsReader(t *testing.T, namespaces []string) func(ns string) func(name, key string) string {
	t.Helper()
	ctx := ctxFor(t)
	data, err := os.ReadFile(metricsReaderFile)
	if err != nil {
		t.Fatal(err)
	}
	var sa corev1.ServiceAccount
	var secret corev1.Secret
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", metricsReaderFile, err)
		}
		into := map[string]any{"ServiceAccount": &sa, "Secret": &secret, "ClusterRole": &role, "ClusterRoleBinding": &binding}[meta.Kind]
		if into == nil {
			t.Fatalf("%s: unexpected kind %q", metricsReaderFile, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("%s: %s: %v", metricsReaderFile, meta.Kind, err)
		}
	}
	if sa.Name == "" || secret.Name == "" || role.Name == "" || binding.Name == "" {
		t.Fatalf("%s: want a ServiceAccount, its token Secret, a ClusterRole and its binding", metricsReaderFile)
	}
	suffix := fmt.Sprintf("-e2e-prom-%04d", rand.IntN(10000))
	role.Name += suffix
	binding.Name += suffix
	binding.RoleRef.Name = role.Name
	binding.Subjects = nil
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	for _, n := range namespaces {
		sa, secret := sa.DeepCopy(), secret.DeepCopy()
		sa.Namespace, secret.Namespace = n, n
		if _, err := client.CoreV1().ServiceAccounts(n).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.CoreV1().Secrets(n).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: n})
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	dir := t.TempDir()
	return func(ns string) func(name, key string) string {
		return func(name, key string) string {
			t.Helper()
			var value []byte
			err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				s, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, nil
				}
				value = s.Data[key]
				return len(value) > 0, nil
			})
			if err != nil {
				t.Fatalf("Secret %s/%s has no %s (the token controller fills in a service-account-token Secret): %v", ns, name, key, err)
			}
			path := filepath.Join(dir, ns+"-"+name+"-"+key)
			if err := os.WriteFile(path, value, 0o600); err != nil {
				t.Fatal(err)
			}
			return path
		}
	}
}
