package main

// The clock scenario: how late the API-server clock estimate alone makes a
// removal. podjanitor compares deadlines with its estimate of the API
// server's clock and uses the estimate's lower end (internal/apiclock), so
// that nothing goes early; every millisecond that lower end lies below the
// true offset is a millisecond of lateness. The bench runs on the API
// server's machine (the same kernel clock), so the true offset is 0 and the
// lateness the estimate adds is −Offset(), which this scenario samples while
// the estimate is measured as podjanitor measures it while a removal is near
// (apiclock.Clock.RunCalibration, probing GET /version through
// apiclock.NewProbe's client, as podjanitor does).

import (
	"context"
	"fmt"
	"sync"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/apiclock"
)

type clockResult struct {
	Seconds float64 `json:"seconds"`
	// Late is −Offset() sampled every SampleMs from the first measurement
	// on: the lateness the estimate adds to a removal at a random instant.
	Late     latency `json:"lateness_from_the_estimate"`
	SampleMs float64 `json:"sample_interval_ms"`
	// Probes are the calibration's GET /version requests and their round trips.
	Probes    int     `json:"probes"`
	ProbesMin float64 `json:"probes_per_minute"`
	ProbeRTT  latency `json:"probe_round_trip"`
	// Early counts samples with a positive offset: the estimate ahead of the
	// API server's clock, which would make removals early.
	Early int `json:"samples_ahead_of_the_api_server"`
}

func (b *bench) clock(ctx context.Context) (*clockResult, error) {
	d := b.cfg.clockDuration
	clk, err := apiclock.ProcessClock(klog.Background())
	if err != nil {
		return nil, err
	}
	est := apiclock.New(clk)
	c := rest.CopyConfig(b.rest)
	c.QPS, c.Burst, c.UserAgent = float32(b.cfg.qps), b.cfg.burst, "podjanitor-bench-clock"
	c.ContentType = "application/vnd.kubernetes.protobuf"
	c.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	c.DisableCompression = true
	c.Wrap(est.Wrap)
	get, err := apiclock.NewProbe(c)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var rtts []time.Duration
	probe := func(ctx context.Context) error {
		t0 := time.Now()
		err := get(ctx)
		mu.Lock()
		rtts = append(rtts, time.Since(t0))
		mu.Unlock()
		return err
	}
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	logf("clock: measuring the API server's clock as podjanitor does while a removal is near, for %s", d)
	done := make(chan struct{})
	go func() {
		defer close(done)
		est.RunCalibration(runCtx, probe, func() bool { return true })
	}()
	// The first measurement: wait for its probes to settle.
	for runCtx.Err() == nil {
		mu.Lock()
		n := len(rtts)
		mu.Unlock()
		if n > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(20 * time.Second)
	out := &clockResult{SampleMs: 5}
	var late []time.Duration
	start := time.Now()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for runCtx.Err() == nil {
		select {
		case <-runCtx.Done():
		case <-t.C:
			o := est.Offset()
			if o > 0 {
				out.Early++
			}
			late = append(late, -o)
		}
	}
	<-done
	out.Seconds = time.Since(start).Seconds()
	out.Late = latencyOf(late)
	mu.Lock()
	out.Probes, out.ProbeRTT = len(rtts), latencyOf(rtts)
	mu.Unlock()
	out.ProbesMin = float64(out.Probes) / d.Minutes()
	logf("clock: lateness from the estimate p50 %s p90 %s p99 %s max %s; %d probes (%.1f/min), round trip p50 %s",
		ms(out.Late.P50), ms(out.Late.P90), ms(out.Late.P99), ms(out.Late.Max), out.Probes, out.ProbesMin, ms(out.ProbeRTT.P50))
	return out, nil
}

func printClock(w *tabwriter.Writer, r *clockResult) {
	fmt.Fprintf(w, "\n== Scenario 9: clock — the lateness the API-server clock estimate adds (−Offset(), the true offset being 0 on this machine), sampled every %.0f ms for %.0f s while calibrating as near a removal\n",
		r.SampleMs, r.Seconds)
	fmt.Fprintln(w, "p50\tp90\tp99\tmax\tsamples ahead\tprobes\tprobes/min\tprobe RTT p50\tp99")
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%.1f\t%s\t%s\n", ms(r.Late.P50), ms(r.Late.P90), ms(r.Late.P99), ms(r.Late.Max),
		r.Early, r.Probes, r.ProbesMin, ms(r.ProbeRTT.P50), ms(r.ProbeRTT.P99))
}
