package main

// The peer scenario: podjanitor and the descheduler's PodLifeTime plugin
// (sigs.k8s.io/descheduler, built by hack/build-descheduler.sh) side by side on
// the same cluster in one run, each on its own copy of the same pods.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
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
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/podjanitor/podjanitor/internal/workload"
)

const (
	peerJanitorNS = "bench-peer-podjanitor"
	peerDeschedNS = "bench-peer-descheduler"
	// kwokNodeAnnotation marks the Nodes that the local cluster's kwok manages
	// (hack/local-cluster.sh): it keeps them Ready and runs the pods bound to them.
	kwokNodeAnnotation = "kwok.x-k8s.io/node"
)

// peerSide is one remover's figures. Lateness is the removal seen by the
// driver's watcher (deletionTimestamp set, or DELETED) minus the pod's
// creationTimestamp plus the lifetime: both removers count from the stored
// creationTimestamp, which has 1-second precision.
type peerSide struct {
	Namespace  string          `json:"namespace"`
	Lateness   latency         `json:"lateness"`
	Removed    int             `json:"removed"`
	NotRemoved int             `json:"not_removed"`
	Early      int             `json:"removed_before_deadline"`
	RSS        float64         `json:"rss_bytes"`      // VmRSS when the last pod was removed
	PeakRSS    float64         `json:"peak_rss_bytes"` // VmHWM
	CPUSeconds float64         `json:"cpu_seconds"`
	Wall       float64         `json:"wall_seconds"`
	late       []time.Duration // for the chart
}

type peerResult struct {
	Pods               int      `json:"pods"` // per namespace
	LifetimeSeconds    float64  `json:"lifetime_seconds"`
	IntervalSeconds    float64  `json:"descheduling_interval_seconds"`
	Nodes              []string `json:"nodes"`
	CreateSeconds      float64  `json:"create_seconds"` // both copies
	CreateRate         float64  `json:"create_pods_per_second"`
	DeschedulerVersion string   `json:"descheduler_version"`
	Podjanitor         peerSide `json:"podjanitor"`
	// podjanitor's own lateness histogram (from its deadline) and API requests
	PodjanitorHistogram histQ       `json:"podjanitor_histogram"`
	PodjanitorRequests  apiRequests `json:"podjanitor_api_requests"`
	Descheduler         peerSide    `json:"descheduler"`
	// Evictions is what podjanitor's removals cost, from the API server's
	// metrics between the start of creation and podjanitor's last removal.
	Evictions evictionEvidence `json:"eviction_evidence"`
}

// evictionEvidence says where an eviction's time goes. The API server's
// histograms count every client's requests: the descheduler's evictions fall
// in the interval only if one of its passes does (DeschedulerRemoved says how
// many of its pods were gone by then), kwok's DELETEs (the final delete after
// each graceful one) always do.
type evictionEvidence struct {
	ServerEviction     histQ   `json:"apiserver_eviction"`
	ServerDelete       histQ   `json:"apiserver_delete_pods"`
	ClientPost         histQ   `json:"podjanitor_client_post"`
	QueueWait          histQ   `json:"podjanitor_workqueue_wait"`
	Workers            int     `json:"podjanitor_workers"`
	DeschedulerRemoved int     `json:"descheduler_removed_by_then"`
	Seconds            float64 `json:"seconds"`
}

func (b *bench) peer(ctx context.Context) (*peerResult, error) {
	n, life, interval := b.cfg.pods, b.cfg.peerLifetime, b.cfg.peerInterval
	if life < time.Second || life%time.Second != 0 {
		return nil, fmt.Errorf("-peer-lifetime %s: want whole seconds (the descheduler's maxPodLifeTimeSeconds)", life)
	}
	out := &peerResult{Pods: n, LifetimeSeconds: life.Seconds(), IntervalSeconds: interval.Seconds()}
	command := strings.Fields(b.cfg.descheduler)
	if v, err := exec.Command(command[0], "version").CombinedOutput(); err == nil {
		// "Descheduler version {Major:0 Minor:36.0 GitVersion:v20260519-v0.36.0 ...}"
		out.DeschedulerVersion = strings.TrimSpace(string(v))
		if _, after, _ := strings.Cut(out.DeschedulerVersion, "GitVersion:"); len(strings.Fields(after)) > 0 {
			gitVersion := strings.Fields(after)[0]
			if _, tag, ok := strings.Cut(gitVersion, "-"); ok { // the tag after its date
				gitVersion = tag
			}
			out.DeschedulerVersion = "descheduler " + gitVersion
		}
	} else {
		return nil, fmt.Errorf("descheduler binary %s: %v (build it with hack/build-descheduler.sh)", command[0], err)
	}
	owners := map[string]metav1.OwnerReference{}
	for _, ns := range []string{peerJanitorNS, peerDeschedNS} {
		if err := b.ensureNamespace(ctx, ns); err != nil {
			return nil, err
		}
		if existing, err := b.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return nil, err
		} else if len(existing.Items) > 0 {
			return nil, fmt.Errorf("namespace %s already has pods; use a fresh cluster", ns)
		}
		ref, err := b.peerOwner(ctx, ns)
		if err != nil {
			return nil, err
		}
		owners[ns] = ref
	}
	nodes, err := b.peerNodes(ctx)
	if err != nil {
		return nil, err
	}
	out.Nodes = nodes

	watchers := map[string]*peerTracker{}
	for _, ns := range []string{peerJanitorNS, peerDeschedNS} {
		if watchers[ns], err = peerWatch(ctx, b.cs, ns); err != nil {
			return nil, err
		}
	}

	// podjanitor: a `created` rule with the same lifetime, for its namespace.
	policy := filepath.Join(b.cfg.outDir, "peer-policy.yaml")
	if err := os.WriteFile(policy, fmt.Appendf(nil, `apiVersion: podjanitor.io/v1alpha1
kind: PodJanitorPolicy
rules:
  - name: lifetime
    match: {namespaces: {include: [%s]}}
    clock: created
    after: %s
`, peerJanitorNS, life), 0o644); err != nil {
		return nil, err
	}
	j, err := startJanitorBinary(b.cfg, append(strings.Fields(b.cfg.podjanitor), "--config="+policy), "peer", peerJanitorNS, b.cfg.workers)
	if err != nil {
		return nil, err
	}
	defer j.stop()
	if _, err := j.waitReady(time.Minute); err != nil {
		return nil, err
	}
	d, err := startDescheduler(b.cfg, command, life, interval)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	rss := sampleRSS(j.started, time.Second, []string{"podjanitor", "descheduler"}, j.proc, d.proc)

	serverBefore, err := apiServerMetrics(ctx, b.cs)
	if err != nil {
		return nil, fmt.Errorf("peer: reading the API server's metrics: %w", err)
	}
	evidenceFrom := time.Now()

	// The same pod, twice: one copy in each namespace, created one after the
	// other (which copy goes first alternates), bound round-robin to the nodes.
	logf("peer: %d pods in each of %s and %s, lifetime %s from creation; descheduling interval %s",
		n, peerJanitorNS, peerDeschedNS, life, interval)
	cr := createPods(ctx, b.cs, 2*n, b.cfg.createConc, "peer", func(i int) *corev1.Pod {
		k := i / 2
		ns := peerJanitorNS
		if (i%2 == 0) != (k%2 == 0) {
			ns = peerDeschedNS
		}
		pod := workload.Pod(ns, fmt.Sprintf("peer-%06d", k), "peer", k, time.Time{}, nodes[k%len(nodes)])
		delete(pod.Annotations, workload.AnnotationExpiresAt) // the rule's clock, not the annotation
		pod.OwnerReferences = []metav1.OwnerReference{owners[ns]}
		return pod
	}, false)
	if cr.errors > 0 {
		return out, fmt.Errorf("peer: %d pods failed to be created", cr.errors)
	}
	out.CreateSeconds, out.CreateRate = cr.duration.Seconds(), cr.rate
	createdEnd := time.Now()

	// Every pod is due by the end of creation plus the lifetime (and the
	// second of creationTimestamp's precision); the descheduler also needs up
	// to one interval to see it and the time to evict what it saw.
	timeout := life + interval + 2*time.Minute
	sides := []struct {
		side *peerSide
		ns   string
		proc func() procStats
		wall func() float64
		done func() // more to read when the side's last pod is gone
	}{
		{&out.Podjanitor, peerJanitorNS, j.proc, func() float64 { return time.Since(j.started).Seconds() }, func() {
			out.Evictions = b.evictionEvidence(ctx, serverBefore, j, watchers[peerDeschedNS].removed(), time.Since(evidenceFrom))
		}},
		{&out.Descheduler, peerDeschedNS, d.proc, func() float64 { return time.Since(d.started).Seconds() }, func() {}},
	}
	// Each process's RSS and CPU are read when its last pod is seen removed
	// (or at the timeout).
	done := make([]bool, len(sides))
	record := func(i int) {
		s := sides[i]
		p := s.proc()
		s.side.Namespace = s.ns
		s.side.RSS, s.side.PeakRSS, s.side.CPUSeconds, s.side.Wall = float64(p.RSSBytes), float64(p.PeakRSS), p.CPUSecond, s.wall()
		done[i] = true
		s.done()
	}
	start := time.Now()
	stop := progress(func() string {
		return fmt.Sprintf("peer: removed %d/%d by podjanitor, %d/%d by the descheduler (%.0fs)",
			watchers[peerJanitorNS].removed(), n, watchers[peerDeschedNS].removed(), n, time.Since(start).Seconds())
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
	for _, s := range sides {
		s.side.fill(watchers[s.ns].snapshot(), life)
		logf("peer: %s: %d removed, lateness p50 %s p99 %s max %s, %d early, %d not removed; peak RSS %s, CPU %.1f s",
			s.ns, s.side.Removed, ms(s.side.Lateness.P50), ms(s.side.Lateness.P99), ms(s.side.Lateness.Max),
			s.side.Early, s.side.NotRemoved, mib(s.side.PeakRSS), s.side.CPUSeconds)
	}
	b.chart(b.writeLatenessCDF("peer-lateness", fmt.Sprintf("peer: lateness CDF, %d pods per remover, lifetime %s from creationTimestamp", n, life),
		[]remover{{"podjanitor", out.Podjanitor.late}, {"descheduler PodLifeTime, interval " + interval.String(), out.Descheduler.late}}))
	b.chart(b.writeRSSChart("peer-rss", fmt.Sprintf("peer: RSS, %d pods per remover", n), rssSeries,
		[]chartMark{{"creation ended", createdEnd.Sub(j.started).Seconds()}}))
	return out, nil
}

// evictionEvidence reads the API server's and podjanitor's metrics once
// podjanitor has removed its pods (unreadable metrics leave it empty).
func (b *bench) evictionEvidence(ctx context.Context, serverBefore metrics, j *janitor, deschedRemoved int, since time.Duration) evictionEvidence {
	e := evictionEvidence{Workers: b.cfg.workers, DeschedulerRemoved: deschedRemoved, Seconds: since.Seconds()}
	if serverAfter, err := apiServerMetrics(ctx, b.cs); err == nil {
		server := serverAfter.minus(serverBefore)
		e.ServerEviction = quantiles(server.only(`verb="POST"`, `resource="pods"`, `subresource="eviction"`), "apiserver_request_duration_seconds")
		e.ServerDelete = quantiles(server.only(`verb="DELETE"`, `resource="pods"`, `subresource=""`), "apiserver_request_duration_seconds")
	}
	if m, err := j.scrape(); err == nil {
		e.ClientPost = quantiles(m.only(`verb="POST"`), "rest_client_request_duration_seconds")
		e.QueueWait = quantiles(m, "workqueue_queue_duration_seconds")
	}
	return e
}

// fill computes the side's figures from the pods its watcher saw.
func (s *peerSide) fill(pods map[string]peerPod, life time.Duration) {
	var late []time.Duration
	for _, p := range pods {
		if p.gone.IsZero() {
			s.NotRemoved++
			continue
		}
		s.Removed++
		l := p.gone.Sub(p.created.Add(life))
		if l < 0 {
			s.Early++
		}
		late = append(late, l)
	}
	s.Lateness = latencyOf(late)
	s.late = late
}

// peerOwner creates the object that owns the pods of ns. The descheduler's
// DefaultEvictor never evicts a pod without ownerReferences, and the garbage
// collector deletes pods whose owner does not exist. A ConfigMap owns nothing
// a controller acts on: a ReplicaSet owner would delete the pods (replicas 0,
// selector matching) or release them (selector not matching).
func (b *bench) peerOwner(ctx context.Context, ns string) (metav1.OwnerReference, error) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bench-peer-owner", Namespace: ns}}
	got, err := b.cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = b.cs.CoreV1().ConfigMaps(ns).Get(ctx, cm.Name, metav1.GetOptions{})
	}
	if err != nil {
		return metav1.OwnerReference{}, fmt.Errorf("owner ConfigMap %s/%s: %w", ns, cm.Name, err)
	}
	return metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: got.Name, UID: got.UID}, nil
}

// peerNodes creates -peer-nodes Nodes for kwok to manage and waits until they
// are Ready: the descheduler skips a cycle unless it sees at least two Ready
// nodes, and only considers the pods bound to those.
func (b *bench) peerNodes(ctx context.Context) ([]string, error) {
	var names []string
	for i := range max(b.cfg.peerNodes, 2) {
		name := fmt.Sprintf("bench-peer-node-%d", i)
		names = append(names, name)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
			Annotations: map[string]string{kwokNodeAnnotation: "fake", "node.alpha.kubernetes.io/ttl": "0"},
		}}
		if _, err := b.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
	}
	for _, name := range names {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			node, err := b.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					return c.Status == corev1.ConditionTrue, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return nil, fmt.Errorf("node %s not Ready within a minute: the peer scenario needs kwok managing nodes annotated %s=fake (the local cluster of hack/local-cluster.sh)", name, kwokNodeAnnotation)
		}
	}
	return names, nil
}

// ------------------------------------------------------------ descheduler

type deschedProc struct {
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{}
	logFile *os.File
	stats   *janitor // for proc(): /proc/<pid> of the descheduler
}

// startDescheduler runs the descheduler with a PodLifeTime policy for the
// descheduler's namespace. command is the binary and any extra flags.
func startDescheduler(cfg *config, command []string, life, interval time.Duration) (*deschedProc, error) {
	policy := filepath.Join(cfg.outDir, "peer-descheduler-policy.yaml")
	// DefaultEvictor by default protects pods with local storage; the
	// workload pod has an emptyDir (/tmp), so that protection is disabled.
	err := os.WriteFile(policy, fmt.Appendf(nil, `apiVersion: descheduler/v1alpha2
kind: DeschedulerPolicy
profiles:
  - name: peer
    pluginConfig:
      - name: DefaultEvictor
        args:
          podProtections:
            defaultDisabled: [PodsWithLocalStorage]
      - name: PodLifeTime
        args:
          maxPodLifeTimeSeconds: %d
          namespaces:
            include: [%s]
    plugins:
      filter: {enabled: [DefaultEvictor]}
      preEvictionFilter: {enabled: [DefaultEvictor]}
      deschedule: {enabled: [PodLifeTime]}
`, int(life.Seconds()), peerDeschedNS), 0o644)
	if err != nil {
		return nil, err
	}
	lf, err := os.Create(filepath.Join(cfg.outDir, "descheduler-peer.log"))
	if err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig=" + cfg.kubeconfig,
		"--policy-config-file=" + policy,
		"--descheduling-interval=" + interval.String(),
		fmt.Sprintf("--client-connection-qps=%g", cfg.qps),
		fmt.Sprintf("--client-connection-burst=%d", cfg.burst),
		// its metrics and health server: a port of the bench's range
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", cfg.metricsPort+2),
		"--cert-dir=" + filepath.Join(cfg.outDir, "descheduler-certs"), // its self-signed serving certificate
	}
	cmd := exec.Command(command[0], append(args, command[1:]...)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	d := &deschedProc{cmd: cmd, exited: make(chan struct{}), logFile: lf, started: time.Now()}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w", command[0], err)
	}
	d.stats = &janitor{pid: cmd.Process.Pid, clockTicks: 100}
	go func() { _ = cmd.Wait(); close(d.exited) }()
	select {
	case <-d.exited:
		return nil, fmt.Errorf("descheduler exited at start; see %s", lf.Name())
	case <-time.After(2 * time.Second):
	}
	return d, nil
}

func (d *deschedProc) proc() procStats { return d.stats.proc() }

func (d *deschedProc) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	d.logFile.Close()
}

// ---------------------------------------------------------------- watcher

type peerPod struct{ created, gone time.Time }

// peerTracker watches one namespace and records, per pod, its
// creationTimestamp and when its removal was first seen (deletionTimestamp
// set, or DELETED).
type peerTracker struct {
	mu   sync.Mutex
	pods map[string]peerPod
	gone int
}

func peerWatch(ctx context.Context, cs kubernetes.Interface, ns string) (*peerTracker, error) {
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, err
	}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().Pods(ns).Watch(ctx, o)
		},
	})
	if err != nil {
		return nil, err
	}
	t := &peerTracker{pods: map[string]peerPod{}}
	go func() {
		defer rw.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-rw.ResultChan():
				if !ok {
					return
				}
				now := time.Now()
				pod, isPod := ev.Object.(*corev1.Pod)
				if !isPod {
					continue
				}
				t.mu.Lock()
				p := t.pods[pod.Name]
				p.created = pod.CreationTimestamp.Time
				if (ev.Type == watch.Deleted || pod.DeletionTimestamp != nil) && p.gone.IsZero() {
					p.gone = now
					t.gone++
				}
				t.pods[pod.Name] = p
				t.mu.Unlock()
			}
		}
	}()
	return t, nil
}

func (t *peerTracker) removed() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gone
}

func (t *peerTracker) snapshot() map[string]peerPod {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.pods)
}

// ------------------------------------------------------------------ report

func printPeer(w *tabwriter.Writer, p *peerResult) {
	fmt.Fprintf(w, "\n== Scenario 7: peer — the same %d pods twice, lifetime %s from creationTimestamp; podjanitor (`created` rule) beside the descheduler's PodLifeTime (%s, --descheduling-interval %s) in one run\n",
		p.Pods, time.Duration(p.LifetimeSeconds*float64(time.Second)), p.DeschedulerVersion, time.Duration(p.IntervalSeconds*float64(time.Second)))
	fmt.Fprintln(w, "remover\tremoved\tlateness p50\tp90\tp99\tmax\tearly\tnot removed\tRSS at end\tpeak RSS\tCPU")
	for _, s := range []struct {
		name string
		side peerSide
	}{{"podjanitor", p.Podjanitor}, {"descheduler", p.Descheduler}} {
		l := s.side.Lateness
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%.1f s\n", s.name, s.side.Removed, ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max),
			s.side.Early, s.side.NotRemoved, mib(s.side.RSS), mib(s.side.PeakRSS), s.side.CPUSeconds)
	}
	h := p.PodjanitorHistogram
	fmt.Fprintf(w, "podjanitor's own lateness histogram (from its deadline): p50 %s, p90 %s, p99 %s\n", ms(h.P50*1000), ms(h.P90*1000), ms(h.P99*1000))
	r := p.PodjanitorRequests
	fmt.Fprintf(w, "podjanitor API requests by method %v, by code %v (a POST is an eviction or an Event)\n", roundMap(r.ByMethod), roundMap(r.ByCode))
	e := p.Evictions
	fmt.Fprintf(w, "evictions (%.0f s from creation to podjanitor's last removal, %d workers; the descheduler had removed %d by then):\n", e.Seconds, e.Workers, e.DeschedulerRemoved)
	for _, h := range []struct {
		what string
		q    histQ
	}{
		{"API server, POST pods/eviction", e.ServerEviction},
		{"API server, DELETE pods (kwok's final deletes)", e.ServerDelete},
		{"podjanitor's client, POST (evictions and Events)", e.ClientPost},
		{"podjanitor's workqueue wait", e.QueueWait},
	} {
		fmt.Fprintf(w, "  %s: %.0f, mean %s, p50 %s, p90 %s, p99 %s\n", h.what, h.q.Count, ms(h.q.Mean*1000), ms(h.q.P50*1000), ms(h.q.P90*1000), ms(h.q.P99*1000))
	}
	fmt.Fprintf(w, "lateness = removal seen by a watcher − (creationTimestamp + lifetime); pods created in %.1f s (%.0f/s, both copies) on nodes %v\n",
		p.CreateSeconds, p.CreateRate, p.Nodes)
}
