// Package apiclock owns the API server's time as this process knows it: the
// offset of the API server's clock from this process's, estimated from the
// Date header of every response (Wrap) and narrowed by timed probes
// (RunCalibration), and the process's own clock (ProcessClock), which a step
// of the wall clock does not move.
//
// It promises that Offset is never ahead of the true offset, as far as the
// responses seen can tell, so that a deadline compared in the API server's
// time is never early; and that subscribers (Subscribe) hear of every change
// outside its locks, so they may call Offset.
package apiclock

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Clock estimates how far the API server's clock is ahead of this
// process's (the offset), so that deadlines, which count from the API
// server's timestamps, are compared in the API server's time.
//
// Every API response carries a Date header: the server's time, cut to the
// whole second, at some instant between sending the request (local time s)
// and receiving the headers (local time r). So each response bounds the
// offset: Date−r ≤ offset < Date+1s−s. The bounds of recent responses
// (offsetWindow) intersect to an interval [lower, upper]; podjanitor uses
// lower, the earliest the server's clock can be, so that no pod goes before
// its deadline in the API server's time, at the price of being late by at
// most the interval's width. calibrate times a few requests to land on the
// server's second boundaries, which narrows the interval to a few round
// trips: milliseconds, not the header's one second.
//
// Two things about this machine's clock could make that estimate run ahead
// of the server's between measurements, and neither may: a step of the wall
// clock (an operator, NTP's step mode, a resumed VM), which ProcessClock's
// steadyClock hides by reading the clock at the rate of the monotonic one,
// and the monotonic clock itself running fast (NTP slews it along with the
// wall clock, up to 500 ppm), which the lower end allows for: it falls behind
// by maxClockRate of the time since the response that set it.
type Clock struct {
	// clock is steady (ProcessClock) in podjanitor: offsets are to it.
	clock clock.PassiveClock
	mu    sync.Mutex
	// subscribers receive every new estimate (the podjanitor_clock_offset_seconds
	// gauge, the controller's parked deadlines).
	subscribers []func(time.Duration)
	// lowers and uppers are the samples of the last offsetWindow that can
	// still decide a bound, oldest first: each has a greater lower (a smaller
	// upper) than every sample after it, so the first holds the bound, and a
	// sample gives way once a newer one bounds as tightly. Calibrated samples
	// therefore hold their bounds for the whole window, however much traffic
	// follows, and the deques stay short.
	lowers, uppers []offsetSample
	// lower is the lower end as the response that set it (at lowerAt) said,
	// before the allowance for this clock running fast (Offset).
	lower   time.Duration
	lowerAt time.Time
	upper   time.Duration
	// probeRTT is the latest probe's round trip, as calibrate timed it:
	// its aim. Not any response's: a DELETE's takes many times a probe's.
	probeRTT time.Duration
	// aimBack is, once the interval is narrow (aimWidths), how far behind
	// its upper end a probe takes the server's clock to be when it is sent,
	// to have its Date set just after a second of it. The upper end holds
	// still for minutes (few probes lower it), the lower end moves with
	// every probe, so the aim is taken from the upper one. calibrate learns
	// it (aim); aiming says it has.
	aimBack time.Duration
	aiming  bool
	// sendVolley, when set, sends volleys in place of volley's goroutines
	// (tests, whose simulated server cannot take probes at once).
	sendVolley func(ctx context.Context, waits []time.Duration) []probeResult
	warned     time.Duration // the offset last warned about
}

type offsetSample struct {
	at           time.Time // local time the response arrived
	lower, upper time.Duration
}

const (
	offsetWindow     = 10 * time.Minute
	maxOffsetSamples = 64
	offsetWarning    = time.Second
	// calibrationTarget is the interval's width at which a measurement
	// stops while no removal is near; nearCalibrationTarget while one is.
	// Every removal is late by the distance from the interval's lower end
	// to the true offset, at most the width, so near a removal the
	// measurement goes on narrowing: to 1 ms, or, where the round trip does
	// not allow that, for all its calibrationProbes, each landing on a
	// second of the server's clock and the best of them holding the bound.
	calibrationTarget     = 2 * time.Millisecond
	nearCalibrationTarget = time.Millisecond
	calibrationProbes     = 16
	// calibrationPeriod is how often the offset is measured again while a
	// removal may be near (RunCalibration's near): short enough that the
	// allowance for this clock running fast costs at most 0.5 ms of
	// lateness before the next measurement, which then takes a volley a
	// second (each waits for a second of the server's clock) while the
	// interval is wider than nearCalibrationTarget.
	calibrationPeriod = time.Second
	// idleCalibrationPeriod is how often it is measured otherwise.
	idleCalibrationPeriod = 5 * time.Minute
	// maxClockRate is how much faster than the API server's this machine's
	// monotonic clock may run: 500 ppm, the most that adjtime and the
	// kernel's NTP discipline slew or correct it by.
	maxClockRate = 500e-6
)

// driftAllowance is how far this machine's clock may have run ahead of the
// API server's in d.
func driftAllowance(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(float64(d) * maxClockRate))
}

// New returns a Clock with no estimate yet (offset 0), whose offsets are to
// clk (ProcessClock's, in podjanitor).
func New(clk clock.PassiveClock) *Clock {
	return &Clock{clock: clk}
}

// Subscribe has f called with every new estimate of the offset, after the
// subscribers before it, outside the Clock's locks.
func (a *Clock) Subscribe(f func(offset time.Duration)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.subscribers = append(slices.Clip(a.subscribers), f)
}

// Offset is the estimated offset: how far the API server's clock is ahead of
// this process's (negative when behind). It is never more than the true
// offset, as far as the responses seen can tell, even should this clock run
// fast by up to maxClockRate since; 0 before the first response.
func (a *Clock) Offset() time.Duration {
	lower, _, _ := a.bounds()
	return lower
}

// bounds returns the current interval of the offset and whether there is one.
func (a *Clock) bounds() (lower, upper time.Duration, ok bool) {
	now := a.clock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.lowers) == 0 {
		return a.lower, a.upper, false
	}
	return a.lower - driftAllowance(now.Sub(a.lowerAt)), a.upper, true
}

// Observe records one response: sent at local time sent, headers received
// at local time received, with the server's Date header date. Wrap calls it
// for every response.
func (a *Clock) Observe(ctx context.Context, sent, received time.Time, date time.Time) {
	if date.IsZero() || received.Before(sent) {
		return
	}
	if p, ok := ctx.Value(probeDateKey{}).(*time.Time); ok {
		*p = date
	}
	s := offsetSample{at: received, lower: date.Sub(received), upper: date.Add(time.Second).Sub(sent)}
	if lower, subscribers, changed := a.add(ctx, s); changed {
		// Outside a.mu: a subscriber takes the controller's locks, which
		// call Offset while they hold them.
		for _, f := range subscribers {
			f(lower)
		}
	}
}

// add folds one sample into the interval; it returns the lower end as
// measured, the subscribers to tell, and whether that moved.
func (a *Clock) add(ctx context.Context, s offsetSample) (time.Duration, []func(time.Duration), bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// An older lower end counts as it stands at s, with the allowance for
	// this clock running fast since (the same for both from then on).
	lowerAt := func(old offsetSample) time.Duration { return old.lower - driftAllowance(s.at.Sub(old.at)) }
	a.lowers = slideWindow(a.lowers, s, func(old offsetSample) bool { return lowerAt(old) <= s.lower })
	a.uppers = slideWindow(a.uppers, s, func(old offsetSample) bool { return old.upper >= s.upper })
	front, upper := a.lowers[0], a.uppers[0].upper
	if lowerAt(front) > upper {
		klog.FromContext(ctx).Info("API server clock offset changed; measuring it again",
			"previousLower", a.lower, "previousUpper", a.upper)
		a.lowers, a.uppers = append(a.lowers[:0], s), append(a.uppers[:0], s)
		front, upper = s, s.upper
	}
	changed := front.lower != a.lower || !front.at.Equal(a.lowerAt)
	a.lower, a.lowerAt, a.upper = front.lower, front.at, upper
	lower := front.lower
	if abs(lower-a.warned) >= offsetWarning && (abs(lower) >= offsetWarning || abs(a.warned) >= offsetWarning) {
		a.warned = lower
		if abs(lower) >= offsetWarning {
			klog.FromContext(ctx).Info("Warning: this machine's clock differs from the API server's; deadlines are compared in the API server's time",
				"offset", lower, "uncertainty", upper-lower)
		} else {
			klog.FromContext(ctx).Info("This machine's clock agrees with the API server's again", "offset", lower)
		}
	}
	return lower, a.subscribers, changed
}

// slideWindow adds s to a deque of lowers or uppers: it drops the samples
// older than offsetWindow from the front and those that s bounds at least as
// tightly (superseded) from the back. At most maxOffsetSamples are kept.
func slideWindow(q []offsetSample, s offsetSample, superseded func(offsetSample) bool) []offsetSample {
	for len(q) > 0 && s.at.Sub(q[0].at) > offsetWindow {
		q = q[1:]
	}
	for len(q) > 0 && superseded(q[len(q)-1]) {
		q = q[:len(q)-1]
	}
	q = append(q, s)
	if len(q) > maxOffsetSamples {
		q = q[len(q)-maxOffsetSamples:]
	}
	return q
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// Wrap returns a RoundTripper that feeds the Date header of every response
// into a: a transport.WrapperFunc for the clients' configuration.
//
// The instants it takes are the ones closest to the server's that are safe
// to take (exchangeTimes): the Date was set after the request left and
// before the first byte of the response came in, so the time spent getting
// a connection and the time spent parsing and handing the response over
// between goroutines widen neither bound.
func (a *Clock) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		t := &exchangeTimes{clock: a.clock}
		t.sent = a.clock.Now()
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), t.trace()))
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return resp, err
		}
		received := a.clock.Now()
		if date, perr := http.ParseTime(resp.Header.Get("Date")); perr == nil {
			sent, received := t.bounds(received)
			a.Observe(req.Context(), sent, received, date)
		}
		return resp, err
	})
}

// exchangeTimes are the instants of one request that bound when the server
// set its response's Date: after sent (or, later, when the connection to
// send it on was at hand: gotConn), before the first byte of the response
// arrived (firstByte). A 1xx response's first byte comes before the final
// response's Date is set, so then only the end of the round trip bounds it.
type exchangeTimes struct {
	clock clock.PassiveClock
	sent  time.Time
	// gotConn and firstByte are when their hooks were called, as the time
	// since sent plus 1 ns; 0: not called. The hooks run on the transport's
	// goroutines.
	gotConn   atomic.Int64
	firstByte atomic.Int64
	got1xx    atomic.Bool
}

func (t *exchangeTimes) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) {
			t.gotConn.CompareAndSwap(0, t.clock.Now().Sub(t.sent).Nanoseconds()+1)
		},
		GotFirstResponseByte: func() {
			t.firstByte.Store(t.clock.Now().Sub(t.sent).Nanoseconds() + 1)
		},
		Got1xxResponse: func(int, textproto.MIMEHeader) error {
			t.got1xx.Store(true)
			return nil
		},
	}
}

// bounds returns the instants to bound the Date by, given the time the
// round trip returned: each of the traced instants only where it lies
// within the round trip (a transport that calls none of them, or one that
// retried, leaves the outer ones).
func (t *exchangeTimes) bounds(returned time.Time) (sent, received time.Time) {
	sent, received = t.sent, returned
	total := returned.Sub(t.sent)
	g, f := time.Duration(t.gotConn.Load()-1), time.Duration(t.firstByte.Load()-1)
	if g >= 0 && g <= total {
		sent = t.sent.Add(g)
	}
	if f >= 0 && f <= total && (g < 0 || f >= g) && !t.got1xx.Load() {
		received = t.sent.Add(f)
	}
	return sent, received
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// calibrate narrows the offset's interval with a few requests (probe, e.g. a
// GET /version) timed so that the API server sets each one's Date at what
// would be a whole second of its clock: while the interval is wide, were the
// offset its midpoint, so that the answer halves it; once it is narrow, just
// after that second by the learnt aim, so that the answer raises the lower
// end as far as the round trip allows, with a volley of probes around that
// aim. It stops at target or after calibrationProbes measurements.
func (a *Clock) calibrate(ctx context.Context, target time.Duration, probe func(context.Context) error, sleep func(context.Context, time.Duration) bool) {
	logger := klog.FromContext(ctx)
	for range calibrationProbes {
		lower, upper, ok := a.bounds()
		if ok && upper-lower <= target {
			break
		}
		var next time.Time // the second of the server's clock aimed at
		aimed := false
		waits := []time.Duration{0} // no estimate yet: one probe, at once
		if ok {
			a.mu.Lock()
			rtt, back := a.probeRTT, a.aimBack
			narrow := upper-lower <= aimWidths*rtt
			switch {
			case !narrow:
				a.aiming = false // learnt again once narrow again
			case !a.aiming:
				back = (upper-lower)/2 - rtt/2 // where the midpoint would aim
			}
			a.mu.Unlock()
			// The local time t at which the server's clock would read a whole
			// second at the Date, were the offset the midpoint and the Date
			// set halfway through the round trip: t + mid + rtt/2 ≡ 0 (mod
			// 1s); once narrow, t + upper − back ≡ 0.
			ahead := lower + (upper-lower)/2 + rtt/2
			if narrow {
				ahead = upper - back
			}
			server := a.clock.Now().Add(ahead)
			next = server.Truncate(time.Second).Add(time.Second)
			waits[0] = next.Sub(server)
			aimed = narrow
			if aimed {
				a.mu.Lock()
				a.aimBack, a.aiming = back, true
				a.mu.Unlock()
				waits = volleyWaits(waits[0])
			}
		}
		results := a.volley(ctx, probe, sleep, waits)
		if results == nil {
			return // ctx ended
		}
		r := results[0] // the probe the measurement goes by: the only one, or the aimed one
		if aimed {
			r = results[volleyAimed]
		}
		a.mu.Lock()
		a.probeRTT = r.rtt
		if aimed && r.err == nil && !r.date.IsZero() {
			a.aim(!r.date.Before(next), upper-lower)
		}
		a.mu.Unlock()
		if r.err != nil {
			logger.V(2).Info("Clock offset probe failed", "err", r.err)
			return
		}
	}
	lower, upper, _ := a.bounds()
	logger.V(2).Info("Measured the API server's clock offset", "offset", lower, "uncertainty", upper-lower)
}

// aimWidths is the interval's width, in round trips of a probe, below which
// the probes aim just after a second (aim) rather than halve the interval:
// halving it any further is up against the round trip.
const aimWidths = 2

// A volley: once the interval is narrow, each measurement sends volleySize
// probes volleyGap apart, the one at volleyAimed where a single probe would
// go; aim learns from it alone. About one in four aimed probes has its Date
// set just before the second, and raises the lower end not at all; the
// probe after it all but surely has it set after, a little later than the
// aimed one would have. A single probe left the lower end a second or more
// old, and 0.5 ms lower for it, in one measurement of four: a removal then
// went that much later (BENCHMARKS.md). Two GET /version a second, while a
// removal is near.
const (
	volleySize  = 2
	volleyAimed = 0
	volleyGap   = 200 * time.Microsecond
)

// volleyWaits are the waits before each of a volley's probes, the first
// counted from now, the others from the probe before: the aimed probe goes
// after aimedWait, the others volleyGap apart around it (at once, those
// that would go before now).
func volleyWaits(aimedWait time.Duration) []time.Duration {
	waits := make([]time.Duration, volleySize)
	var prev time.Duration
	for i := range waits {
		at := max(aimedWait+time.Duration(i-volleyAimed)*volleyGap, prev)
		waits[i], prev = at-prev, at
	}
	return waits
}

// probeResult is what became of one probe of a volley.
type probeResult struct {
	date time.Time // its response's Date; zero: none
	rtt  time.Duration
	err  error
}

// volley sends one probe after each of waits (sleep waits them in turn),
// each on a goroutine of its own, and returns their results once all are
// back; nil when ctx ended first.
func (a *Clock) volley(ctx context.Context, probe func(context.Context) error, sleep func(context.Context, time.Duration) bool,
	waits []time.Duration) []probeResult {
	if a.sendVolley != nil {
		return a.sendVolley(ctx, waits)
	}
	results := make([]probeResult, len(waits))
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, w := range waits {
		if !sleep(ctx, w) {
			return nil
		}
		wg.Add(1)
		go func(r *probeResult) {
			defer wg.Done()
			sent := a.clock.Now()
			r.err = probe(context.WithValue(ctx, probeDateKey{}, &r.date))
			r.rtt = a.clock.Since(sent)
		}(&results[i])
	}
	return results // once the deferred Wait is over
}

// probeDateKey marks the context of calibrate's probe: Observe stores the
// probe's Date in the *time.Time it holds.
type probeDateKey struct{}

const (
	// aimStep is how much earlier the next probe goes after one whose Date
	// was set after the second it aimed at (a hit, which raised the lower
	// end by less than it could have); after a miss, which did not raise it
	// at all, it goes aimMissSteps of them later. So about three in four
	// probes hit, each just after its second.
	aimStep      = 100 * time.Microsecond
	aimMissSteps = 3
)

// aim learns aimBack from one aimed probe: hit says its Date was set at or
// after the second it aimed at. Callers hold a.mu.
func (a *Clock) aim(hit bool, width time.Duration) {
	if hit {
		a.aimBack = max(a.aimBack-aimStep, -a.probeRTT)
	} else {
		a.aimBack = min(a.aimBack+aimMissSteps*aimStep, width)
	}
}

// RunCalibration calibrates now, then every calibrationPeriod while near
// reports that a removal may come soon, else every idleCalibrationPeriod,
// until ctx ends (nil near: always every calibrationPeriod, as near). Between
// measurements Offset falls behind by the allowance for this clock running
// fast, so a fresh measurement before a deadline keeps the removal from
// coming that much late; near a removal a measurement also narrows the
// interval further (nearCalibrationTarget); an idle podjanitor sends no
// probes for minutes.
func (a *Clock) RunCalibration(ctx context.Context, probe func(context.Context) error, near func() bool) {
	// Sleep, not a plain timer: a probe aimed at a second of the server's
	// clock lands within tens of microseconds of its aim, not up to a
	// millisecond after it, which is as much as the interval it narrows.
	a.runCalibration(ctx, probe, near, Sleep)
}

func (a *Clock) runCalibration(ctx context.Context, probe func(context.Context) error, near func() bool,
	sleep func(context.Context, time.Duration) bool) {
	for {
		target := calibrationTarget
		if near == nil || near() {
			target = nearCalibrationTarget
		}
		a.calibrate(ctx, target, probe, sleep)
		for since := time.Duration(0); ; {
			if !sleep(ctx, calibrationPeriod) {
				return
			}
			if since += calibrationPeriod; near == nil || near() || since >= idleCalibrationPeriod {
				break
			}
		}
	}
}

// steadyClock reads the wall clock src at the rate of its monotonic clock,
// from the instant it was made: a step of the wall clock does not move it.
// Its readings carry monotonic readings, as src's do. podjanitor compares
// them only with each other and, through the Clock's offset, with the API
// server's times, so it does not matter that it parts from the wall clock
// once that is stepped; what matters is that the step cannot move deadlines.
type steadyClock struct {
	clock.WithTicker
	start time.Time
}

func newSteadyClock(src clock.WithTicker) steadyClock {
	return steadyClock{WithTicker: src, start: src.Now()}
}

// Now is start plus the time since start, which src measures with the
// monotonic reading that start carries (Go's time.Since).
func (c steadyClock) Now() time.Time                  { return c.start.Add(c.WithTicker.Since(c.start)) }
func (c steadyClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c steadyClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// shiftedClock is a clock that reads offset ahead of the real one, for
// testing how podjanitor behaves on a machine whose clock is wrong
// (PODJANITOR_TESTING_CLOCK_OFFSET).
type shiftedClock struct {
	clock.RealClock
	offset time.Duration
}

func (c shiftedClock) Now() time.Time                  { return c.RealClock.Now().Add(c.offset) }
func (c shiftedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c shiftedClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// ProcessClock is the real clock, or, for tests of clock skew, one that reads
// PODJANITOR_TESTING_CLOCK_OFFSET (a duration) ahead of it; steady, so that a
// step of the wall clock moves neither the estimate of the API server's
// clock nor the deadlines compared with it (Controller.now).
func ProcessClock(logger klog.Logger) (clock.WithTicker, error) {
	value := os.Getenv("PODJANITOR_TESTING_CLOCK_OFFSET")
	if value == "" {
		return newSteadyClock(clock.RealClock{}), nil
	}
	offset, err := time.ParseDuration(value)
	if err != nil {
		return nil, fmt.Errorf("PODJANITOR_TESTING_CLOCK_OFFSET=%q: %w", value, err)
	}
	logger.Info("Warning: testing clock in use, reading ahead of the real clock", "offset", offset)
	return newSteadyClock(shiftedClock{offset: offset}), nil
}
