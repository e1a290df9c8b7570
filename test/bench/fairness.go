package main

// The fair-backlog scenario: the removal cap shared between namespaces. One
// busy namespace holds -fair-pods pods an hour overdue; once podjanitor
// drains them at a cap of -fair-cap removals a second, -fair-quiet quiet
// namespaces get -fair-quiet-pods pods each, due a few seconds later. It
// measures the quiet pods' lateness (removal seen − deadline) beside the
// busy pods' wait (removal seen − podjanitor ready), the busy pods still
// waiting when the last quiet pod went, and the busy namespace's removal
// rate while it shares the cap and once it is alone. With a fair share (a
// slot to each waiting namespace in turn) a quiet pod waits for its own
// namespace's pods, one turn in every 1 + quiet namespaces; with one
// heap by deadline it waited behind the whole busy backlog. -podjanitor-alt
// runs the same again with a second binary (an older build, say).

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/podjanitor/podjanitor/internal/workload"
)

// fairQuietLead is how long after their creation starts the quiet pods are due.
const fairQuietLead = 5 * time.Second

type fairResult struct {
	Binary          string  `json:"binary"`
	BusyPods        int     `json:"busy_pods"`
	QuietNamespaces int     `json:"quiet_namespaces"`
	QuietPods       int     `json:"quiet_pods_per_namespace"`
	Cap             float64 `json:"cap_per_second"`
	// QuietLateness is the quiet pods' removal seen − their deadline.
	QuietLateness latency `json:"quiet_lateness"`
	// BusyWait is the busy pods' removal seen − podjanitor ready.
	BusyWait latency `json:"busy_wait"`
	// BusyWaitingAtQuietDeadline and BusyLeft are the busy pods not
	// removed yet at the quiet pods' deadline and when the last quiet pod
	// went; the former over the cap is how long one heap by deadline kept
	// the quiet pods waiting.
	BusyWaitingAtQuietDeadline int     `json:"busy_waiting_at_quiet_deadline"`
	BusyLeft                   int     `json:"busy_left_at_last_quiet_removal"`
	BusyRateShared             float64 `json:"busy_per_second_while_shared"` // quiet deadline → last quiet removal
	QuietRate                  float64 `json:"quiet_per_second"`             // the same window
	BusyRateAlone              float64 `json:"busy_per_second_alone"`        // last quiet removal → last busy removal
	Seconds                    float64 `json:"drain_seconds"`                // ready → last removal
}

// fairBacklog runs the scenario with podjanitor, and with -podjanitor-alt
// when given.
func (b *bench) fairBacklog(ctx context.Context) ([]*fairResult, error) {
	var out []*fairResult
	binaries := []struct{ who, command string }{{"pj", b.cfg.podjanitor}}
	if b.cfg.podjanitorAlt != "" {
		binaries = append(binaries, struct{ who, command string }{"alt", b.cfg.podjanitorAlt})
	}
	for _, bin := range binaries {
		r, err := b.fairRun(ctx, bin.who, bin.command)
		if r != nil {
			out = append(out, r)
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

func (b *bench) fairRun(ctx context.Context, who, command string) (*fairResult, error) {
	cfg := b.cfg
	out := &fairResult{Binary: command, BusyPods: cfg.fairPods, QuietNamespaces: cfg.fairQuiet, QuietPods: cfg.fairQuietPods, Cap: cfg.fairCap}
	label := "fair-backlog-" + who
	busy := capSide{label: label, namespaces: []string{"bench-fair-busy-" + who}, names: [][]string{nil}}
	quiet := capSide{label: label}
	for k := range cfg.fairQuiet {
		quiet.namespaces = append(quiet.namespaces, fmt.Sprintf("bench-fair-quiet-%s-%02d", who, k))
		quiet.names = append(quiet.names, nil)
	}
	for _, ns := range append(slices.Clone(busy.namespaces), quiet.namespaces...) {
		if err := b.ensureNamespace(ctx, ns); err != nil {
			return nil, err
		}
	}
	past := time.Now().Add(-time.Hour)
	busy.names[0] = make([]string, cfg.fairPods)
	cr := createPods(ctx, b.cs, cfg.fairPods, cfg.createConc, label+" busy", func(i int) *corev1.Pod {
		busy.names[0][i] = fmt.Sprintf("%s-%06d", busy.namespaces[0], i)
		return workload.Pod(busy.namespaces[0], busy.names[0][i], label, i, past.Add(-time.Duration(i)*time.Second), "")
	}, false)
	if cr.errors > 0 {
		return nil, fmt.Errorf("%s: %d busy pods failed to be created", label, cr.errors)
	}

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	tr, err := watchNamespace(wctx, b.cs, "") // every namespace: the names are unique
	if err != nil {
		return nil, err
	}
	logf("fair-backlog (%s): %d busy pods an hour overdue, then %d quiet namespaces × %d pods, cap %g/s", who, cfg.fairPods, cfg.fairQuiet, cfg.fairQuietPods, cfg.fairCap)
	j, err := startJanitorWith(cfg, strings.Fields(command), label, []string{
		"--label-selector=" + workload.LabelScenario + "=" + label, "--hold-waves=false",
		fmt.Sprintf("--max-deletions-per-second=%g", cfg.fairCap), fmt.Sprintf("--deletion-burst=%d", max(1, int(cfg.fairCap))),
	}, "")
	if err != nil {
		return nil, err
	}
	defer j.stop()
	sync, err := j.waitReady(10 * time.Minute)
	if err != nil {
		return nil, err
	}
	ready := j.started.Add(sync)
	// The quiet pods come while the busy backlog drains: 2 s of the cap in.
	if !tr.waitGone(ctx, int(2*cfg.fairCap), time.Minute, label+" busy") {
		return out, fmt.Errorf("%s: %d busy pods removed in a minute, want %d", label, tr.count(), int(2*cfg.fairCap))
	}
	quietDeadline := time.Now().Add(fairQuietLead)
	n := cfg.fairQuiet * cfg.fairQuietPods
	cr = createPods(ctx, b.cs, n, cfg.createConc, label+" quiet", func(i int) *corev1.Pod {
		k := i % cfg.fairQuiet
		name := fmt.Sprintf("%s-%04d", quiet.namespaces[k], i)
		return workload.Pod(quiet.namespaces[k], name, label, i, quietDeadline, "")
	}, false)
	if cr.errors > 0 {
		return out, fmt.Errorf("%s: %d quiet pods failed to be created", label, cr.errors)
	}
	for i := range n {
		k := i % cfg.fairQuiet
		quiet.names[k] = append(quiet.names[k], fmt.Sprintf("%s-%04d", quiet.namespaces[k], i))
	}
	if created := time.Now(); created.After(quietDeadline) {
		logf("fair-backlog (%s): the quiet pods' creation ended %v after their deadline", who, created.Sub(quietDeadline).Round(time.Millisecond))
	}
	timeout := time.Minute + time.Duration(float64(cfg.fairPods+n)/cfg.fairCap*2)*time.Second
	_, lastQuiet, seen := waitSideGone(ctx, tr, quiet, timeout, label+" quiet")
	if seen < n {
		return out, fmt.Errorf("%s: %d of %d quiet pods removed in %v", label, seen, n, timeout)
	}
	_, lastBusy, seen := waitSideGone(ctx, tr, busy, timeout, label+" busy")
	if seen < cfg.fairPods {
		return out, fmt.Errorf("%s: %d of %d busy pods removed in %v", label, seen, cfg.fairPods, timeout)
	}

	gone := tr.snapshot()
	var quietLate, busyWait []time.Duration
	var busyShared, busyAlone int
	for _, names := range quiet.names {
		for _, name := range names {
			quietLate = append(quietLate, gone[name].Sub(quietDeadline))
		}
	}
	for _, name := range busy.names[0] {
		at := gone[name]
		busyWait = append(busyWait, at.Sub(ready))
		switch {
		case at.After(lastQuiet):
			out.BusyLeft++
			busyAlone++
		case !at.Before(quietDeadline):
			busyShared++
		}
		if !at.Before(quietDeadline) {
			out.BusyWaitingAtQuietDeadline++
		}
	}
	out.QuietLateness, out.BusyWait = latencyOf(quietLate), latencyOf(busyWait)
	if shared := lastQuiet.Sub(quietDeadline).Seconds(); shared > 0 {
		out.BusyRateShared, out.QuietRate = float64(busyShared)/shared, float64(n)/shared
	}
	if alone := lastBusy.Sub(lastQuiet).Seconds(); alone > 0 {
		out.BusyRateAlone = float64(busyAlone) / alone
	}
	out.Seconds = lastBusy.Sub(ready).Seconds()
	logf("fair-backlog (%s): quiet pods late p50 %s, max %s; %d busy pods still waiting when the last went (%d at their deadline)",
		who, ms(out.QuietLateness.P50), ms(out.QuietLateness.Max), out.BusyLeft, out.BusyWaitingAtQuietDeadline)
	return out, nil
}

func printFair(w *tabwriter.Writer, runs []*fairResult) {
	if len(runs) == 0 {
		return
	}
	r0 := runs[0]
	fmt.Fprintf(w, "\n== The cap shared between namespaces (fair-backlog): %d pods an hour overdue in one namespace, then %d namespaces × %d pods due %v after their creation began, at a cap of %g/s\n",
		r0.BusyPods, r0.QuietNamespaces, r0.QuietPods, fairQuietLead, r0.Cap)
	fmt.Fprintln(w, "binary\tquiet late p50\tp99\tmax\tbusy wait p50\tmax\tbusy waiting at the quiet deadline\tbusy left after the last quiet\tbusy /s shared\tquiet /s\tbusy /s alone")
	for _, r := range runs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d (%.0f s at the cap)\t%d\t%.1f\t%.1f\t%.1f\n", r.Binary,
			ms(r.QuietLateness.P50), ms(r.QuietLateness.P99), ms(r.QuietLateness.Max), ms(r.BusyWait.P50), ms(r.BusyWait.Max),
			r.BusyWaitingAtQuietDeadline, float64(r.BusyWaitingAtQuietDeadline)/r.Cap, r.BusyLeft, r.BusyRateShared, r.QuietRate, r.BusyRateAlone)
	}
}
