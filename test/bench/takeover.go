package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podjanitor/podjanitor/internal/workload"
)

// ------------------------------------------------------------ takeover

// takeoverRun is one takeover: two podjanitors with --leader-elect, the
// leader SIGKILLed once the other is a synced standby, -takeover-due pods due
// over -takeover-spread from the kill, the other pods of the namespace a day
// away. Times "after the kill" count from the SIGKILL; removals are the
// watcher's.
type takeoverRun struct {
	Pods         int     `json:"pods"` // in the namespace at the kill, the due ones included
	Due          int     `json:"due"`
	SyncSeconds  float64 `json:"sync_seconds"`           // both started -> both /readyz 200 (the later)
	LeaderPutsPS float64 `json:"leader_puts_per_second"` // the leader's PUTs (its Lease renewals) before the kill
	// After the kill: the Lease's acquireTime for the survivor; when its
	// podjanitor_leader and podjanitor_workers_running were first seen at 1
	// (polled every 100 ms); when it had parked every pod not due again.
	AcquiredSeconds float64 `json:"lease_acquired_after_kill_seconds"`
	LeaderSeconds   float64 `json:"leader_metric_after_kill_seconds"`
	WorkersSeconds  float64 `json:"workers_running_after_kill_seconds"`
	ParkedSeconds   float64 `json:"far_pods_parked_after_kill_seconds"`
	BeforeLead      int     `json:"due_removed_before_the_lease_taken"`
	// A named field: the results' JSON (finite) leaves unexported fields
	// out, embedded ones too.
	Removals takeoverTimes `json:"removals"`
	// CatchUpShare is shareOfCap of the gap pods' catch-up.
	CatchUpShare     float64     `json:"catch_up_share_of_cap"`
	GoalFirstSeconds float64     `json:"goal_first_removal_seconds"` // lease duration + 2 s
	GoalFirstMet     bool        `json:"goal_first_removal_met"`
	LeaderRSS        float64     `json:"leader_rss_before_kill_bytes"`
	StandbyRSS       float64     `json:"standby_rss_before_kill_bytes"`
	SurvivorPeakRSS  float64     `json:"survivor_peak_rss_bytes"`
	SurvivorCPU      float64     `json:"survivor_cpu_after_kill_seconds"` // kill -> last removal + 1 s
	Histogram        histQ       `json:"survivor_histogram"`
	Requests         apiRequests `json:"survivor_api_requests"`
}

type takeoverResult struct {
	Namespace     string        `json:"namespace"`
	Pods          int           `json:"pods"`
	Due           int           `json:"due"`
	Spread        string        `json:"due_spread_after_kill"`
	LeaseDuration string        `json:"lease_duration"`
	RenewDeadline string        `json:"renew_deadline"`
	RetryPeriod   string        `json:"retry_period"`
	MaxDeletions  float64       `json:"max_deletions_per_second"` // podjanitor's cap (0: none); its burst is 100
	Runs          []takeoverRun `json:"runs"`
	// Medians over the runs.
	MedianFirst  float64 `json:"median_first_removal_after_kill_seconds"`
	MedianLast   float64 `json:"median_last_removal_after_kill_seconds"`
	MedianAcq    float64 `json:"median_lease_acquired_after_kill_seconds"`
	MedianP50    float64 `json:"median_lateness_p50_ms"`
	MedianP99    float64 `json:"median_lateness_p99_ms"`
	MedianShare  float64 `json:"median_catch_up_share_of_cap"`
	MedianParked float64 `json:"median_far_pods_parked_after_kill_seconds"`
}

// takeoverTimes is what the watcher saw of the due pods of a takeover.
type takeoverTimes struct {
	First     float64 `json:"first_removal_after_kill_seconds"`
	Last      float64 `json:"last_removal_after_kill_seconds"`
	Lateness  latency `json:"lateness"` // removal seen - deadline, every due pod removed
	Removed   int     `json:"removed"`
	NotRemvd  int     `json:"not_removed"`
	Early     int     `json:"removed_before_deadline"`
	BeforeK   int     `json:"removed_before_kill"`
	Others    int     `json:"other_pods_removed"` // pods not due (a day away) removed: must be 0
	GapPods   int     `json:"gap_pods"`           // due before the first removal after the kill
	CatchUp   float64 `json:"catch_up_seconds"`   // first removal -> the last gap pod's removal
	CatchRate float64 `json:"catch_up_pods_per_second"`
	// OnTime is when, after the kill, the last due pod removed 1 s or more
	// past its deadline went: every due pod after it went within 1 s.
	OnTime float64 `json:"late_by_1s_until_after_kill_seconds"`
}

// measureTakeover computes takeoverTimes from the kill, the due pods'
// deadlines by name, and every removal the watcher saw in the namespace by
// name (pods not in deadlines are the ones not due).
func measureTakeover(kill time.Time, deadlines, gone map[string]time.Time) takeoverTimes {
	var t takeoverTimes
	var first, last time.Time
	var late []time.Duration
	for name, at := range gone {
		d, due := deadlines[name]
		if !due {
			t.Others++
			continue
		}
		t.Removed++
		if at.Before(kill) {
			t.BeforeK++
		}
		if at.Before(d) {
			t.Early++
		}
		late = append(late, at.Sub(d))
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	t.NotRemvd = len(deadlines) - t.Removed
	t.Lateness = latencyOf(late)
	if t.Removed == 0 {
		t.First, t.Last, t.CatchUp, t.CatchRate, t.OnTime = math.NaN(), math.NaN(), math.NaN(), math.NaN(), math.NaN()
		return t
	}
	t.First, t.Last = first.Sub(kill).Seconds(), last.Sub(kill).Seconds()
	var gapLast, onTime time.Time
	for name, d := range deadlines {
		at, ok := gone[name]
		if !ok {
			continue
		}
		if d.Before(first) {
			t.GapPods++
			if at.After(gapLast) {
				gapLast = at
			}
		}
		if at.Sub(d) >= time.Second && at.After(onTime) {
			onTime = at
		}
	}
	t.CatchUp = gapLast.Sub(first).Seconds()
	if t.GapPods == 0 {
		t.CatchUp = 0
	}
	t.CatchRate = math.NaN()
	if t.CatchUp > 0 {
		t.CatchRate = float64(t.GapPods) / t.CatchUp
	}
	t.OnTime = 0
	if !onTime.IsZero() {
		t.OnTime = onTime.Sub(kill).Seconds()
	}
	return t
}

// shareOfCap is the time the removal cap with its burst needs for n pods,
// (n - burst) / rate, over the time they took (as evict-backlog's share of
// the cap); NaN without a cap or with no more than the burst.
func shareOfCap(n int, seconds, rate float64, burst int) float64 {
	if rate <= 0 || n <= burst || seconds <= 0 {
		return math.NaN()
	}
	return float64(n-burst) / rate / seconds
}

// dueAfterKill is when, after the kill, the first due pod is due.
const dueAfterKill = 500 * time.Millisecond

const removalBurst = 100 // podjanitor's --max-deletions-burst default

func (b *bench) takeover(ctx context.Context) (*takeoverResult, error) {
	if podMode != nil {
		return nil, fmt.Errorf("takeover runs two podjanitor processes: not with -pod-manifests")
	}
	cfg := b.cfg
	n, due, ns := cfg.takeoverPods, cfg.takeoverDue, cfg.takeoverNamespace
	if n == 0 {
		n = cfg.pods
	}
	out := &takeoverResult{Namespace: ns, Due: due, Spread: cfg.takeoverSpread.String(),
		LeaseDuration: cfg.leaseDuration.String(), RenewDeadline: cfg.renewDeadline.String(), RetryPeriod: cfg.retryPeriod.String(),
		MaxDeletions: cfg.maxDeletions}
	if err := b.ensureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	// Pods already in the namespace (the idle scenario's, with
	// -takeover-namespace bench-idle) count among the N; none may be due.
	existing, _, err := b.countPods(ctx, ns)
	if err != nil {
		return nil, err
	}
	far := max(n-due-existing, 0)
	if far > 0 {
		logf("takeover: %d pods in %s a day from their deadline (%d there already)", far, ns, existing)
		until := time.Now().Add(24 * time.Hour)
		cr := createPods(ctx, b.cs, far, cfg.createConc, "takeover far", func(i int) *corev1.Pod {
			return workload.Pod(ns, fmt.Sprintf("far-%06d", existing+i), "takeover", i, until.Add(time.Duration(i)*time.Millisecond), "")
		}, false)
		if cr.errors > 0 {
			return out, fmt.Errorf("takeover: %d pods failed to be created", cr.errors)
		}
		b.createRate = cr.rate
	}
	out.Pods = existing + far + due
	for r := range cfg.runs {
		run, err := b.takeoverOnce(ctx, ns, r+1, existing+far)
		if run != nil {
			out.Runs = append(out.Runs, *run)
		}
		if err != nil {
			return out, err
		}
	}
	med := func(f func(takeoverRun) float64) float64 {
		var xs []float64
		for _, r := range out.Runs {
			xs = append(xs, f(r))
		}
		return median(xs)
	}
	out.MedianFirst = med(func(r takeoverRun) float64 { return r.Removals.First })
	out.MedianLast = med(func(r takeoverRun) float64 { return r.Removals.Last })
	out.MedianAcq = med(func(r takeoverRun) float64 { return r.AcquiredSeconds })
	out.MedianP50 = med(func(r takeoverRun) float64 { return r.Removals.Lateness.P50 })
	out.MedianP99 = med(func(r takeoverRun) float64 { return r.Removals.Lateness.P99 })
	out.MedianParked = med(func(r takeoverRun) float64 { return r.ParkedSeconds })
	out.MedianShare = med(func(r takeoverRun) float64 { return r.CatchUpShare })
	return out, nil
}

// takeoverOnce runs one takeover on ns, which holds farPods pods not due.
func (b *bench) takeoverOnce(ctx context.Context, ns string, r, farPods int) (*takeoverRun, error) {
	cfg := b.cfg
	due := cfg.takeoverDue
	run := &takeoverRun{Pods: farPods + due, Due: due, GoalFirstSeconds: (cfg.leaseDuration + 2*time.Second).Seconds()}
	lease := fmt.Sprintf("bench-takeover-%d", r)
	flags := func() []string {
		return []string{
			"--namespace=" + ns,
			fmt.Sprintf("--workers=%d", cfg.workers),
			fmt.Sprintf("--kube-api-qps=%g", cfg.qps),
			fmt.Sprintf("--kube-api-burst=%d", cfg.burst),
			fmt.Sprintf("--max-deletions-per-second=%g", cfg.maxDeletions),
			"--leader-elect",
			"--leader-elect-resource-name=" + lease,
			"--leader-elect-resource-namespace=" + ns,
			"--leader-elect-lease-duration=" + cfg.leaseDuration.String(),
			"--leader-elect-renew-deadline=" + cfg.renewDeadline.String(),
			"--leader-elect-retry-period=" + cfg.retryPeriod.String(),
		}
	}
	command := strings.Fields(cfg.podjanitor)
	var js [2]*janitor
	for i := range js {
		c := *cfg
		c.metricsPort = cfg.metricsPort + 2*i // metrics and health of the second on the next two ports
		j, err := startJanitorWith(&c, command, fmt.Sprintf("takeover-%d-%c", r, 'a'+i), flags(), ns)
		if err != nil {
			return nil, err
		}
		defer j.stop()
		js[i] = j
	}
	logf("takeover run %d/%d: two podjanitors with --leader-elect on the Lease %s/%s, %d pods", r, cfg.runs, ns, lease, farPods)
	for _, j := range js {
		sync, err := j.waitReady(15 * time.Minute)
		if err != nil {
			return nil, err
		}
		run.SyncSeconds = max(run.SyncSeconds, sync.Seconds())
	}
	// One leads (its workers run: /readyz), the other is a synced standby.
	var leader, standby *janitor
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		leader, standby = nil, nil
		for i, j := range js {
			m, err := j.scrape()
			if err != nil {
				return false, nil
			}
			if m.sum("podjanitor_leader") == 1 && m.sum("podjanitor_workers_running") == 1 {
				leader, standby = j, js[1-i]
			}
		}
		return leader != nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("takeover: no replica leads with its workers running: %w", err)
	}
	if m, err := standby.scrape(); err != nil || m.sum("podjanitor_leader") != 0 {
		return nil, fmt.Errorf("takeover: both replicas lead, or the standby's metrics fail (%v)", err)
	}
	logf("takeover run %d: both synced in %.1f s; leader %s, standby %s", r, run.SyncSeconds, leader.logFile.Name(), standby.logFile.Name())

	tr, err := watchNamespace(ctx, b.cs, ns)
	if err != nil {
		return nil, err
	}
	// The kill comes once the due pods are created (at twice the creation
	// rate measured so far, 20 s more) and the leader has parked them; their
	// deadlines are spread over -takeover-spread from dueAfterKill after it,
	// so that the leader, once killed, cannot have removed one.
	lead := 20*time.Second + 2*time.Duration(float64(due)/b.createRate*float64(time.Second))
	kill := time.Now().Add(lead)
	deadlines := make(map[string]time.Time, due)
	deadline := func(i int) time.Time {
		return kill.Add(dueAfterKill + time.Duration(float64(i)/float64(max(due-1, 1))*float64(cfg.takeoverSpread)))
	}
	names := make([]string, due)
	for i := range due {
		names[i] = fmt.Sprintf("due-%d-%06d", r, i)
		deadlines[names[i]] = deadline(i)
	}
	lm0, err := leader.scrape()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	logf("takeover run %d: %d pods due over %s from the kill at %s", r, due, cfg.takeoverSpread, kill.Format("15:04:05.000"))
	cr := createPods(ctx, b.cs, due, cfg.createConc, fmt.Sprintf("takeover %d due", r), func(i int) *corev1.Pod {
		return workload.Pod(ns, names[i], "takeover", i, deadline(i), "")
	}, false)
	if cr.errors > 0 {
		return run, fmt.Errorf("takeover: %d due pods failed to be created", cr.errors)
	}
	b.createRate = cr.rate
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, max(time.Until(kill)-time.Second, time.Second), true, func(context.Context) (bool, error) {
		m, err := leader.scrape()
		return err == nil && m.sum("podjanitor_pods_scheduled") == float64(farPods+due), nil
	})
	if err != nil {
		return run, fmt.Errorf("takeover: the leader did not park the %d pods before the kill: %w", farPods+due, err)
	}
	// The last readings before the kill, a second ahead of it.
	time.Sleep(time.Until(kill) - time.Second)
	if lm1, err := leader.scrape(); err == nil {
		run.LeaderPutsPS = lm1.minus(lm0).sum("rest_client_requests_total", `method="PUT"`) / time.Since(t0).Seconds()
	}
	lp, sp := leader.proc(), standby.proc()
	run.LeaderRSS, run.StandbyRSS = float64(lp.RSSBytes), float64(sp.RSSBytes)
	cpu0 := sp.CPUSecond
	if time.Now().After(kill) {
		return run, fmt.Errorf("takeover: creation ran past the kill's time (lead %s); -create-concurrency or a quieter machine", lead)
	}
	time.Sleep(time.Until(kill))
	killed := time.Now()
	if err := leader.cmd.Process.Kill(); err != nil {
		return run, fmt.Errorf("takeover: SIGKILL: %w", err)
	}
	<-leader.exited
	logf("takeover run %d: leader SIGKILLed at %s", r, killed.Format("15:04:05.000"))
	// The survivor's progress, polled.
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		lastLog := time.Now()
		for time.Since(killed) < 10*time.Minute && ctx.Err() == nil {
			m, err := standby.scrape()
			now := time.Since(killed).Seconds()
			if err == nil && time.Since(lastLog) >= time.Second {
				lastLog = time.Now()
				logf("takeover run %d: survivor at +%.1f s: leader %.0f, workers %.0f, %.0f pods scheduled, %.0f waiting for a removal slot, %.0f removed",
					r, now, m.sum("podjanitor_leader"), m.sum("podjanitor_workers_running"), m.sum("podjanitor_pods_scheduled"),
					m.sum("podjanitor_pods_waiting_for_removal"), m.sum("podjanitor_pods_removed_total"))
			}
			if err == nil {
				if run.LeaderSeconds == 0 && m.sum("podjanitor_leader") == 1 {
					run.LeaderSeconds = now
				}
				if run.WorkersSeconds == 0 && m.sum("podjanitor_workers_running") == 1 {
					run.WorkersSeconds = now
				}
				if run.ParkedSeconds == 0 && run.WorkersSeconds > 0 && m.sum("podjanitor_pods_scheduled") >= float64(farPods) {
					run.ParkedSeconds = now
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	rate := cfg.maxDeletions
	if rate <= 0 {
		rate = 50
	}
	timeout := cfg.takeoverSpread + cfg.leaseDuration + 2*cfg.retryPeriod + time.Duration(float64(due)/rate*float64(time.Second)) + 2*time.Minute
	tr.waitGone(ctx, due, timeout, fmt.Sprintf("takeover %d", r))
	<-pollDone
	time.Sleep(time.Second) // a pod not due removed late would show now
	run.Removals = measureTakeover(killed, deadlines, tr.snapshot())
	run.GoalFirstMet = run.Removals.First <= run.GoalFirstSeconds
	run.CatchUpShare = shareOfCap(run.Removals.GapPods, run.Removals.CatchUp, cfg.maxDeletions, removalBurst)
	sp1 := standby.proc()
	run.SurvivorCPU, run.SurvivorPeakRSS = sp1.CPUSecond-cpu0, float64(sp1.PeakRSS)
	if m, err := standby.scrape(); err == nil {
		run.Histogram = latenessHistogram(m)
		run.Requests = requestsFrom(m)
	}
	if l, err := b.cs.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{}); err == nil && l.Spec.AcquireTime != nil {
		run.AcquiredSeconds = l.Spec.AcquireTime.Sub(killed).Seconds()
	} else if err != nil && !apierrors.IsNotFound(err) {
		logf("takeover: reading the Lease: %v", err)
	}
	logf("takeover run %d: Lease taken %.2f s after the kill, workers %.2f s; first due pod removed %.2f s after the kill (goal %.0f s: %v), last %.2f s; lateness p50 %s p99 %s; %d gap pods caught up in %.1f s (%.0f/s); early %d, not due removed %d, not removed %d",
		r, run.AcquiredSeconds, run.WorkersSeconds, run.Removals.First, run.GoalFirstSeconds, run.GoalFirstMet, run.Removals.Last,
		ms(run.Removals.Lateness.P50), ms(run.Removals.Lateness.P99), run.Removals.GapPods, run.Removals.CatchUp, run.Removals.CatchRate, run.Removals.Early, run.Removals.Others, run.Removals.NotRemvd)
	if acquired := killed.Add(time.Duration(run.AcquiredSeconds * float64(time.Second))); run.AcquiredSeconds > 0 {
		for name, at := range tr.snapshot() {
			if _, isDue := deadlines[name]; isDue && at.Before(acquired) {
				run.BeforeLead++ // the killed leader's, or removed by no podjanitor
			}
		}
	}
	if run.Removals.Early > 0 || run.Removals.Others > 0 || run.BeforeLead > 0 {
		return run, fmt.Errorf("takeover run %d: %d due pods removed before their deadline, %d pods not due removed, %d removed before the survivor took the Lease", r, run.Removals.Early, run.Removals.Others, run.BeforeLead)
	}
	return run, nil
}

func printTakeover(w *tabwriter.Writer, t *takeoverResult) {
	fmt.Fprintf(w, "\n== takeover — %d pods (%d due over %s after the leader's SIGKILL, the rest a day away); lease %s, renew deadline %s, retry %s; cap %g/s\n",
		t.Pods, t.Due, t.Spread, t.LeaseDuration, t.RenewDeadline, t.RetryPeriod, t.MaxDeletions)
	fmt.Fprintln(w, "run\tsync\tLease taken\tworkers\tfar parked\tfirst removal\tgoal\tlast removal\tp50\tp99\tmax\tgap pods\tcatch-up\tshare of cap\tlate ≥1 s until\tearly\tnot due removed\tnot removed")
	for k, r := range t.Runs {
		fmt.Fprintf(w, "%d\t%.1f s\t%.2f s\t%.2f s\t%.2f s\t%.2f s\t%s\t%.2f s\t%s\t%s\t%s\t%d\t%.1f s (%.0f/s)\t%.0f%%\t%.1f s\t%d\t%d\t%d\n", k+1,
			r.SyncSeconds, r.AcquiredSeconds, r.WorkersSeconds, r.ParkedSeconds, r.Removals.First, goalText(r), r.Removals.Last,
			ms(r.Removals.Lateness.P50), ms(r.Removals.Lateness.P99), ms(r.Removals.Lateness.Max), r.Removals.GapPods, r.Removals.CatchUp, r.Removals.CatchRate,
			100*r.CatchUpShare, r.Removals.OnTime, r.Removals.Early, r.Removals.Others, r.Removals.NotRemvd)
	}
	if len(t.Runs) > 1 {
		fmt.Fprintf(w, "median\t\t%.2f s\t\t%.2f s\t%.2f s\t\t%.2f s\t%s\t%s\t\t\t\t%.0f%%\t\t\t\t\n", t.MedianAcq, t.MedianParked, t.MedianFirst, t.MedianLast,
			ms(t.MedianP50), ms(t.MedianP99), 100*t.MedianShare)
	}
	for k, r := range t.Runs {
		fmt.Fprintf(w, "run %d: leader RSS %s, standby RSS %s before the kill; survivor peak RSS %s, CPU %.1f s from the kill; the leader's PUTs (Lease renewals) %.2f/s\n",
			k+1, mib(r.LeaderRSS), mib(r.StandbyRSS), mib(r.SurvivorPeakRSS), r.SurvivorCPU, r.LeaderPutsPS)
	}
}

func goalText(r takeoverRun) string {
	if math.IsNaN(r.Removals.First) {
		return "not met"
	}
	if r.GoalFirstMet {
		return fmt.Sprintf("≤ %.0f s: met", r.GoalFirstSeconds)
	}
	return fmt.Sprintf("≤ %.0f s: not met", r.GoalFirstSeconds)
}
