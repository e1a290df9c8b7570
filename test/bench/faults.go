package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podjanitor/podjanitor/internal/workload"
)

// ------------------------------------------------------------ 5: churn

// churnPoint is podjanitor's memory once pods seen have gone through, with
// live of them still there; heap figures are taken right after a forced GC.
type churnPoint struct {
	Seen        int     `json:"pods_seen"`
	Live        int     `json:"pods_live"`
	Seconds     float64 `json:"seconds"`
	HeapInuse   float64 `json:"go_heap_inuse_after_gc_bytes"`
	HeapObjects float64 `json:"go_heap_objects_after_gc"`
	RSS         float64 `json:"rss_bytes"`
	Scheduled   float64 `json:"pods_scheduled"`
}

type churnResult struct {
	Pods     int          `json:"pods"`
	Live     int          `json:"live"`
	Batch    int          `json:"batch"`
	Rule     string       `json:"rule"`
	Rate     float64      `json:"pods_per_second"` // created and deleted
	Points   []churnPoint `json:"points"`
	Final    churnPoint   `json:"final_no_pods_live"`
	PerSeen  perPod       `json:"per_pod_seen"` // least-squares slope over the points past the warm-up
	PerLive  perPod       `json:"per_live_pod"` // the last full point minus the final one, per live pod
	PeakRSS  float64      `json:"peak_rss_bytes"`
	CPU      float64      `json:"cpu_seconds"`
	Requests apiRequests  `json:"podjanitor_api_requests"`
}

type perPod struct {
	HeapBytes float64 `json:"heap_bytes"`
	Objects   float64 `json:"heap_objects"`
	RSSBytes  float64 `json:"rss_bytes"`
}

// churn creates and deletes pods far faster than a 7-day `created` rule
// removes them, with live pods present at a time, and measures podjanitor's
// memory as pods go through: it should follow the live pods.
func (b *bench) churn(ctx context.Context) (*churnResult, error) {
	n, live, batch := b.cfg.churnPods, b.cfg.churnLive, b.cfg.churnBatch
	if n == 0 {
		n = b.cfg.pods
	}
	live = max(live/batch, 1) * batch
	ns := "bench-churn"
	out := &churnResult{Pods: n, Live: live, Batch: batch, Rule: "created, after 168h"}
	if err := b.ensureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	policy := filepath.Join(b.cfg.outDir, "churn-policy.yaml")
	err := os.WriteFile(policy, []byte(`apiVersion: podjanitor.io/v1alpha1
kind: PodJanitorPolicy
rules:
  - name: a-week
    match: {namespaces: {include: [`+ns+`]}}
    clock: created
    after: 168h
`), 0o644)
	if err != nil {
		return nil, err
	}
	command := append(strings.Fields(b.cfg.podjanitor), "--config="+policy, "--profiling")
	j, err := startJanitorBinary(b.cfg, command, "churn", ns, b.cfg.workers)
	if err != nil {
		return nil, err
	}
	defer j.stop()
	if _, err := j.waitReady(time.Minute); err != nil {
		return nil, err
	}

	start := time.Now()
	every := max(n/10/batch, 1) * batch
	seen := 0
	logf("churn: %d pods through a 7-day rule, %d live at a time, in batches of %d", n, live, batch)
	measure := func(liveNow int) (churnPoint, error) {
		p, err := b.churnPoint(ctx, j, seen, liveNow)
		p.Seconds = time.Since(start).Seconds()
		return p, err
	}
	for seen < n {
		k := seen / batch
		cr := createPods(ctx, b.cs, batch, b.cfg.createConc, fmt.Sprintf("churn %d/%d", seen+batch, n), func(i int) *corev1.Pod {
			p := workload.Pod(ns, fmt.Sprintf("churn-%07d", seen+i), "churn", seen+i, time.Time{}, "")
			delete(p.Annotations, workload.AnnotationExpiresAt) // the rule decides
			p.Labels["batch"] = fmt.Sprint(k)
			return p
		}, false)
		if cr.errors > 0 {
			return out, fmt.Errorf("churn: %d pods failed to be created", cr.errors)
		}
		seen += batch
		if old := k - live/batch; old >= 0 {
			if err := b.deleteBatch(ctx, ns, old); err != nil {
				return out, err
			}
		}
		if seen%every == 0 || seen == n {
			p, err := measure(min(seen, live))
			if err != nil {
				return out, err
			}
			logf("churn: %d pods seen, %d live: heap in use %s after GC, %.0f objects, RSS %s", p.Seen, p.Live, mib(p.HeapInuse), p.HeapObjects, mib(p.RSS))
			out.Points = append(out.Points, p)
		}
	}
	for k := max(seen/batch-live/batch, 0); k < seen/batch; k++ {
		if err := b.deleteBatch(ctx, ns, k); err != nil {
			return out, err
		}
	}
	out.Rate = float64(n) / time.Since(start).Seconds()
	if out.Final, err = measure(0); err != nil {
		return out, err
	}
	var full, warm []churnPoint // points with the window full of live pods; and past the warm-up
	for _, p := range out.Points {
		if p.Live == live {
			full = append(full, p)
		}
		if p.Live == live && p.Seen >= 2*live { // the first live pods have come and gone
			warm = append(warm, p)
		}
	}
	if len(warm) < 3 {
		warm = full
	}
	if len(warm) >= 2 {
		out.PerSeen = perPod{
			slope(warm, func(p churnPoint) float64 { return p.HeapInuse }),
			slope(warm, func(p churnPoint) float64 { return p.HeapObjects }),
			slope(warm, func(p churnPoint) float64 { return p.RSS }),
		}
	}
	if len(full) > 0 {
		last := full[len(full)-1]
		out.PerLive = perPod{(last.HeapInuse - out.Final.HeapInuse) / float64(live),
			(last.HeapObjects - out.Final.HeapObjects) / float64(live), (last.RSS - out.Final.RSS) / float64(live)}
	}
	m, err := j.scrape()
	if err != nil {
		return out, err
	}
	p := j.proc()
	out.PeakRSS, out.CPU, out.Requests = float64(p.PeakRSS), p.CPUSecond, requestsFrom(m)
	logf("churn: %d pods at %.0f/s; per pod seen %.0f B heap, %.2f objects; per live pod %.0f B heap", n, out.Rate,
		out.PerSeen.HeapBytes, out.PerSeen.Objects, out.PerLive.HeapBytes)
	return out, nil
}

// slope is the least-squares slope of y over the pods seen.
func slope(ps []churnPoint, y func(churnPoint) float64) float64 {
	var sx, sy, sxx, sxy float64
	for _, p := range ps {
		x := float64(p.Seen)
		sx, sy, sxx, sxy = sx+x, sy+y(p), sxx+x*x, sxy+x*y(p)
	}
	n := float64(len(ps))
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}

func (b *bench) deleteBatch(ctx context.Context, ns string, k int) error {
	return b.cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: fmt.Sprintf("batch=%d", k)})
}

// churnPoint waits until podjanitor has caught up (as many pods scheduled as
// live), forces a GC through pprof, and reads its memory.
func (b *bench) churnPoint(ctx context.Context, j *janitor, seen, live int) (churnPoint, error) {
	p := churnPoint{Seen: seen, Live: live}
	var m metrics
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		var err error
		if m, err = j.scrape(); err != nil {
			return false, err
		}
		return m.sum("podjanitor_pods_scheduled") == float64(live), nil
	})
	if err != nil {
		return p, fmt.Errorf("churn: podjanitor has %.0f pods scheduled, want %d: %w", m.sum("podjanitor_pods_scheduled"), live, err)
	}
	// The heap profile with gc=1 runs a GC first.
	resp, err := http.Get(strings.TrimSuffix(j.metricsURL, "/metrics") + "/debug/pprof/heap?gc=1")
	if err != nil {
		return p, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if m, err = j.scrape(); err != nil {
		return p, err
	}
	p.HeapInuse, p.HeapObjects = m.sum("go_memstats_heap_inuse_bytes"), m.sum("go_memstats_heap_objects")
	p.Scheduled, p.RSS = m.sum("podjanitor_pods_scheduled"), float64(j.proc().RSSBytes)
	return p, nil
}

// ---------------------------------------------------------- 6: recovery

type recoveryResult struct {
	Pods          int     `json:"pods"`
	OutageSeconds float64 `json:"outage_seconds"`  // stop command to ready again
	DownSeconds   float64 `json:"stopped_seconds"` // kube-apiserver not running
	StartSeconds  float64 `json:"start_seconds"`   // start command to ready
	// Removal time (seen by a watcher) minus the moment the API server was
	// ready again; pods already gone when the watcher listed count as then.
	AfterRecovery latency     `json:"removal_after_recovery"`
	LastRemoval   float64     `json:"last_removal_after_recovery_seconds"`
	NotRemoved    int         `json:"not_removed"`
	Histogram     histQ       `json:"podjanitor_histogram"`
	Requests      apiRequests `json:"podjanitor_api_requests"`
}

// recovery stops kube-apiserver for the outage while N pods come due and
// measures how long after its return podjanitor takes to remove them.
func (b *bench) recovery(ctx context.Context) (*recoveryResult, error) {
	if b.cfg.clusterDir == "" {
		return nil, fmt.Errorf("recovery stops the local cluster's kube-apiserver: it needs -cluster-dir (hack/bench.sh passes it)")
	}
	n, outage := b.cfg.pods, b.cfg.outage
	ns := "bench-recovery"
	out := &recoveryResult{Pods: n}
	if err := b.ensureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	j, err := startJanitor(b.cfg, "recovery", ns, b.cfg.workers)
	if err != nil {
		return nil, err
	}
	defer j.stop()
	if _, err := j.waitReady(time.Minute); err != nil {
		return nil, err
	}
	// The outage begins once creation is over (at twice the creation rate
	// measured so far); the deadlines are spread over it, 5 s from either end.
	stopAt := time.Now().Add(20*time.Second + 2*time.Duration(float64(n)/b.createRate*float64(time.Second)))
	deadline := func(i int) time.Time {
		return stopAt.Add(5*time.Second + time.Duration((float64(i)+0.5)/float64(n)*float64(outage-10*time.Second)))
	}
	logf("recovery: %d pods due during a %s outage from %s", n, outage, stopAt.Format("15:04:05"))
	cr := createPods(ctx, b.cs, n, b.cfg.createConc, "recovery", func(i int) *corev1.Pod {
		return workload.Pod(ns, fmt.Sprintf("recovery-%06d", i), "recovery", i, deadline(i), "")
	}, false)
	if cr.errors > 0 {
		return out, fmt.Errorf("recovery: %d pods failed to be created", cr.errors)
	}
	b.createRate = cr.rate
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Until(stopAt), true, func(context.Context) (bool, error) {
		m, err := j.scrape()
		return err == nil && m.sum("podjanitor_pods_scheduled") == float64(n), nil
	})
	if err != nil {
		return out, fmt.Errorf("recovery: podjanitor did not schedule the %d pods before the outage: %w", n, err)
	}
	time.Sleep(time.Until(stopAt))

	stopping := time.Now()
	if err := b.localCluster("stop-apiserver"); err != nil {
		return out, err
	}
	stopped := time.Now()
	stop := progress(func() string {
		return fmt.Sprintf("recovery: kube-apiserver down for %.0f/%.0f s", time.Since(stopped).Seconds(), outage.Seconds())
	})
	time.Sleep(time.Until(stopping.Add(outage)))
	stop()
	starting := time.Now()
	if err := b.localCluster("start-apiserver"); err != nil {
		return out, err
	}
	ready := time.Now()
	out.OutageSeconds, out.DownSeconds, out.StartSeconds = ready.Sub(stopping).Seconds(), starting.Sub(stopped).Seconds(), ready.Sub(starting).Seconds()

	// A new watcher; the pods that went before its list count as gone then.
	left, rv, err := b.countPods(ctx, ns)
	if err != nil {
		return out, err
	}
	listed := time.Now()
	tr, err := watchFrom(ctx, b.cs, ns, rv)
	if err != nil {
		return out, err
	}
	tr.waitGone(ctx, left, 10*time.Minute, "recovery")
	var after []time.Duration
	for range n - left {
		after = append(after, listed.Sub(ready))
	}
	for _, at := range tr.snapshot() {
		after = append(after, at.Sub(ready))
	}
	out.NotRemoved = n - len(after)
	out.AfterRecovery = latencyOf(after)
	out.LastRemoval = out.AfterRecovery.Max / 1000
	time.Sleep(time.Second)
	if m, err := j.scrape(); err == nil {
		out.Requests = requestsFrom(m)
		out.Histogram = latenessHistogram(m)
	}
	logf("recovery: kube-apiserver back %.1f s after the stop; last removal %.1f s after that (%d not removed)",
		out.OutageSeconds, out.LastRemoval, out.NotRemoved)
	return out, nil
}

// countPods counts the pods of ns, a page at a time, and returns the
// resourceVersion of the list.
func (b *bench) countPods(ctx context.Context, ns string) (int, string, error) {
	n, rv, cont := 0, "", ""
	for {
		list, err := b.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1000, Continue: cont})
		if err != nil {
			return 0, "", err
		}
		if rv == "" {
			rv = list.ResourceVersion
		}
		n += len(list.Items)
		if cont = list.Continue; cont == "" {
			return n, rv, nil
		}
	}
}

// localCluster runs hack/local-cluster.sh on the bench's cluster.
func (b *bench) localCluster(args ...string) error {
	cmd := exec.Command("hack/local-cluster.sh", args...)
	cmd.Env = append(os.Environ(), "CLUSTER_DIR="+b.cfg.clusterDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/local-cluster.sh %v: %w\n%s", args, err, out)
	}
	return nil
}
