package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/workload"
)

// ------------------------------------------------------------ 3: idle

type memSample struct {
	SyncSeconds float64 `json:"cache_sync_seconds"`
	RSS         float64 `json:"rss_bytes"`
	PeakRSS     float64 `json:"peak_rss_bytes"`
	HeapInuse   float64 `json:"go_heap_inuse_bytes"` // minimum over the settle period
	HeapAlloc   float64 `json:"go_heap_alloc_bytes"` // at the same scrape
	// AfterGC is go_memstats_heap_inuse_bytes at the first scrape after a GC
	// that ran once the cache had synced; LiveAtGC is the live heap that GC
	// marked (gctrace). Both are only set for the start with the idle period.
	AfterGC  float64 `json:"go_heap_inuse_after_gc_bytes,omitempty"`
	LiveAtGC float64 `json:"go_heap_live_at_gc_bytes,omitempty"`
	Parked   float64 `json:"pods_scheduled"`
	// FirstPass is from the start to the log's "First pass done" (the
	// workers have taken every key of the initial list and the sync's
	// memory is returned to the OS); NaN if not logged within 150 s.
	FirstPass float64 `json:"first_pass_done_seconds"`
	// RSSAfterIdle is the RSS at the end of the idle period (the start
	// with one only).
	RSSAfterIdle float64 `json:"rss_after_idle_bytes,omitempty"`
}

type idleResult struct {
	Pods          int         `json:"pods"`
	Bound         bool        `json:"bound_running"`
	StandIn       bool        `json:"stand_in_api_server,omitempty"` // idle-standin: pods served by standin.go
	CreateSeconds float64     `json:"create_seconds"`
	CreateRate    float64     `json:"create_pods_per_second"`
	EmptyRuns     []memSample `json:"empty_runs"`
	Runs          []memSample `json:"runs"`
	Empty         memSample   `json:"empty_median"`
	Full          memSample   `json:"median"`
	HeapPerPod    float64     `json:"heap_bytes_per_pod"`
	// HeapAfterGCPerPod uses the heap in use after the first post-sync GC;
	// LivePerPod the live heap that GC marked (both minus the 0-pod figures).
	HeapAfterGCPerPod float64            `json:"heap_after_gc_bytes_per_pod,omitempty"`
	LivePerPod        float64            `json:"live_heap_bytes_per_pod,omitempty"`
	EmptyLiveHeap     float64            `json:"empty_live_heap_bytes,omitempty"`
	RSSPerPod         float64            `json:"rss_bytes_per_pod"`
	PeakRSSPerPod     float64            `json:"peak_rss_bytes_per_pod"`
	IdleWindow        string             `json:"idle_window"`
	IdleCPUSeconds    float64            `json:"idle_cpu_seconds"`
	IdleCPUPercent    float64            `json:"idle_cpu_percent_of_one_core"`
	IdleRequests      float64            `json:"idle_api_requests"`
	IdleByMethod      map[string]float64 `json:"idle_api_requests_by_method"`
}

const settle = 10 * time.Second

// measureMemory starts podjanitor on ns, waits for the cache, then samples
// for the settle period; with idle > 0 it then measures CPU and API requests.
func (b *bench) measureMemory(ns, name string, idle time.Duration, out *idleResult) (memSample, error) {
	var s memSample
	j, err := startJanitor(b.cfg, name, ns, b.cfg.workers)
	if err != nil {
		return s, err
	}
	defer j.stop()
	sync, err := j.waitReady(10 * time.Minute)
	if err != nil {
		return s, err
	}
	s.SyncSeconds = sync.Seconds()
	s.HeapInuse = math.Inf(1)
	end := time.Now().Add(settle)
	for time.Now().Before(end) {
		time.Sleep(time.Second)
		m, err := j.scrape()
		if err != nil {
			return s, err
		}
		if h := m.sum("go_memstats_heap_inuse_bytes"); h < s.HeapInuse {
			s.HeapInuse, s.HeapAlloc = h, m.sum("go_memstats_heap_alloc_bytes")
		}
		s.Parked = m.sum("podjanitor_pods_scheduled")
	}
	p := j.proc()
	s.RSS, s.PeakRSS = float64(p.RSSBytes), float64(p.PeakRSS)
	if idle > 0 {
		logf("idle: measuring CPU and API requests over %s", idle)
		m0, err := j.scrape()
		if err != nil {
			return s, err
		}
		p0 := j.proc()
		gc0 := m0.sum("go_gc_duration_seconds_count")
		_, logged0 := j.lastGCLiveHeap()
		t0 := time.Now()
		stop := progress(func() string { return fmt.Sprintf("idle: %.0f/%.0f s", time.Since(t0).Seconds(), idle.Seconds()) })
		time.Sleep(idle)
		stop()
		p1 := j.proc()
		m1, err := j.scrape()
		if err != nil {
			return s, err
		}
		// heap in use includes the garbage of the sync until a GC runs; the
		// runtime forces one at most 2 minutes after the last. Wait for it.
		gcDeadline := time.Now().Add(130 * time.Second)
		for m := m1; ; {
			if m.sum("go_gc_duration_seconds_count") > gc0 {
				s.AfterGC = m.sum("go_memstats_heap_inuse_bytes")
				break
			}
			if time.Now().After(gcDeadline) {
				logf("idle: no GC within 130 s after the idle period; heap after GC not measured")
				break
			}
			time.Sleep(2 * time.Second)
			if m, err = j.scrape(); err != nil {
				return s, err
			}
		}
		if live, logged := j.lastGCLiveHeap(); logged > logged0 {
			s.LiveAtGC = live * (1 << 20)
		}
		el := time.Since(t0).Seconds()
		out.IdleWindow = idle.String()
		out.IdleCPUSeconds = p1.CPUSecond - p0.CPUSecond
		out.IdleCPUPercent = 100 * out.IdleCPUSeconds / el
		d := m1.minus(m0)
		out.IdleRequests = d.sum("rest_client_requests_total")
		out.IdleByMethod = d.byLabel("rest_client_requests_total", "method")
		if h := m1.sum("go_memstats_heap_inuse_bytes"); h < s.HeapInuse {
			s.HeapInuse, s.HeapAlloc = h, m1.sum("go_memstats_heap_alloc_bytes")
		}
		s.RSSAfterIdle = float64(j.proc().RSSBytes)
	} else if live, logged := j.lastGCLiveHeap(); logged > 0 {
		s.LiveAtGC = live * (1 << 20)
	}
	s.FirstPass = math.NaN()
	for end := time.Now().Add(150 * time.Second); ; time.Sleep(time.Second) {
		if at, ok := j.loggedAt(firstPassDone); ok {
			s.FirstPass = at.Sub(j.started).Seconds()
			break
		}
		if time.Now().After(end) {
			logf("idle: %q not logged within 150 s", firstPassDone)
			break
		}
	}
	return s, nil
}

// firstPassDone is what podjanitor logs once its first pass is done (memory.go).
const firstPassDone = "First pass done"

func (b *bench) ensureNodes(ctx context.Context) error {
	for i := range b.cfg.nodes {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-node-%d", i), Labels: map[string]string{"kubernetes.io/hostname": fmt.Sprintf("bench-node-%d", i)}},
		}
		if _, err := b.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

func (b *bench) idle(ctx context.Context) (*idleResult, error) {
	n := b.cfg.pods
	out := &idleResult{Pods: n, Bound: b.cfg.idleBound}
	emptyNS, ns := "bench-idle-empty", "bench-idle"
	for _, x := range []string{emptyNS, ns} {
		if err := b.ensureNamespace(ctx, x); err != nil {
			return nil, err
		}
	}
	if err := b.measureEmpty(out, emptyNS); err != nil {
		return out, err
	}

	existing, err := b.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return out, err
	}
	if len(existing.Items) > 0 {
		return out, fmt.Errorf("namespace %s already has pods; use a fresh cluster", ns)
	}
	if b.cfg.idleBound {
		if err := b.ensureNodes(ctx); err != nil {
			return out, err
		}
	}
	far := time.Now().Add(24 * time.Hour)
	logf("idle: creating %d pods with deadlines a day away (bound and Running: %v)", n, b.cfg.idleBound)
	cr := createPods(ctx, b.cs, n, b.cfg.createConc, "idle", func(i int) *corev1.Pod {
		node := ""
		if b.cfg.idleBound {
			node = fmt.Sprintf("bench-node-%d", i%b.cfg.nodes)
		}
		return workload.Pod(ns, fmt.Sprintf("idle-%06d", i), "idle", i, far.Add(time.Duration(i)*time.Second), node)
	}, b.cfg.idleBound)
	if cr.errors > 0 {
		return out, fmt.Errorf("%d pods failed to be created", cr.errors)
	}
	out.CreateSeconds, out.CreateRate = cr.duration.Seconds(), cr.rate
	if !b.cfg.idleBound {
		b.createRate = cr.rate
	}
	b.podJSONSize(ctx, "idle", ns, "idle-000000")
	return out, b.measureFull(out, ns)
}

// idleStandin is scenario 3 against a stand-in API server (standin.go)
// instead of the cluster: the pods are served from memory, so N can be larger
// than a local kube-apiserver can hold on this machine.
func (b *bench) idleStandin() (*idleResult, error) {
	n := b.cfg.pods
	ns := "bench-idle"
	s, err := startStandin(b.cfg.outDir, ns, n, b.cfg.nodes)
	if err != nil {
		return nil, err
	}
	defer s.close()
	c := *b.cfg
	c.kubeconfig = s.kubeconfig
	sb := *b
	sb.cfg = &c
	out := &idleResult{Pods: n, Bound: true, StandIn: true}
	logf("idle-standin: %d pods served by a stand-in API server (%s)", n, s.kubeconfig)
	if err := sb.measureEmpty(out, "bench-idle-empty"); err != nil {
		return out, err
	}
	return out, sb.measureFull(out, ns)
}

// measureEmpty starts podjanitor -runs times on a namespace without pods.
func (b *bench) measureEmpty(out *idleResult, emptyNS string) error {
	logf("idle: podjanitor with 0 pods (%d starts)", b.cfg.runs)
	for r := range b.cfg.runs {
		s, err := b.measureMemory(emptyNS, fmt.Sprintf("idle-empty-%d", r+1), 0, out)
		if err != nil {
			return err
		}
		out.EmptyRuns = append(out.EmptyRuns, s)
	}
	out.Empty = medianSample(out.EmptyRuns)
	var lives []float64
	for _, e := range out.EmptyRuns {
		lives = append(lives, e.LiveAtGC)
	}
	out.EmptyLiveHeap = median(lives)
	return nil
}

// measureFull starts podjanitor -runs times on ns, which has the N pods; the
// last start also measures the idle period. It needs measureEmpty's figures.
func (b *bench) measureFull(out *idleResult, ns string) error {
	n := out.Pods
	logf("idle: podjanitor with %d pods (%d starts)", n, b.cfg.runs)
	for r := range b.cfg.runs {
		idle := time.Duration(0)
		if r == b.cfg.runs-1 {
			idle = b.cfg.idle
		}
		s, err := b.measureMemory(ns, fmt.Sprintf("idle-%d-%d", n, r+1), idle, out)
		if err != nil {
			return err
		}
		logf("idle: start %d: sync %.2fs, RSS %s, heap in use %s, parked %.0f", r+1, s.SyncSeconds, mib(s.RSS), mib(s.HeapInuse), s.Parked)
		out.Runs = append(out.Runs, s)
	}
	out.Full = medianSample(out.Runs)
	out.HeapPerPod = (out.Full.HeapInuse - out.Empty.HeapInuse) / float64(n)
	last := out.Runs[len(out.Runs)-1]
	out.Full.AfterGC, out.Full.LiveAtGC = last.AfterGC, last.LiveAtGC
	if last.AfterGC > 0 {
		out.HeapAfterGCPerPod = (last.AfterGC - out.Empty.HeapInuse) / float64(n)
	}
	if last.LiveAtGC > 0 {
		if live, ok := out.EmptyLive(); ok {
			out.LivePerPod = (last.LiveAtGC - live) / float64(n)
		}
	}
	out.RSSPerPod = (out.Full.RSS - out.Empty.RSS) / float64(n)
	out.PeakRSSPerPod = (out.Full.PeakRSS - out.Empty.PeakRSS) / float64(n)
	return nil
}

// EmptyLive is the live heap podjanitor had with 0 pods at its last GC.
func (r *idleResult) EmptyLive() (float64, bool) {
	return r.EmptyLiveHeap, r.EmptyLiveHeap > 0
}

func medianSample(ss []memSample) memSample {
	get := func(f func(memSample) float64) float64 {
		var xs []float64
		for _, s := range ss {
			xs = append(xs, f(s))
		}
		return median(xs)
	}
	return memSample{
		SyncSeconds: get(func(s memSample) float64 { return s.SyncSeconds }),
		RSS:         get(func(s memSample) float64 { return s.RSS }),
		PeakRSS:     get(func(s memSample) float64 { return s.PeakRSS }),
		HeapInuse:   get(func(s memSample) float64 { return s.HeapInuse }),
		HeapAlloc:   get(func(s memSample) float64 { return s.HeapAlloc }),
		Parked:      get(func(s memSample) float64 { return s.Parked }),
		FirstPass:   get(func(s memSample) float64 { return s.FirstPass }),
	}
}

// ---------------------------------------------------------- 2: backlog

type backlogRun struct {
	SyncSeconds   float64     `json:"podjanitor_cache_sync_seconds"`
	DrainSeconds  float64     `json:"podjanitor_drain_seconds"` // cache synced -> last removal seen
	Rate          float64     `json:"podjanitor_pods_per_second"`
	RawSeconds    float64     `json:"raw_drain_seconds"` // first request -> last removal seen
	RawRate       float64     `json:"raw_pods_per_second"`
	RawErrors     int         `json:"raw_errors"`
	AltSeconds    float64     `json:"alt_podjanitor_drain_seconds,omitempty"`
	AltRate       float64     `json:"alt_podjanitor_pods_per_second,omitempty"`
	AltCPUSeconds float64     `json:"alt_podjanitor_cpu_seconds,omitempty"`
	RawEvSeconds  float64     `json:"raw_with_events_drain_seconds,omitempty"`
	RawEvRate     float64     `json:"raw_with_events_pods_per_second,omitempty"`
	Ratio         float64     `json:"ratio"`
	CPUSeconds    float64     `json:"podjanitor_cpu_seconds"`
	PeakRSS       float64     `json:"podjanitor_peak_rss_bytes"`
	Requests      apiRequests `json:"podjanitor_api_requests"`
	Removed       int         `json:"removed_seen"`
	RawRemoved    int         `json:"raw_removed_seen"`
}

type backlogResult struct {
	Pods          int          `json:"pods"`
	Workers       int          `json:"workers"`
	QPS           float64      `json:"qps"`
	Burst         int          `json:"burst"`
	Runs          []backlogRun `json:"runs"`
	MedianRate    float64      `json:"median_podjanitor_pods_per_second"`
	MedianRawRate float64      `json:"median_raw_pods_per_second"`
	MedianRatio   float64      `json:"median_ratio"`
}

func (b *bench) createOverdue(ctx context.Context, ns, label string, n int) ([]string, error) {
	if err := b.ensureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	past := time.Now().Add(-time.Hour)
	names := make([]string, n)
	cr := createPods(ctx, b.cs, n, b.cfg.createConc, label, func(i int) *corev1.Pod {
		names[i] = fmt.Sprintf("%s-%06d", ns, i)
		return workload.Pod(ns, names[i], "backlog", i, past, "")
	}, false)
	if cr.errors > 0 {
		return nil, fmt.Errorf("%d pods failed to be created", cr.errors)
	}
	b.createRate = cr.rate
	return names, nil
}

func lastOf(m map[string]time.Time) time.Time {
	var t time.Time
	for _, v := range m {
		if v.After(t) {
			t = v
		}
	}
	return t
}

func (b *bench) backlog(ctx context.Context) (*backlogResult, error) {
	n := b.cfg.backlogPods
	out := &backlogResult{Pods: n, Workers: b.cfg.workers, QPS: b.cfg.qps, Burst: b.cfg.burst}
	timeout := 10*time.Minute + time.Duration(n/20)*time.Second
	for r := range b.cfg.runs {
		var run backlogRun
		// podjanitor (and, with -podjanitor-alt, a second build or other flags)
		pjRun := func(binary, suffix string) (sync, drain time.Duration, m metrics, p procStats, removed int, err error) {
			ns := fmt.Sprintf("bench-backlog-%d-%s", r+1, suffix)
			logf("backlog run %d/%d: %d overdue pods for %s", r+1, b.cfg.runs, n, binary)
			if _, err = b.createOverdue(ctx, ns, fmt.Sprintf("backlog %d %s", r+1, suffix), n); err != nil {
				return
			}
			if r == 0 && suffix == "pj" {
				b.podJSONSize(ctx, "unbound", ns, ns+"-000000")
			}
			tr, err := watchNamespace(ctx, b.cs, ns)
			if err != nil {
				return
			}
			j, err := startJanitorBinary(b.cfg, strings.Fields(binary), fmt.Sprintf("backlog-%d-%s", r+1, suffix), ns, b.cfg.workers)
			if err != nil {
				return
			}
			sync, err = j.waitReady(10 * time.Minute)
			if err != nil {
				j.stop()
				return
			}
			ready := j.started.Add(sync)
			ok := tr.waitGone(ctx, n, timeout, fmt.Sprintf("backlog %d %s", r+1, suffix))
			time.Sleep(time.Second) // let the last events and metrics land
			m, err = j.scrape()
			p = j.proc()
			j.stop()
			if err != nil {
				return
			}
			gone := tr.snapshot()
			if !ok {
				err = fmt.Errorf("%s removed only %d of %d pods in %v", binary, len(gone), n, timeout)
				return
			}
			return sync, lastOf(gone).Sub(ready), m, p, len(gone), nil
		}
		// raw client-go deleter (and, with -backlog-raw-events, one that also records events)
		rawRun := func(suffix string, withEvents bool) (float64, float64, int, error) {
			rns := fmt.Sprintf("bench-backlog-%d-%s", r+1, suffix)
			logf("backlog run %d/%d: %d overdue pods for the %s deleter", r+1, b.cfg.runs, n, suffix)
			names, err := b.createOverdue(ctx, rns, fmt.Sprintf("backlog %d %s", r+1, suffix), n)
			if err != nil {
				return 0, 0, 0, err
			}
			rtr, err := watchNamespace(ctx, b.cs, rns)
			if err != nil {
				return 0, 0, 0, err
			}
			start := time.Now()
			stop := progress(func() string {
				return fmt.Sprintf("backlog %d %s: %d/%d pods removed (%.0fs)", r+1, suffix, rtr.count(), n, time.Since(start).Seconds())
			})
			errs, err := rawDelete(ctx, b.rest, rns, names, b.cfg.workers, b.cfg.qps, b.cfg.burst, withEvents)
			stop()
			if err != nil {
				return 0, 0, 0, err
			}
			if !rtr.waitGone(ctx, n, time.Minute, fmt.Sprintf("backlog %d %s", r+1, suffix)) {
				return 0, 0, 0, fmt.Errorf("%s deleter: only %d of %d deletions seen", suffix, rtr.count(), n)
			}
			secs := lastOf(rtr.snapshot()).Sub(start).Seconds()
			return secs, float64(n) / secs, errs, nil
		}
		doPJ := func() error {
			sync, drain, m, p, removed, err := pjRun(b.cfg.podjanitor, "pj")
			if err != nil {
				return err
			}
			run.SyncSeconds = sync.Seconds()
			run.DrainSeconds = drain.Seconds()
			run.Rate = float64(n) / run.DrainSeconds
			run.CPUSeconds, run.PeakRSS = p.CPUSecond, float64(p.PeakRSS)
			run.Requests = requestsFrom(m)
			run.Removed = removed
			if b.cfg.podjanitorAlt != "" {
				_, drain, _, p, _, err := pjRun(b.cfg.podjanitorAlt, "alt")
				if err != nil {
					return err
				}
				run.AltSeconds, run.AltRate, run.AltCPUSeconds = drain.Seconds(), float64(n)/drain.Seconds(), p.CPUSecond
			}
			return nil
		}
		doRaw := func() (err error) {
			run.RawSeconds, run.RawRate, run.RawErrors, err = rawRun("raw", false)
			if err != nil {
				return err
			}
			run.RawRemoved = n
			if b.cfg.rawEvents {
				if run.RawEvSeconds, run.RawEvRate, _, err = rawRun("rawev", true); err != nil {
					return err
				}
			}
			return nil
		}
		// Alternate which goes first, so that a slow start of the cluster or
		// its growing state does not always fall on the same side.
		first, second := doPJ, doRaw
		if r%2 == 1 {
			first, second = doRaw, doPJ
		}
		if err := first(); err != nil {
			return out, err
		}
		if err := second(); err != nil {
			return out, err
		}
		run.Ratio = run.Rate / run.RawRate
		logf("backlog run %d: podjanitor %.0f pods/s (sync %.2fs), raw %.0f pods/s: %.0f%%", r+1, run.Rate, run.SyncSeconds, run.RawRate, 100*run.Ratio)
		out.Runs = append(out.Runs, run)
	}
	var rates, raws, ratios []float64
	for _, r := range out.Runs {
		rates, raws, ratios = append(rates, r.Rate), append(raws, r.RawRate), append(ratios, r.Ratio)
	}
	out.MedianRate, out.MedianRawRate, out.MedianRatio = median(rates), median(raws), median(ratios)
	return out, nil
}

// ----------------------------------------------------------- 1: steady

type histQ struct {
	Count float64 `json:"count"`
	P50   float64 `json:"p50_seconds"`
	P90   float64 `json:"p90_seconds"`
	P99   float64 `json:"p99_seconds"`
	Mean  float64 `json:"mean_seconds,omitempty"`
}

// latenessHistogram reads podjanitor's own lateness histogram.
func latenessHistogram(m metrics) histQ {
	return histQ{
		Count: m.sum("podjanitor_removal_lateness_seconds_count"),
		P50:   m.histQuantile("podjanitor_removal_lateness_seconds", 0.50),
		P90:   m.histQuantile("podjanitor_removal_lateness_seconds", 0.90),
		P99:   m.histQuantile("podjanitor_removal_lateness_seconds", 0.99),
	}
}

type steadyResult struct {
	Pods           int          `json:"pods"`
	Window         string       `json:"window"`
	Rate           float64      `json:"expiry_rate_per_second"`
	LeadSeconds    float64      `json:"lead_seconds"`
	CreateSeconds  float64      `json:"create_seconds"`
	CreateRate     float64      `json:"create_pods_per_second"`
	All            latency      `json:"lateness"`
	AfterCreation  latency      `json:"lateness_deadlines_after_creation"`
	DuringCreation latency      `json:"lateness_deadlines_during_creation"`
	Histogram      histQ        `json:"podjanitor_histogram"`
	NotRemoved     int          `json:"not_removed"`
	CreatedLate    int          `json:"created_less_than_1s_before_deadline"`
	Early          int          `json:"removed_before_deadline"`
	Removed        int          `json:"removed"` // measured: created 1 s or more before the deadline, removal seen
	CPUSeconds     float64      `json:"podjanitor_cpu_seconds"`
	WallSeconds    float64      `json:"podjanitor_wall_seconds"`
	PeakRSS        float64      `json:"podjanitor_peak_rss_bytes"`
	Requests       apiRequests  `json:"podjanitor_api_requests"`
	Tail           tailEvidence `json:"tail_evidence"`
	// With -ideal: the ideal remover's namespace, and podjanitor against it.
	Ideal   *idealSide   `json:"ideal,omitempty"`
	VsIdeal *versusIdeal `json:"podjanitor_vs_ideal,omitempty"`
}

// tailEvidence is what sets the lateness tail: the API server's own time for
// the DELETEs of the window (apiserver_request_duration_seconds, the
// request's whole life in the server, APF wait included), the DELETE as
// podjanitor's client saw it (rest_client_request_duration_seconds), the
// time requests waited in API Priority and Fairness, and podjanitor's GC
// pauses. Shares over 25 ms, a bound of both histograms, compare with the
// watcher's.
type tailEvidence struct {
	ServerDelete      histQ   `json:"apiserver_delete_pods"`
	ServerDeleteOver  float64 `json:"apiserver_delete_pods_share_over_25ms"`
	ServerCreateEvent histQ   `json:"apiserver_create_events"`
	ClientDelete      histQ   `json:"podjanitor_client_delete"`
	ClientDeleteOver  float64 `json:"podjanitor_client_delete_share_over_25ms"`
	WatcherOver       float64 `json:"watcher_lateness_share_over_25ms"`
	APFWaitCount      float64 `json:"apf_requests"`
	APFWaitSeconds    float64 `json:"apf_wait_seconds_total"`
	ClockOffset       float64 `json:"podjanitor_clock_offset_seconds"`
	// ServerCPUSeconds is the kube-apiserver process's CPU between the end of
	// creation and the end of the window (ServerSeconds).
	ServerCPUSeconds float64 `json:"apiserver_cpu_seconds"`
	ServerSeconds    float64 `json:"apiserver_cpu_interval_seconds"`
	GCs              int     `json:"podjanitor_gcs"`
	GCMaxPauseMs     float64 `json:"podjanitor_gc_max_pause_ms"`
}

func quantiles(m metrics, name string) histQ {
	q := histQ{
		Count: m.sum(name + "_count"),
		P50:   m.histQuantile(name, 0.50),
		P90:   m.histQuantile(name, 0.90),
		P99:   m.histQuantile(name, 0.99),
	}
	if q.Count > 0 {
		q.Mean = m.sum(name+"_sum") / q.Count
	}
	return q
}

func (b *bench) steady(ctx context.Context, window time.Duration) (*steadyResult, error) {
	n := b.cfg.pods
	ns := "bench-steady-" + durName(window)
	idealNS := ns + "-ideal"
	out := &steadyResult{Pods: n, Window: window.String(), Rate: float64(n) / window.Seconds()}
	if err := b.ensureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	tr, err := watchNamespace(ctx, b.cs, ns)
	if err != nil {
		return nil, err
	}
	copies := 1
	var itr *tracker
	var ideal *idealRemover
	if b.cfg.ideal {
		copies = 2
		if err := b.ensureNamespace(ctx, idealNS); err != nil {
			return nil, err
		}
		if itr, err = watchNamespace(ctx, b.cs, idealNS); err != nil {
			return nil, err
		}
		del, err := idealDeleter(b.rest, idealNS, b.cfg.qps, b.cfg.burst)
		if err != nil {
			return nil, err
		}
		ideal = newIdealRemover(ctx, clock.RealClock{}, del)
		defer ideal.stop()
	}
	j, err := startJanitor(b.cfg, "steady-"+durName(window), ns, b.cfg.workers)
	if err != nil {
		return nil, err
	}
	defer j.stop()
	if _, err := j.waitReady(time.Minute); err != nil {
		return nil, err
	}
	rss := sampleRSS(j.started, time.Second, []string{"podjanitor"}, j.proc)
	rssStopped := false
	defer func() {
		if !rssStopped {
			rss.stop()
		}
	}()
	lead := b.cfg.lead
	if lead == 0 {
		// Creation runs at about b.createRate (measured earlier), but that rate
		// varies by half from run to run on a shared machine: give creation
		// twice the time, so that the window measures expiry alone (-lead
		// shorter than that overlaps creation with the window).
		createTime := time.Duration(float64(copies*n) / b.createRate * float64(time.Second))
		lead = 20*time.Second + 2*createTime
	}
	out.LeadSeconds = lead.Seconds()
	t0 := time.Now()
	first := t0.Add(lead)
	deadline := func(i int) time.Time {
		return first.Add(time.Duration((float64(i) + 0.5) / float64(n) * float64(window)))
	}
	// The ideal's deadlines fall halfway between podjanitor's: N of them,
	// uniform over the same window, without the two removers' DELETEs
	// meeting at the same instants.
	idealDeadline := func(i int) time.Time {
		return first.Add(time.Duration(float64(i+1) / float64(n) * float64(window)))
	}
	if ideal != nil {
		out.Ideal = &idealSide{Namespace: idealNS}
		logf("steady %s: %d pods in each of %s (podjanitor) and %s (the ideal remover), deadlines from +%.0fs over %s (%.1f/s each)",
			window, n, ns, idealNS, lead.Seconds(), window, out.Rate)
	} else {
		logf("steady %s: %d pods, deadlines from +%.0fs over %s (%.1f/s)", window, n, lead.Seconds(), window, out.Rate)
	}
	mk := func(i int) *corev1.Pod {
		if ideal == nil {
			return workload.Pod(ns, fmt.Sprintf("steady-%06d", i), "steady", i, deadline(i), "")
		}
		k, isIdeal := interleaved(i)
		if isIdeal {
			return workload.Pod(idealNS, fmt.Sprintf("steady-%06d", k), "steady", k, idealDeadline(k), "")
		}
		return workload.Pod(ns, fmt.Sprintf("steady-%06d", k), "steady", k, deadline(k), "")
	}
	var then func(i int, created *corev1.Pod)
	if ideal != nil {
		then = func(i int, created *corev1.Pod) {
			if k, isIdeal := interleaved(i); isIdeal {
				ideal.schedule(created.Name, created.UID, idealDeadline(k))
			}
		}
	}
	cr := createPodsThen(ctx, b.cs, copies*n, b.cfg.createConc, "steady "+window.String(), mk, false, then)
	createdEnd := time.Now()
	out.CreateSeconds, out.CreateRate = cr.duration.Seconds(), cr.rate
	b.createRate = cr.rate
	// created is when pod k of a namespace was created (zero: it failed).
	created := func(k int, isIdeal bool) time.Time {
		if ideal == nil {
			return cr.created[k]
		}
		return cr.created[copyIndex(k, isIdeal)]
	}
	countCreated := func(isIdeal bool) int {
		c := 0
		for k := range n {
			if !created(k, isIdeal).IsZero() {
				c++
			}
		}
		return c
	}
	serverBefore, err := apiServerMetrics(ctx, b.cs)
	if err != nil {
		return out, err
	}
	serverFrom := time.Now()
	wait := time.Until(deadline(n-1)) + 60*time.Second
	tr.waitGone(ctx, countCreated(false), wait, "steady "+window.String())
	if itr != nil {
		itr.waitGone(ctx, countCreated(true), time.Until(idealDeadline(n-1))+10*time.Second, "steady "+window.String()+" ideal")
	}
	if ctx.Err() != nil {
		return out, ctx.Err()
	}
	time.Sleep(time.Second)
	m, err := j.scrape()
	if err != nil {
		return out, err
	}
	serverAfter, err := apiServerMetrics(ctx, b.cs)
	if err != nil {
		return out, err
	}
	server := serverAfter.minus(serverBefore)
	deletes := server.only(`verb="DELETE"`, `resource="pods"`, `subresource=""`)
	clientDeletes := m.only(`verb="DELETE"`)
	apf := server.only(`execute="true"`)
	out.Tail = tailEvidence{
		ServerDelete:      quantiles(deletes, "apiserver_request_duration_seconds"),
		ServerDeleteOver:  deletes.fractionOver("apiserver_request_duration_seconds", 0.025),
		ServerCreateEvent: quantiles(server.only(`verb="POST"`, `resource="events"`), "apiserver_request_duration_seconds"),
		ClientDelete:      quantiles(clientDeletes, "rest_client_request_duration_seconds"),
		ClientDeleteOver:  clientDeletes.fractionOver("rest_client_request_duration_seconds", 0.025),
		APFWaitCount:      apf.sum("apiserver_flowcontrol_request_wait_duration_seconds_count"),
		APFWaitSeconds:    apf.sum("apiserver_flowcontrol_request_wait_duration_seconds_sum"),
		ClockOffset:       m.sum("podjanitor_clock_offset_seconds"),
		ServerCPUSeconds:  server.sum("process_cpu_seconds_total"),
		ServerSeconds:     time.Since(serverFrom).Seconds(),
	}
	out.Tail.GCs, out.Tail.GCMaxPauseMs = j.gcPauses(first.Sub(j.started), time.Since(j.started))
	p := j.proc()
	out.CPUSeconds, out.PeakRSS, out.WallSeconds = p.CPUSecond, float64(p.PeakRSS), time.Since(j.started).Seconds()
	out.Requests = requestsFrom(m)
	out.Histogram = latenessHistogram(m)
	rssSeries := rss.stop()
	rssStopped = true

	pj := sortLateness(n, func(k int) time.Time { return created(k, false) }, deadline, tr.snapshot(), createdEnd)
	out.CreatedLate, out.NotRemoved, out.Early, out.Removed = pj.createdLate, pj.notRemoved, pj.early, len(pj.all)
	out.All, out.AfterCreation, out.DuringCreation = latencyOf(pj.all), latencyOf(pj.after), latencyOf(pj.during)
	over := 0
	for _, l := range pj.all {
		if l > 25*time.Millisecond {
			over++
		}
	}
	if len(pj.all) > 0 {
		out.Tail.WatcherOver = float64(over) / float64(len(pj.all))
	}
	logf("steady %s: lateness p50 %s p99 %s max %s (%d measured, %d not removed, %d created late)", window,
		ms(out.All.P50), ms(out.All.P99), ms(out.All.Max), out.All.Count, out.NotRemoved, out.CreatedLate)
	removers := []remover{{"podjanitor", pj.all}}
	if ideal != nil {
		ideal.stop()
		id := sortLateness(n, func(k int) time.Time { return created(k, true) }, idealDeadline, itr.snapshot(), createdEnd)
		s := out.Ideal
		s.CreatedLate, s.NotRemoved, s.Early, s.Removed = id.createdLate, id.notRemoved, id.early, len(id.all)
		s.Lateness = latencyOf(id.all)
		s.fillFires(ideal.results())
		v := compareToIdeal(out.All, s.Lateness)
		out.VsIdeal = &v
		removers = append(removers, remover{"ideal remover", id.all})
		logf("steady %s: ideal remover: lateness p50 %s p99 %s max %s (%d measured, %d not removed, %d DELETE errors); podjanitor − ideal: p50 %+.1f ms, p99 %+.1f ms",
			window, ms(s.Lateness.P50), ms(s.Lateness.P99), ms(s.Lateness.Max), s.Lateness.Count, s.NotRemoved, s.DeleteErrors, v.P50DiffMs, v.P99DiffMs)
	}
	base := "steady-" + durName(window)
	b.chart(b.writeLatenessCDF(base+"-lateness",
		fmt.Sprintf("steady %s: lateness CDF, %d pods per remover over %s (%.0f/s each)", window, n, window, out.Rate), removers))
	since := func(t time.Time) float64 { return t.Sub(j.started).Seconds() }
	b.chart(b.writeRSSChart(base+"-rss", fmt.Sprintf("steady %s: podjanitor's RSS, %d pods in its namespace", window, n), rssSeries,
		[]chartMark{{"creation ended", since(createdEnd)}, {"first deadline", since(first)}, {"last deadline", since(deadline(n - 1))}}))
	return out, nil
}

// interleaved maps the i-th pod created to pod k of the two namespaces of a
// run with two removers: pods 2k and 2k+1 are the two copies of pod k, and
// which copy goes first alternates with k (false: the first namespace's).
func interleaved(i int) (k int, second bool) {
	k = i / 2
	return k, (i%2 == 0) != (k%2 == 0)
}

// copyIndex is interleaved's inverse: the creation index of pod k's copy.
func copyIndex(k int, second bool) int {
	if second == (k%2 == 0) {
		return 2*k + 1
	}
	return 2 * k
}

// sortedLateness is one namespace's pods of a steady run, sorted.
type sortedLateness struct {
	all, after, during             []time.Duration
	createdLate, notRemoved, early int
}

// sortLateness measures pods 0..n-1 of a namespace: created(k) is when pod k
// was created (zero: creation failed), deadline(k) its deadline, gone the
// removals the watcher saw by name. Pods created less than 1 s before their
// deadline are not measured; the others are split by whether their deadline
// came after createdEnd.
func sortLateness(n int, created, deadline func(k int) time.Time, gone map[string]time.Time, createdEnd time.Time) sortedLateness {
	var s sortedLateness
	for k := range n {
		d := deadline(k)
		c := created(k)
		if c.IsZero() {
			continue // creation failed
		}
		if c.After(d.Add(-time.Second)) {
			s.createdLate++
			continue
		}
		g, ok := gone[fmt.Sprintf("steady-%06d", k)]
		if !ok {
			s.notRemoved++
			continue
		}
		late := g.Sub(d)
		if late < 0 {
			s.early++
		}
		s.all = append(s.all, late)
		if d.After(createdEnd) {
			s.after = append(s.after, late)
		} else {
			s.during = append(s.during, late)
		}
	}
	return s
}

// chart records the files a chart wrote, or logs why it could not.
func (b *bench) chart(files []string, err error) {
	b.res.Charts = append(b.res.Charts, files...)
	if err != nil {
		logf("chart: %v", err)
	}
}

func durName(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	return s
}
