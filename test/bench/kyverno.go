package main

// The kyverno scenario: podjanitor, Kyverno's cleanup controller (its TTL
// manager, github.com/kyverno/kyverno v1.19.1, built by
// hack/build-kyverno.sh) and the ideal remover side by side on the same
// cluster in one run, each on its own copy of the same pods, all three with
// the same deadline: creationTimestamp + the pod's ttl (podjanitor.io/ttl,
// the label cleanup.kyverno.io/ttl).
//
// Kyverno runs as a real install would, as far as the TTL controller sees:
// its CRDs applied from its module's config/crds, the namespace kyverno, the
// environment of the chart's Deployment, a ServiceAccount token with the
// chart's cleanup-controller RBAC with pods as the one resource it may clean
// up (with an admin kubeconfig it starts a metadata informer for almost every
// resource type), its certificate controller and its validating webhooks
// (their URL https://127.0.0.1:<port>, which the local API server reaches):
// the TTL webhook is called for every labelled create, and costs what it
// costs a real install, but only at creation; the report splits each
// process's CPU into creation and expiry.

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	"github.com/podjanitor/podjanitor/internal/workload"
)

const (
	kyvernoNamespace      = "kyverno"
	kyvernoName           = "kyverno-cleanup-controller" // ServiceAccount, Deployment, Service (KYVERNO_SVC) and Lease, as the chart names them
	kyvernoTTLLabel       = "cleanup.kyverno.io/ttl"
	kyvernoTTLWebhook     = "kyverno-ttl-validating-webhook-cfg"
	kyvernoWebhookName    = kyvernoName + "." + kyvernoNamespace + ".svc" // the name of the webhook in it (and in the cleanup policies' one)
	kyvernoFlowSchema     = "bench-kyverno-cleanup-controller"
	kyvernoJanitorNS      = "bench-kyverno-podjanitor"
	kyvernoKyvernoNS      = "bench-kyverno-kyverno"
	kyvernoIdealNS        = "bench-kyverno-ideal"
	kyvernoProbeNamespace = "bench-kyverno-probe"
	podjanitorTTL         = "podjanitor.io/ttl"
)

// kyvernoSide is one remover's figures in the kyverno scenario. Lateness is
// the removal seen by the driver's watcher minus the pod's creationTimestamp
// plus its ttl.
type kyvernoSide struct {
	Namespace  string  `json:"namespace"`
	Lateness   latency `json:"lateness"`
	Removed    int     `json:"removed"`
	NotRemoved int     `json:"not_removed"`
	Early      int     `json:"removed_before_deadline"`
	// The process's (none for the ideal remover, which is the driver):
	// VmRSS when its last pod was removed and VmHWM; CPU from its start to
	// the start of creation, during creation, and from the end of creation
	// to its last removal.
	RSS            float64 `json:"rss_bytes,omitempty"`
	PeakRSS        float64 `json:"peak_rss_bytes,omitempty"`
	CPUSeconds     float64 `json:"cpu_seconds,omitempty"`
	StartCPU       float64 `json:"cpu_seconds_before_creation,omitempty"`
	CreationCPU    float64 `json:"cpu_seconds_during_creation,omitempty"`
	ExpiryCPU      float64 `json:"cpu_seconds_after_creation,omitempty"`
	Wall           float64 `json:"wall_seconds,omitempty"`
	cpuAt          [2]float64
	late           []time.Duration
	VsIdeal        *versusIdeal `json:"vs_ideal,omitempty"`
	ServerRequests float64      `json:"apiserver_requests,omitempty"` // Kyverno: dispatched in its FlowSchema
}

type kyvernoResult struct {
	Pods                int         `json:"pods"` // per namespace
	WindowSeconds       float64     `json:"window_seconds"`
	LeadSeconds         float64     `json:"lead_seconds"`
	ReconcileSeconds    float64     `json:"kyverno_ttl_reconciliation_interval_seconds"`
	CreateSeconds       float64     `json:"create_seconds"` // all three copies
	CreateRate          float64     `json:"create_pods_per_second"`
	KyvernoVersion      string      `json:"kyverno_version"`
	KyvernoWorkers      int         `json:"kyverno_ttl_workers"`
	Podjanitor          kyvernoSide `json:"podjanitor"`
	Kyverno             kyvernoSide `json:"kyverno"`
	Ideal               kyvernoSide `json:"ideal"`
	IdealFires          *idealSide  `json:"ideal_timer_and_delete"`
	PodjanitorHistogram histQ       `json:"podjanitor_histogram"`
	PodjanitorRequests  apiRequests `json:"podjanitor_api_requests"`
	// KyvernoRequests is Kyverno's own count of its client queries
	// (kyverno_client_queries_total) by operation and by resource kind;
	// Kyverno.ServerRequests the API server's count of the requests of
	// Kyverno's ServiceAccount (its FlowSchema), from start to its last removal.
	KyvernoRequests     map[string]float64 `json:"kyverno_client_queries_by_operation"`
	KyvernoRequestsKind map[string]float64 `json:"kyverno_client_queries_by_kind"`
	// Webhook is the API server's calls of Kyverno's TTL webhook (one per
	// labelled create) over the run and their duration.
	Webhook histQ `json:"ttl_webhook_admission"`
}

func (b *bench) kyverno(ctx context.Context) (*kyvernoResult, error) {
	n, window := b.cfg.pods, b.cfg.kyvernoWindow
	out := &kyvernoResult{Pods: n, WindowSeconds: window.Seconds(), ReconcileSeconds: b.cfg.kyvernoInterval.Seconds(), KyvernoWorkers: 3}
	command := strings.Fields(b.cfg.kyverno)
	info, err := buildinfo.ReadFile(command[0])
	if err != nil {
		return nil, fmt.Errorf("kyverno binary %s: %v (build it with hack/build-kyverno.sh)", command[0], err)
	}
	out.KyvernoVersion = "kyverno (version unknown)"
	for _, m := range append([]*debug.Module{&info.Main}, info.Deps...) {
		if m.Path == "github.com/kyverno/kyverno" {
			out.KyvernoVersion = "kyverno " + m.Version
		}
	}
	if b.cfg.kyvernoCRDs == "" {
		return nil, fmt.Errorf("-kyverno-crds: Kyverno's config/crds directory is needed (hack/bench.sh passes it)")
	}
	if err := b.applyCRDs(ctx, b.cfg.kyvernoCRDs); err != nil {
		return nil, err
	}
	namespaces := []string{kyvernoJanitorNS, kyvernoKyvernoNS, kyvernoIdealNS}
	for _, ns := range append([]string{kyvernoNamespace, kyvernoProbeNamespace}, namespaces...) {
		if err := b.ensureNamespace(ctx, ns); err != nil {
			return nil, err
		}
	}
	for _, ns := range namespaces {
		if existing, err := b.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return nil, err
		} else if len(existing.Items) > 0 {
			return nil, fmt.Errorf("namespace %s already has pods; use a fresh cluster", ns)
		}
	}
	kubeconfig, err := b.kyvernoIdentity(ctx)
	if err != nil {
		return nil, err
	}
	watchers := map[string]*peerTracker{}
	for _, ns := range namespaces {
		if watchers[ns], err = peerWatch(ctx, b.cs, ns); err != nil {
			return nil, err
		}
	}
	del, err := idealDeleter(b.rest, kyvernoIdealNS, b.cfg.qps, b.cfg.burst)
	if err != nil {
		return nil, err
	}
	ideal := newIdealRemover(ctx, clock.RealClock{}, del)
	defer ideal.stop()

	// podjanitor at its defaults, in its namespace: podjanitor.io/ttl.
	j, err := startJanitor(b.cfg, "kyverno", kyvernoJanitorNS, b.cfg.workers)
	if err != nil {
		return nil, err
	}
	defer j.stop()
	if _, err := j.waitReady(time.Minute); err != nil {
		return nil, err
	}
	k, err := startKyverno(b.cfg, command, kubeconfig)
	if err != nil {
		return nil, err
	}
	defer k.stop()
	if err := b.waitKyvernoReady(ctx, k); err != nil {
		return nil, err
	}
	rss := sampleRSS(j.started, time.Second, []string{"podjanitor", "Kyverno cleanup controller"}, j.proc, k.proc)
	serverBefore, err := apiServerMetrics(ctx, b.cs)
	if err != nil {
		return nil, err
	}
	kyvBefore, _ := k.scrape()

	// Deadlines uniform over the window from a lead at which creation (at
	// the rate measured so far, three copies) is over, as in steady: pod k's
	// ttl is its deadline minus the time its first copy is created, to the
	// millisecond (the creationTimestamp's truncation to the second moves
	// the deadline by less than a second). The three copies share the ttl.
	lead := b.cfg.lead
	if lead == 0 {
		lead = 20*time.Second + 2*time.Duration(float64(3*n)/b.createRate*float64(time.Second))
	}
	out.LeadSeconds = lead.Seconds()
	first := time.Now().Add(lead)
	var ttlMu sync.Mutex
	ttls := make([]time.Duration, n)
	ttlOf := func(k int) time.Duration {
		ttlMu.Lock()
		defer ttlMu.Unlock()
		if ttls[k] == 0 {
			target := first.Add(time.Duration((float64(k) + 0.5) / float64(n) * float64(window)))
			ttls[k] = max(time.Until(target), time.Second).Truncate(time.Millisecond) + time.Millisecond
		}
		return ttls[k]
	}
	logf("kyverno: %d pods in each of %s, %s and %s (the ideal remover), deadlines from +%.0fs over %s (%.1f/s each)",
		n, kyvernoJanitorNS, kyvernoKyvernoNS, kyvernoIdealNS, lead.Seconds(), window, float64(n)/window.Seconds())
	cpuMark := func(i int) {
		out.Podjanitor.cpuAt[i], out.Kyverno.cpuAt[i] = j.proc().CPUSecond, k.proc().CPUSecond
	}
	cpuMark(0)
	createdStart := time.Now()
	cr := createPodsThen(ctx, b.cs, 3*n, b.cfg.createConc, "kyverno", func(i int) *corev1.Pod {
		k, copy := kyvernoCopy(i)
		ttl := fmt.Sprintf("%dms", ttlOf(k).Milliseconds())
		pod := workload.Pod(copy, fmt.Sprintf("kyv-%06d", k), "kyverno", k, time.Time{}, "")
		delete(pod.Annotations, workload.AnnotationExpiresAt)
		if copy == kyvernoKyvernoNS {
			pod.Labels[kyvernoTTLLabel] = ttl
		} else {
			pod.Annotations[podjanitorTTL] = ttl // read by podjanitor; the ideal's copy carries it too
		}
		return pod
	}, false, func(i int, created *corev1.Pod) {
		if created.Namespace == kyvernoIdealNS {
			ideal.schedule(created.Name, created.UID, created.CreationTimestamp.Add(ttlOf(i/3)))
		}
	})
	if cr.errors > 0 {
		return out, fmt.Errorf("kyverno: %d pods failed to be created", cr.errors)
	}
	createdEnd := time.Now()
	cpuMark(1)
	out.CreateSeconds, out.CreateRate = cr.duration.Seconds(), cr.rate
	b.createRate = cr.rate
	if createdEnd.After(first) {
		logf("kyverno: creation ended %.1f s after the first deadline (-lead %s is short for this machine); those pods were due during creation",
			createdEnd.Sub(first).Seconds(), lead)
	}

	sides := []struct {
		side *kyvernoSide
		ns   string
		proc func() procStats
		wall func() float64
		done func()
	}{
		{&out.Podjanitor, kyvernoJanitorNS, j.proc, func() float64 { return time.Since(j.started).Seconds() }, func() {}},
		{&out.Kyverno, kyvernoKyvernoNS, k.proc, func() float64 { return time.Since(k.started).Seconds() }, func() {
			if m, err := apiServerMetrics(ctx, b.cs); err == nil {
				out.Kyverno.ServerRequests = m.minus(serverBefore).sum("apiserver_flowcontrol_dispatched_requests_total", `flow_schema="`+kyvernoFlowSchema+`"`)
			}
			if m, err := k.scrape(); err == nil {
				if kyvBefore != nil {
					m = m.minus(kyvBefore)
				}
				out.KyvernoRequests = m.byLabel("kyverno_client_queries_total", "operation")
				out.KyvernoRequestsKind = m.byLabel("kyverno_client_queries_total", "resource_kind")
			}
		}},
		{&out.Ideal, kyvernoIdealNS, nil, nil, func() {}},
	}
	done := make([]bool, len(sides))
	record := func(i int) {
		s := sides[i]
		s.side.Namespace = s.ns
		if s.proc != nil {
			p := s.proc()
			s.side.RSS, s.side.PeakRSS, s.side.CPUSeconds, s.side.Wall = float64(p.RSSBytes), float64(p.PeakRSS), p.CPUSecond, s.wall()
			s.side.StartCPU = s.side.cpuAt[0]
			s.side.CreationCPU = s.side.cpuAt[1] - s.side.cpuAt[0]
			s.side.ExpiryCPU = p.CPUSecond - s.side.cpuAt[1]
		}
		done[i] = true
		s.done()
	}
	profiled := b.profileRemovals(j, "kyverno-podjanitor-removals.cpu.pprof", time.Until(first.Add(window))+2*time.Second)
	timeout := time.Until(first.Add(window)) + 2*time.Minute
	start := time.Now()
	stop := progress(func() string {
		return fmt.Sprintf("kyverno: removed %d/%d by podjanitor, %d/%d by Kyverno, %d/%d by the ideal remover (%.0fs)",
			watchers[kyvernoJanitorNS].removed(), n, watchers[kyvernoKyvernoNS].removed(), n,
			watchers[kyvernoIdealNS].removed(), n, time.Since(start).Seconds())
	})
	for ctx.Err() == nil && time.Since(start) < timeout && slices.Contains(done, false) {
		for i, s := range sides {
			if !done[i] && watchers[s.ns].removed() >= n {
				record(i)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	<-profiled
	rssSeries := rss.stop()
	for i := range sides {
		if !done[i] {
			record(i)
		}
	}
	if ctx.Err() != nil {
		return out, ctx.Err()
	}
	if m, err := j.scrape(); err == nil {
		out.PodjanitorHistogram, out.PodjanitorRequests = latenessHistogram(m), requestsFrom(m)
	}
	if m, err := apiServerMetrics(ctx, b.cs); err == nil {
		out.Webhook = quantiles(m.minus(serverBefore).only(`name="`+kyvernoWebhookName+`"`),
			"apiserver_admission_webhook_admission_duration_seconds")
	}
	ideal.stop()
	fires := &idealSide{}
	fires.fillFires(ideal.results())
	out.IdealFires = fires
	deadline := func(name string, created time.Time) (time.Time, bool) {
		var k int
		if _, err := fmt.Sscanf(name, "kyv-%06d", &k); err != nil || k < 0 || k >= n {
			return time.Time{}, false
		}
		return created.Add(ttls[k]), true
	}
	for _, s := range sides {
		s.side.fill(watchers[s.ns].snapshot(), deadline)
	}
	for _, s := range []*kyvernoSide{&out.Podjanitor, &out.Kyverno} {
		v := compareToIdeal(s.Lateness, out.Ideal.Lateness)
		s.VsIdeal = &v
	}
	for _, s := range sides {
		logf("kyverno: %s: %d removed, lateness p50 %s p99 %s max %s, %d early, %d not removed; peak RSS %s, CPU %.1f s",
			s.ns, s.side.Removed, ms(s.side.Lateness.P50), ms(s.side.Lateness.P99), ms(s.side.Lateness.Max),
			s.side.Early, s.side.NotRemoved, mib(s.side.PeakRSS), s.side.CPUSeconds)
	}
	b.chart(b.writeLatenessCDF("kyverno-lateness",
		fmt.Sprintf("kyverno: lateness CDF, %d pods per remover over %s, deadline creationTimestamp + ttl", n, window),
		[]remover{{"podjanitor", out.Podjanitor.late}, {out.KyvernoVersion + " cleanup controller (TTL)", out.Kyverno.late}, {"ideal remover", out.Ideal.late}}))
	since := func(t time.Time) float64 { return t.Sub(j.started).Seconds() }
	b.chart(b.writeRSSChart("kyverno-rss", fmt.Sprintf("kyverno: RSS, %d pods per remover", n), rssSeries,
		[]chartMark{{"creation started", since(createdStart)}, {"creation ended", since(createdEnd)},
			{"first deadline", since(first)}, {"last deadline", since(first.Add(window))}}))
	return out, nil
}

// profileRemovals takes a CPU profile of podjanitor over d, from now, into
// name in the output directory, when podjanitor serves pprof (--profiling
// in -podjanitor); the channel closes when it is written or not taken.
func (b *bench) profileRemovals(j *janitor, name string, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	if !strings.Contains(b.cfg.podjanitor, "--profiling") {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(j.metricsURL, "/metrics"), max(1, int(d.Seconds())))
		resp, err := (&http.Client{Timeout: d + time.Minute}).Get(url)
		if err != nil {
			logf("profile: %v", err)
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			logf("profile: %s: %s %v", url, resp.Status, err)
			return
		}
		path := filepath.Join(b.cfg.outDir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			logf("profile: %v", err)
			return
		}
		logf("profile: podjanitor's CPU over %s of the removals: %s (go tool pprof -top %s)", d.Round(time.Second), path, path)
	}()
	return done
}

// kyvernoCopy maps the i-th pod created to pod k and the namespace of its
// copy: pods 3k, 3k+1 and 3k+2 are pod k's three copies, and which remover's
// copy goes first rotates with k.
func kyvernoCopy(i int) (k int, ns string) {
	k = i / 3
	return k, []string{kyvernoJanitorNS, kyvernoKyvernoNS, kyvernoIdealNS}[(i+k)%3]
}

// fill computes the side's figures from the pods its watcher saw; deadline
// gives a pod's deadline from its name and creationTimestamp.
func (s *kyvernoSide) fill(pods map[string]peerPod, deadline func(name string, created time.Time) (time.Time, bool)) {
	var late []time.Duration
	for name, p := range pods {
		d, ok := deadline(name, p.created)
		if !ok {
			continue
		}
		if p.gone.IsZero() {
			s.NotRemoved++
			continue
		}
		s.Removed++
		l := p.gone.Sub(d)
		if l < 0 {
			s.Early++
		}
		late = append(late, l)
	}
	s.Lateness = latencyOf(late)
	s.late = late
}

// applyCRDs applies every CustomResourceDefinition in the YAML files under
// dir (server-side, as `kubectl apply --server-side`) and waits until each is
// Established.
func (b *bench) applyCRDs(ctx context.Context, dir string) error {
	dc, err := dynamic.NewForConfig(b.rest)
	if err != nil {
		return err
	}
	crds := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	var names []string
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			var obj map[string]any
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			u := unstructured.Unstructured{Object: obj}
			if u.GetKind() != "CustomResourceDefinition" {
				continue
			}
			raw, err := json.Marshal(obj)
			if err != nil {
				return err
			}
			force := true
			if _, err := crds.Patch(ctx, u.GetName(), types.ApplyPatchType, raw, metav1.PatchOptions{FieldManager: "podjanitor-bench", Force: &force}); err != nil {
				return fmt.Errorf("applying CRD %s (%s): %w", u.GetName(), path, err)
			}
			names = append(names, u.GetName())
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("no CustomResourceDefinitions under %s", dir)
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			crd, err := crds.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not Established within a minute", name)
		}
	}
	logf("applied %d CRDs from %s", len(names), dir)
	return nil
}

// kyvernoIdentity creates Kyverno's ServiceAccount in the namespace kyverno
// with the chart's cleanup-controller RBAC (the ClusterRole
// kyverno:cleanup-controller:core and the Role of the namespace), and, as
// the one resource to clean up, pods (list, watch, delete; the chart grants
// those through ClusterRoles aggregated to the cleanup controller's), plus a
// FlowSchema that counts its requests at the API server (the priority level
// workload-low, where a ServiceAccount's requests go by default). It returns
// a kubeconfig with a token of the ServiceAccount.
func (b *bench) kyvernoIdentity(ctx context.Context) (string, error) {
	ns, name := kyvernoNamespace, kyvernoName
	objs := []struct {
		what   string
		create func() error
	}{
		{"ServiceAccount", func() error {
			_, err := b.cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			return err
		}},
		{"ConfigMaps", func() error {
			// INIT_CONFIG and METRICS_CONFIG, empty: Kyverno's defaults.
			for _, cm := range []string{"kyverno", "kyverno-metrics"} {
				if _, err := b.cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cm}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					return err
				}
			}
			return nil
		}},
		{"ClusterRoles", func() error {
			for _, cr := range kyvernoClusterRoles() {
				if _, err := b.cs.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					return err
				}
				crb := &rbacv1.ClusterRoleBinding{
					ObjectMeta: metav1.ObjectMeta{Name: cr.Name},
					RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cr.Name},
					Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
				}
				if _, err := b.cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					return err
				}
			}
			return nil
		}},
		{"Role", func() error {
			if _, err := b.cs.RbacV1().Roles(ns).Create(ctx, kyvernoRole(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			rb := &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "kyverno:cleanup-controller", Namespace: ns},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kyverno:cleanup-controller"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
			}
			_, err := b.cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{})
			return err
		}},
		{"FlowSchema", func() error {
			fs := &flowcontrolv1.FlowSchema{
				ObjectMeta: metav1.ObjectMeta{Name: kyvernoFlowSchema},
				Spec: flowcontrolv1.FlowSchemaSpec{
					PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: "workload-low"},
					MatchingPrecedence:         8000, // before service-accounts (9000)
					DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
					Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
						Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindServiceAccount,
							ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: ns, Name: name}}},
						ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: []string{"*"}, APIGroups: []string{"*"},
							Resources: []string{"*"}, ClusterScope: true, Namespaces: []string{"*"}}},
						NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}}},
					}},
				},
			}
			_, err := b.cs.FlowcontrolV1().FlowSchemas().Create(ctx, fs, metav1.CreateOptions{})
			return err
		}},
	}
	for _, o := range objs {
		if err := o.create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("kyverno's %s: %w", o.what, err)
		}
	}
	expiry := int64(6 * 3600)
	tr, err := b.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token for kyverno's ServiceAccount: %w", err)
	}
	caData := b.rest.CAData
	if len(caData) == 0 && b.rest.CAFile != "" {
		if caData, err = os.ReadFile(b.rest.CAFile); err != nil {
			return "", err
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: b.rest.Host, CertificateAuthorityData: caData, InsecureSkipTLSVerify: b.rest.Insecure}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["kyverno"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: name, Namespace: ns}
	kc.CurrentContext = "kyverno"
	path := filepath.Join(b.cfg.outDir, "kyverno.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", err
	}
	return path, nil
}

// kyvernoClusterRoles are the chart's (v1.19.1,
// charts/kyverno/templates/cleanup-controller/clusterrole.yaml) core rules
// of the cleanup controller and the pods it may clean up.
func kyvernoClusterRoles() []*rbacv1.ClusterRole {
	rule := func(groups, resources, verbs []string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: groups, Resources: resources, Verbs: verbs}
	}
	core, all := []string{""}, []string{"create", "delete", "get", "list", "patch", "update", "watch", "deletecollection"}
	return []*rbacv1.ClusterRole{
		{ObjectMeta: metav1.ObjectMeta{Name: "kyverno:cleanup-controller:core"}, Rules: []rbacv1.PolicyRule{
			rule([]string{"apiextensions.k8s.io"}, []string{"customresourcedefinitions"}, []string{"get"}),
			rule([]string{"admissionregistration.k8s.io"}, []string{"validatingwebhookconfigurations"}, []string{"create", "delete", "get", "list", "update", "watch"}),
			rule(core, []string{"namespaces"}, []string{"get", "list", "watch"}),
			rule([]string{"kyverno.io"}, []string{"clustercleanuppolicies", "cleanuppolicies"}, []string{"list", "watch"}),
			rule([]string{"policies.kyverno.io"}, []string{"deletingpolicies", "namespaceddeletingpolicies"}, []string{"get", "list", "watch"}),
			rule([]string{"policies.kyverno.io"}, []string{"deletingpolicies/status", "namespaceddeletingpolicies/status"}, []string{"update"}),
			rule([]string{"policies.kyverno.io"}, []string{"policyexceptions"}, []string{"get", "list", "patch", "update", "watch"}),
			rule([]string{"kyverno.io"}, []string{"globalcontextentries", "globalcontextentries/status"}, all),
			rule([]string{"kyverno.io"}, []string{"clustercleanuppolicies/status", "cleanuppolicies/status"}, []string{"update"}),
			rule(core, []string{"configmaps"}, []string{"get", "list", "watch"}),
			rule([]string{"", "events.k8s.io"}, []string{"events"}, []string{"create", "patch", "update"}),
			rule([]string{"authorization.k8s.io"}, []string{"subjectaccessreviews"}, []string{"create"}),
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "kyverno:cleanup-controller:pods"}, Rules: []rbacv1.PolicyRule{
			rule(core, []string{"pods"}, []string{"list", "watch", "delete"}),
		}},
	}
}

// kyvernoRole is the chart's Role of the cleanup controller in its namespace
// (charts/kyverno/templates/cleanup-controller/role.yaml).
func kyvernoRole() *rbacv1.Role {
	svc := kyvernoName + "." + kyvernoNamespace + ".svc"
	return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "kyverno:cleanup-controller", Namespace: kyvernoNamespace}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"delete", "get", "list", "update", "watch"},
			ResourceNames: []string{svc + ".kyverno-tls-ca", svc + ".kyverno-tls-pair",
				kyvernoName + "." + kyvernoNamespace + ".metering.kyverno-tls-ca", kyvernoName + "." + kyvernoNamespace + ".metering.kyverno-tls-pair"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}, ResourceNames: []string{"kyverno", "kyverno-metrics"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"delete", "get", "patch", "update"}, ResourceNames: []string{kyvernoName}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "list", "watch"}},
	}}
}

// waitKyvernoReady waits until Kyverno's TTL webhook is registered and its
// TTL manager removes a probe pod (ttl 0s, in a namespace of its own): the
// manager starts its informers at its first reconciliation tick, one
// --ttlReconciliationInterval after it became the leader.
func (b *bench) waitKyvernoReady(ctx context.Context, k *kyvernoProc) error {
	timeout := 2*b.cfg.kyvernoInterval + 2*time.Minute
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-k.exited:
			return false, fmt.Errorf("kyverno's cleanup controller exited; see %s", k.logFile.Name())
		default:
		}
		w, err := b.cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, kyvernoTTLWebhook, metav1.GetOptions{})
		return err == nil && len(w.Webhooks) > 0 && len(w.Webhooks[0].ClientConfig.CABundle) > 0, nil
	})
	if err != nil {
		return fmt.Errorf("kyverno's TTL webhook %s not registered: %w (see %s)", kyvernoTTLWebhook, err, k.logFile.Name())
	}
	probe := workload.Pod(kyvernoProbeNamespace, "kyverno-probe", "kyverno-probe", 0, time.Time{}, "")
	delete(probe.Annotations, workload.AnnotationExpiresAt)
	probe.Labels[kyvernoTTLLabel] = "0s"
	t0 := time.Now()
	if _, err := b.cs.CoreV1().Pods(kyvernoProbeNamespace).Create(ctx, probe, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kyverno probe pod: %w", err)
	}
	created := time.Since(t0)
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := b.cs.CoreV1().Pods(kyvernoProbeNamespace).Get(ctx, probe.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil), nil
	})
	if err != nil {
		return fmt.Errorf("kyverno did not remove its probe pod within %s (see %s)", timeout, k.logFile.Name())
	}
	logf("kyverno: TTL manager up %.1f s after start (probe pod created in %s through the TTL webhook, removed %.1f s later)",
		time.Since(k.started).Seconds(), created.Round(time.Millisecond), time.Since(t0).Seconds())
	return nil
}

// ------------------------------------------------------------ kyverno process

type kyvernoProc struct {
	cmd        *exec.Cmd
	started    time.Time
	exited     chan struct{}
	logFile    *os.File
	stats      *janitor // for proc(): /proc/<pid>
	metricsURL string
}

// startKyverno runs Kyverno's cleanup controller out of cluster with the
// chart's environment, at its own defaults otherwise (client QPS/burst
// 100/200, 3 TTL workers; more flags follow the binary in -kyverno).
// command is the binary and any extra flags.
func startKyverno(cfg *config, command []string, kubeconfig string) (*kyvernoProc, error) {
	lf, err := os.Create(filepath.Join(cfg.outDir, "kyverno-cleanup-controller.log"))
	if err != nil {
		return nil, err
	}
	metricsPort, serverPort := cfg.metricsPort+3, cfg.metricsPort+4
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--caSecretName=" + kyvernoName + "." + kyvernoNamespace + ".svc.kyverno-tls-ca",
		"--tlsSecretName=" + kyvernoName + "." + kyvernoNamespace + ".svc.kyverno-tls-pair",
		// the webhooks' URL: https://127.0.0.1:<port>/verifyttl, which the
		// local API server reaches (its certificate names 127.0.0.1)
		fmt.Sprintf("--serverIP=127.0.0.1:%d", serverPort),
		"--cleanupServerHost=127.0.0.1",
		fmt.Sprintf("--cleanupServerPort=%d", serverPort),
		fmt.Sprintf("--ttlReconciliationInterval=%s", cfg.kyvernoInterval),
		"--metricsHost=127.0.0.1",
		fmt.Sprintf("--metricsPort=%d", metricsPort),
		"--disableLogColor",
	}
	cmd := exec.Command(command[0], append(args, command[1:]...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(),
		"KYVERNO_NAMESPACE="+kyvernoNamespace,
		"KYVERNO_SERVICEACCOUNT_NAME="+kyvernoName,
		"KYVERNO_DEPLOYMENT="+kyvernoName,
		"KYVERNO_POD_NAME="+kyvernoName+"-bench",
		"KYVERNO_SVC="+kyvernoName,
		"INIT_CONFIG=kyverno",
		"METRICS_CONFIG=kyverno-metrics",
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	k := &kyvernoProc{cmd: cmd, exited: make(chan struct{}), logFile: lf, started: time.Now(),
		metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w", command[0], err)
	}
	k.stats = &janitor{pid: cmd.Process.Pid, clockTicks: 100}
	go func() { _ = cmd.Wait(); close(k.exited) }()
	select {
	case <-k.exited:
		return nil, fmt.Errorf("kyverno's cleanup controller exited at start; see %s", lf.Name())
	case <-time.After(2 * time.Second):
	}
	return k, nil
}

func (k *kyvernoProc) proc() procStats { return k.stats.proc() }

func (k *kyvernoProc) scrape() (metrics, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(k.metricsURL)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return nil, fmt.Errorf("%s: %s: %s", k.metricsURL, resp.Status, body)
	}
	return parseMetrics(resp.Body)
}

func (k *kyvernoProc) stop() {
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(20 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.exited
	}
	k.logFile.Close()
}

// ------------------------------------------------------------------ report

func printKyverno(w *tabwriter.Writer, r *kyvernoResult) {
	fmt.Fprintf(w, "\n== Scenario 8: kyverno — the same %d pods three times, deadlines creationTimestamp + ttl over %s; podjanitor (podjanitor.io/ttl) beside %s's cleanup controller (%s, %d TTL workers) and the ideal remover in one run\n",
		r.Pods, time.Duration(r.WindowSeconds*float64(time.Second)), r.KyvernoVersion, kyvernoTTLLabel, r.KyvernoWorkers)
	fmt.Fprintln(w, "remover\tremoved\tlateness p50\tp90\tp99\tmax\tearly\tnot removed\tRSS at end\tpeak RSS\tCPU\tCPU during creation\tCPU after creation")
	for _, s := range []struct {
		name string
		side kyvernoSide
	}{{"podjanitor", r.Podjanitor}, {"kyverno", r.Kyverno}, {"ideal", r.Ideal}} {
		l := s.side.Lateness
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%.1f s\t%.1f s\t%.1f s\n", s.name, s.side.Removed, ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max),
			s.side.Early, s.side.NotRemoved, mib(s.side.RSS), mib(s.side.PeakRSS), s.side.CPUSeconds, s.side.CreationCPU, s.side.ExpiryCPU)
	}
	for _, s := range []struct {
		name string
		v    *versusIdeal
	}{{"podjanitor", r.Podjanitor.VsIdeal}, {"kyverno", r.Kyverno.VsIdeal}} {
		if s.v != nil {
			fmt.Fprintf(w, "%s / ideal: p50 %.2f× (%+.1f ms), p99 %.2f× (%+.1f ms)\n", s.name, s.v.P50Ratio, s.v.P50DiffMs, s.v.P99Ratio, s.v.P99DiffMs)
		}
	}
	if f := r.IdealFires; f != nil {
		fmt.Fprintf(w, "ideal's timer ran p50 %s, p99 %s after the deadline; its DELETE took p50 %s, p99 %s; %d DELETE errors\n",
			ms(f.TimerLate.P50), ms(f.TimerLate.P99), ms(f.Delete.P50), ms(f.Delete.P99), f.DeleteErrors)
	}
	h := r.PodjanitorHistogram
	fmt.Fprintf(w, "podjanitor's own lateness histogram: p50 %s, p90 %s, p99 %s\n", ms(h.P50*1000), ms(h.P90*1000), ms(h.P99*1000))
	printRequests(w, "podjanitor", r.PodjanitorRequests)
	fmt.Fprintf(w, "kyverno: API requests of its ServiceAccount at the API server (FlowSchema %s, from its TTL manager's start to its last removal) %.0f; its own count by operation %v, by kind %v\n",
		kyvernoFlowSchema, r.Kyverno.ServerRequests, roundMap(r.KyvernoRequests), roundMap(r.KyvernoRequestsKind))
	fmt.Fprintf(w, "kyverno's webhook (%s): %.0f calls, p50 %s, p99 %s (at creation only)\n", kyvernoWebhookName, r.Webhook.Count, ms(r.Webhook.P50*1000), ms(r.Webhook.P99*1000))
	fmt.Fprintf(w, "lateness = removal seen by a watcher − (creationTimestamp + ttl); pods created in %.1f s (%.0f/s, three copies), lead %.0f s\n",
		r.CreateSeconds, r.CreateRate, r.LeadSeconds)
}
