package main

// The backlogs at the removal cap (evict-backlog, ns-backlog): podjanitor at
// its default flags, where --max-deletions-per-second should be the only
// bound, beside a raw remover that makes the same requests under the same
// cap, in the same run. evict-backlog: Running pods bound to kwok nodes, a
// third of them under a PodDisruptionBudget that allows their evictions;
// ns-backlog: Pending pods spread over many namespaces (a namespace read
// before the first removal in each).

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/podjanitor/podjanitor/internal/workload"
)

// podjanitor's default --max-deletions-per-second and --deletion-burst,
// which the raw remover keeps to as well.
const (
	defaultCap      = 50
	defaultCapBurst = 100
)

// pdbLabel marks the evict-backlog pods its PodDisruptionBudget selects.
const pdbLabel = "bench.podjanitor.io/budget"

type capBacklogResult struct {
	Scenario   string  `json:"scenario"`
	Action     string  `json:"action"` // evict or delete
	Pods       int     `json:"pods"`
	Namespaces int     `json:"namespaces"`
	UnderPDB   int     `json:"pods_under_pdb"`
	Cap        float64 `json:"cap_per_second"`
	CapBurst   int     `json:"cap_burst"`
	// CapSeconds is how long the cap with its burst takes for Pods:
	// (Pods − burst) / cap; the shares compare drain times with it.
	CapSeconds      float64            `json:"cap_seconds"`
	SyncSeconds     float64            `json:"podjanitor_cache_sync_seconds"`
	Seconds         float64            `json:"podjanitor_drain_seconds"`         // cache synced → last removal seen
	FirstSeconds    float64            `json:"podjanitor_first_removal_seconds"` // cache synced → first removal seen
	Rate            float64            `json:"podjanitor_pods_per_second"`
	ShareOfCap      float64            `json:"podjanitor_share_of_cap"`
	RawSeconds      float64            `json:"raw_drain_seconds"`         // first request → last removal seen
	RawFirstSeconds float64            `json:"raw_first_removal_seconds"` // first request → first removal seen
	RawRate         float64            `json:"raw_pods_per_second"`
	RawShare        float64            `json:"raw_share_of_cap"`
	ShareOfRaw      float64            `json:"podjanitor_share_of_raw"`
	RawErrors       int64              `json:"raw_errors"`           // failed attempts, each retried after 1 s (up to 10 per pod)
	RawErrorsBy     map[string]int64   `json:"raw_errors_by_reason"` // by HTTP code and reason
	RawRequests     map[string]int64   `json:"raw_requests"`
	Requests        apiRequests        `json:"podjanitor_api_requests"`
	RemovalErrs     map[string]float64 `json:"podjanitor_removal_errors_by_kind"`
	CPUSeconds      float64            `json:"podjanitor_cpu_seconds"`
	PeakRSS         float64            `json:"podjanitor_peak_rss_bytes"`
	CreateSecond    float64            `json:"create_seconds"`
	// The API server's own duration of the removal requests (POST
	// pods/eviction, or DELETE pods) during each drain, and their codes.
	ServerRemoval    histQ              `json:"apiserver_removal_duration_podjanitor"`
	ServerCodes      map[string]float64 `json:"apiserver_removal_codes_podjanitor"`
	RawServerRemoval histQ              `json:"apiserver_removal_duration_raw"`
	RawServerCodes   map[string]float64 `json:"apiserver_removal_codes_raw"`
}

// capSide is one remover's pods: their namespaces and names.
type capSide struct {
	label      string // the pods' scenario label, podjanitor's --label-selector
	namespaces []string
	names      [][]string // by namespace
}

func (s capSide) count() int {
	n := 0
	for _, ns := range s.names {
		n += len(ns)
	}
	return n
}

// capBacklog runs one of the two scenarios: evict (one namespace, Running
// pods) or namespaces (Pending pods over -cap-namespaces namespaces).
func (b *bench) capBacklog(ctx context.Context, scenario string) (*capBacklogResult, error) {
	n, evict := b.cfg.capPods, scenario == "evict-backlog"
	namespaces := 1
	if !evict {
		namespaces = max(1, min(b.cfg.capNamespaces, n))
	}
	out := &capBacklogResult{Scenario: scenario, Action: "delete", Pods: n, Namespaces: namespaces,
		Cap: defaultCap, CapBurst: defaultCapBurst, CapSeconds: float64(max(0, n-defaultCapBurst)) / defaultCap}
	var nodes []string
	if evict {
		out.Action = "evict"
		var err error
		if nodes, err = b.peerNodes(ctx); err != nil {
			return nil, err
		}
	}
	t0 := time.Now()
	sides := map[string]capSide{}
	for _, who := range []string{"pj", "raw"} {
		side, err := b.createCapSide(ctx, scenario, who, n, namespaces, nodes)
		if err != nil {
			return nil, err
		}
		sides[who] = side
		if evict {
			out.UnderPDB = (n + 2) / 3
		}
	}
	out.CreateSecond = time.Since(t0).Seconds()
	timeout := 5*time.Minute + time.Duration(n/10)*time.Second

	// podjanitor at its defaults: only what points it at its pods.
	pj := sides["pj"]
	// The watchers of every namespace end with the scenario, not with the
	// run: they would see every later scenario's pods.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	tr, err := watchNamespace(wctx, b.cs, "") // every namespace
	if err != nil {
		return nil, err
	}
	removals := []string{`verb="DELETE"`, `resource="pods"`, `subresource=""`}
	if evict {
		removals = []string{`verb="POST"`, `resource="pods"`, `subresource="eviction"`}
	}
	server := func(before metrics) (histQ, map[string]float64, metrics) {
		after, err := apiServerMetrics(ctx, b.cs)
		if err != nil || before == nil {
			return histQ{}, nil, after
		}
		d := after.minus(before).only(removals...)
		return quantiles(d, "apiserver_request_duration_seconds"), d.byLabel("apiserver_request_total", "code"), after
	}
	serverBefore, _ := apiServerMetrics(ctx, b.cs)
	logf("%s: podjanitor at its default flags, %d pods (%s) in %d namespace(s)", scenario, n, out.Action, namespaces)
	j, err := startJanitorWith(b.cfg, strings.Fields(b.cfg.podjanitor), scenario,
		[]string{"--label-selector=" + workload.LabelScenario + "=" + pj.label}, "")
	if err != nil {
		return nil, err
	}
	sync, err := j.waitReady(10 * time.Minute)
	if err != nil {
		j.stop()
		return nil, err
	}
	ready := j.started.Add(sync)
	// With --profiling: podjanitor's CPU over the time the cap needs.
	profiled := b.profileRemovals(j, scenario+"-podjanitor-drain.cpu.pprof", time.Duration(out.CapSeconds*float64(time.Second)))
	first, last, seen := waitSideGone(ctx, tr, pj, timeout, scenario+" podjanitor")
	<-profiled
	time.Sleep(time.Second) // the last metrics land
	m, scrapeErr := j.scrape()
	p := j.proc()
	j.stop()
	if scrapeErr != nil {
		return nil, scrapeErr
	}
	out.ServerRemoval, out.ServerCodes, serverBefore = server(serverBefore)
	if seen < n {
		return out, fmt.Errorf("%s: podjanitor removed %d of %d pods in %v", scenario, seen, n, timeout)
	}
	out.SyncSeconds = sync.Seconds()
	out.Seconds = last.Sub(ready).Seconds()
	out.FirstSeconds = first.Sub(ready).Seconds()
	out.Rate = float64(n) / out.Seconds
	out.ShareOfCap = out.CapSeconds / out.Seconds
	out.Requests = requestsFrom(m)
	out.RemovalErrs = m.byLabel("podjanitor_removal_errors_total", "error")
	out.CPUSeconds, out.PeakRSS = p.CPUSecond, float64(p.PeakRSS)

	// The raw remover: the same requests, the same cap, no client-side bound.
	raw := sides["raw"]
	rtr, err := watchNamespace(wctx, b.cs, "")
	if err != nil {
		return nil, err
	}
	logf("%s: the raw remover, %d pods", scenario, n)
	start := time.Now()
	rcs, err := rawClient(b.rest, b.cfg.qps, b.cfg.burst)
	if err != nil {
		return out, err
	}
	rr, err := rawRemove(ctx, rcs, raw, evict, b.cfg.workers, time.Now)
	if err != nil {
		return out, err
	}
	first, last, seen = waitSideGone(ctx, rtr, raw, time.Minute, scenario+" raw")
	out.RawServerRemoval, out.RawServerCodes, _ = server(serverBefore)
	out.RawErrors, out.RawErrorsBy = rr.errors.Load(), rr.errorsBy()
	if seen < n {
		return out, fmt.Errorf("%s: the raw remover removed %d of %d pods (errors %v)", scenario, seen, n, rr.errorsBy())
	}
	out.RawSeconds = last.Sub(start).Seconds()
	out.RawFirstSeconds = first.Sub(start).Seconds()
	out.RawRate = float64(n) / out.RawSeconds
	out.RawShare = out.CapSeconds / out.RawSeconds
	out.ShareOfRaw = out.RawSeconds / out.Seconds
	out.RawRequests = rr.byVerb()
	logf("%s: podjanitor %.1f pods/s (%.0f%% of the cap), raw %.1f pods/s (%.0f%%): podjanitor / raw %.0f%%",
		scenario, out.Rate, 100*out.ShareOfCap, out.RawRate, 100*out.RawShare, 100*out.ShareOfRaw)
	return out, nil
}

// createCapSide creates one remover's overdue pods: for evict-backlog
// Running on the kwok nodes, every third under a PodDisruptionBudget that
// allows its eviction; otherwise Pending, spread over the namespaces.
func (b *bench) createCapSide(ctx context.Context, scenario, who string, n, namespaces int, nodes []string) (capSide, error) {
	evict := len(nodes) > 0
	side := capSide{label: scenario + "-" + who, names: make([][]string, namespaces)}
	for k := range namespaces {
		side.namespaces = append(side.namespaces, fmt.Sprintf("bench-%s-%s-%04d", strings.TrimSuffix(scenario, "-backlog"), who, k))
	}
	var wg sync.WaitGroup
	errs := make([]error, namespaces)
	sem := make(chan struct{}, b.cfg.createConc)
	for k, ns := range side.namespaces {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[k] = b.ensureNamespace(ctx, ns)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return side, err
		}
	}
	if evict {
		zero := intstr.FromInt32(0)
		pdb := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "bench-budget", Namespace: side.namespaces[0]},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &zero,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{pdbLabel: "covered"}}},
		}
		if _, err := b.cs.PolicyV1().PodDisruptionBudgets(pdb.Namespace).Create(ctx, pdb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return side, err
		}
	}
	past := time.Now().Add(-time.Hour)
	names := make([]string, n)
	cr := createPods(ctx, b.cs, n, b.cfg.createConc, side.label, func(i int) *corev1.Pod {
		ns := side.namespaces[i%namespaces]
		names[i] = fmt.Sprintf("%s-%06d", ns, i)
		node := ""
		if evict {
			node = nodes[i%len(nodes)]
		}
		pod := workload.Pod(ns, names[i], side.label, i, past, node)
		if evict {
			if i%3 == 0 {
				pod.Labels[pdbLabel] = "covered"
			}
		}
		return pod
	}, false) // kwok writes the Running status of the pods bound to its nodes
	if cr.errors > 0 {
		return side, fmt.Errorf("%s: %d pods failed to be created", side.label, cr.errors)
	}
	for i, name := range names {
		side.names[i%namespaces] = append(side.names[i%namespaces], name)
	}
	if evict {
		// Every pod Running and Ready before podjanitor starts: it evicts
		// Running pods and deletes Pending ones.
		ns := side.namespaces[0]
		err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			list, err := b.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: workload.LabelScenario + "=" + side.label})
			if err != nil {
				return false, nil
			}
			running := 0
			for i := range list.Items {
				if p := &list.Items[i]; p.Status.Phase == corev1.PodRunning && podReady(p) {
					running++
				}
			}
			return running == n, nil
		})
		if err != nil {
			return side, fmt.Errorf("%s: not all %d pods Running and Ready within 3 minutes (kwok runs?): %w", side.label, n, err)
		}
		// The budget allows the evictions once its controller counts the pods healthy.
		want := int32((n + 2) / 3)
		err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err := b.cs.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, "bench-budget", metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			return got.Status.ObservedGeneration >= got.Generation && got.Status.DisruptionsAllowed >= want, nil
		})
		if err != nil {
			return side, fmt.Errorf("%s: the PodDisruptionBudget does not allow %d disruptions within 3 minutes (kube-controller-manager's disruption controller runs?): %w", side.label, want, err)
		}
	}
	return side, nil
}

// waitSideGone waits until every pod of side is seen removed (or the
// timeout); it returns when the first and the last were, and how many were.
func waitSideGone(ctx context.Context, t *tracker, side capSide, timeout time.Duration, label string) (first, last time.Time, seen int) {
	want := map[string]bool{}
	for _, ns := range side.names {
		for _, name := range ns {
			want[name] = true
		}
	}
	deadline := time.Now().Add(timeout)
	start := time.Now()
	count := func() {
		first, last, seen = time.Time{}, time.Time{}, 0
		for name, at := range t.snapshot() {
			if want[name] {
				seen++
				if at.After(last) {
					last = at
				}
				if first.IsZero() || at.Before(first) {
					first = at
				}
			}
		}
	}
	stop := progress(func() string {
		return fmt.Sprintf("%s: %d/%d pods removed (%.0fs)", label, seen, len(want), time.Since(start).Seconds())
	})
	defer stop()
	for count(); seen < len(want) && time.Now().Before(deadline) && ctx.Err() == nil; count() {
		time.Sleep(200 * time.Millisecond)
	}
	return first, last, seen
}

// rawResult counts the raw remover's requests and failures.
type rawResult struct {
	gets, nsGets, evictions, deletes, errors atomic.Int64

	mu       sync.Mutex
	byReason map[string]int64
}

func (r *rawResult) failed(err error) {
	r.errors.Add(1)
	code := 0
	if s, ok := err.(apierrors.APIStatus); ok {
		code = int(s.Status().Code)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byReason == nil {
		r.byReason = map[string]int64{}
	}
	r.byReason[fmt.Sprintf("%d %s", code, apierrors.ReasonForError(err))]++
}

func (r *rawResult) errorsBy() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int64{}
	for k, v := range r.byReason {
		out[k] = v
	}
	return out
}

func (r *rawResult) byVerb() map[string]int64 {
	return map[string]int64{"GET pod": r.gets.Load(), "GET namespace": r.nsGets.Load(),
		"POST eviction": r.evictions.Load(), "DELETE": r.deletes.Load()}
}

// rawClient is the raw remover's client: the driver's QPS and burst (-qps,
// -burst), so that only the cap bounds it; protobuf, as podjanitor's.
func rawClient(restCfg *rest.Config, qps float64, burst int) (kubernetes.Interface, error) {
	c := rest.CopyConfig(restCfg)
	c.QPS, c.Burst, c.UserAgent = float32(qps), burst, "podjanitor-bench-raw-remover"
	c.ContentType = "application/vnd.kubernetes.protobuf"
	c.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return kubernetes.NewForConfig(c)
}

// rawRemove removes side's pods as podjanitor does, request for request,
// under a token bucket at podjanitor's default cap: an eviction reads the pod
// and evicts it with that read's UID and resourceVersion; a delete reads its
// namespace first unless it was read in the last second (by now), and
// carries no preconditions (their cost is the same). A failed removal is
// made again, requests and all, after a second (up to 10 times) without
// another token, as podjanitor decides a pod again after a 409 and retries
// a refusal without taking a token.
func rawRemove(ctx context.Context, cs kubernetes.Interface, side capSide, evict bool, workers int, now func() time.Time) (*rawResult, error) {
	limiter := rate.NewLimiter(defaultCap, defaultCapBurst)
	var mu sync.Mutex
	nsRead := map[string]time.Time{}
	res := &rawResult{}
	type key struct{ ns, name string }
	ch := make(chan key)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for k := range ch {
				if limiter.Wait(ctx) != nil {
					return
				}
				for attempt := 1; ; attempt++ {
					err := rawRemoveOne(ctx, cs, res, k.ns, k.name, evict, now, &mu, nsRead)
					if err == nil || ctx.Err() != nil {
						break
					}
					res.failed(err)
					if attempt == 10 {
						break
					}
					time.Sleep(time.Second)
				}
			}
		})
	}
	// One namespace after the other, as podjanitor's queue holds its initial list.
	for i, ns := range side.namespaces {
		for _, name := range side.names[i] {
			ch <- key{ns, name}
		}
	}
	close(ch)
	wg.Wait()
	return res, ctx.Err()
}

func rawRemoveOne(ctx context.Context, cs kubernetes.Interface, res *rawResult, ns, name string, evict bool,
	now func() time.Time, mu *sync.Mutex, nsRead map[string]time.Time) error {
	if evict {
		res.gets.Add(1)
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		res.evictions.Add(1)
		uid, rv := pod.UID, pod.ResourceVersion
		return cs.CoreV1().Pods(ns).EvictV1(ctx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: name, Namespace: ns},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}},
		})
	}
	mu.Lock()
	t := now()
	read, ok := nsRead[ns]
	fresh := ok && t.Sub(read) < time.Second // podjanitor's namespaceFreshness
	if !fresh {
		nsRead[ns] = t
	}
	mu.Unlock()
	if !fresh {
		res.nsGets.Add(1)
		if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			return err
		}
	}
	res.deletes.Add(1)
	return cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
}

func printCapBacklog(w *tabwriter.Writer, runs []*capBacklogResult) {
	if len(runs) == 0 {
		return
	}
	fmt.Fprintf(w, "\n== Backlogs at the removal cap: podjanitor at its default flags (cap %d/s, burst %d: %d pods in %.0f s at the cap) beside a raw remover making the same requests under the same cap\n",
		defaultCap, defaultCapBurst, runs[0].Pods, runs[0].CapSeconds)
	fmt.Fprintln(w, "scenario\taction\tpods\tnamespaces\tunder a PDB\tpodjanitor drain\tpods/s\tshare of the cap\traw drain\traw pods/s\traw share of the cap\tpodjanitor / raw")
	for _, r := range runs {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%.1f s\t%.1f\t%.0f%%\t%.1f s\t%.1f\t%.0f%%\t%.0f%%\n", r.Scenario, r.Action, r.Pods, r.Namespaces, r.UnderPDB,
			r.Seconds, r.Rate, 100*r.ShareOfCap, r.RawSeconds, r.RawRate, 100*r.RawShare, 100*r.ShareOfRaw)
	}
	for _, r := range runs {
		fmt.Fprintf(w, "%s: first removal %.2f s after podjanitor's cache sync (%.1f s), %.2f s after the raw remover's first request; podjanitor requests by method %v, by code %v, removal errors %v; CPU %.1f s; raw requests %v, errors %v\n",
			r.Scenario, r.FirstSeconds, r.SyncSeconds, r.RawFirstSeconds, roundMap(r.Requests.ByMethod), roundMap(r.Requests.ByCode), roundMap(r.RemovalErrs), r.CPUSeconds, r.RawRequests, r.RawErrorsBy)
		fmt.Fprintf(w, "%s: the API server's %s, podjanitor's drain: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, codes %v; the raw remover's: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, codes %v\n",
			r.Scenario, r.Action, 1000*r.ServerRemoval.P50, 1000*r.ServerRemoval.P90, 1000*r.ServerRemoval.P99, roundMap(r.ServerCodes),
			1000*r.RawServerRemoval.P50, 1000*r.RawServerRemoval.P90, 1000*r.RawServerRemoval.P99, roundMap(r.RawServerCodes))
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
