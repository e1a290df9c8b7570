package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
)

// simulatedServer answers probes with the Date header of a server whose clock
// is offset ahead of clk, and which takes half of rtt to hear a request and
// half to answer.
type simulatedServer struct {
	clk    *testingclock.FakeClock
	a      *apiClock
	offset time.Duration
	rtt    time.Duration
	probes int
}

func (s *simulatedServer) probe(ctx context.Context) error {
	s.probes++
	sent := s.clk.Now()
	s.clk.Step(s.rtt / 2)
	date := s.clk.Now().Add(s.offset).Truncate(time.Second)
	s.clk.Step(s.rtt / 2)
	s.a.observe(ctx, sent, s.clk.Now(), date)
	return nil
}

func (s *simulatedServer) sleep(_ context.Context, d time.Duration) bool {
	s.clk.Step(d)
	return true
}

func TestAPIClockOffsetIsNeverAheadOfTheServer(t *testing.T) {
	for _, offset := range []time.Duration{
		0, 250 * time.Millisecond, -30 * time.Second, 30 * time.Second, -1234567 * time.Microsecond, 17*time.Hour + 3*time.Millisecond,
	} {
		t.Run(offset.String(), func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			clk := testingclock.NewFakeClock(t0.Add(123 * time.Millisecond))
			var gauge time.Duration
			a := newAPIClock(clk, func(d time.Duration) { gauge = d })
			srv := &simulatedServer{clk: clk, a: a, offset: offset, rtt: 2 * time.Millisecond}
			a.calibrate(ctx, srv.probe, srv.sleep)

			lower, upper, ok := a.bounds()
			if !ok {
				t.Fatal("no measurement")
			}
			if got := a.Offset(); got > offset {
				t.Errorf("Offset() = %v, ahead of the server's true offset %v: pods would go early", got, offset)
			}
			if lower > offset || upper < offset {
				t.Errorf("interval [%v, %v] does not hold the true offset %v", lower, upper, offset)
			}
			if width := upper - lower; width > calibrationTarget+srv.rtt {
				t.Errorf("after %d probes the interval is %v wide, want at most %v", srv.probes, width, calibrationTarget+srv.rtt)
			}
			if gauge != a.Offset() {
				t.Errorf("gauge = %v, want %v", gauge, a.Offset())
			}
		})
	}
}

func TestAPIClockStartsAgainWhenTheClockIsStepped(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	clk := testingclock.NewFakeClock(t0)
	a := newAPIClock(clk, nil)
	srv := &simulatedServer{clk: clk, a: a, offset: 0, rtt: time.Millisecond}
	a.calibrate(ctx, srv.probe, srv.sleep)
	if got := a.Offset(); got > 0 || got < -calibrationTarget-srv.rtt {
		t.Fatalf("Offset() = %v, want just below 0", got)
	}
	srv.offset = -time.Hour // this machine's clock was set an hour ahead
	if err := srv.probe(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.Offset(); got > -time.Hour || got < -time.Hour-time.Second {
		t.Errorf("Offset() after the step = %v, want about -1h and never above it", got)
	}
}

func TestAPIClockReadsTheDateHeader(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	serverAhead := 42 * time.Second
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Date", time.Now().Add(serverAhead).UTC().Format(http.TimeFormat))
	}))
	defer srv.Close()
	a := newAPIClock(clock.RealClock{}, nil)
	client := &http.Client{Transport: a.wrap(http.DefaultTransport)}
	probe := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := probe(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.Offset(); got > serverAhead || got < serverAhead-2*time.Second {
		t.Errorf("Offset() = %v after one response, want in (%v, %v]", got, serverAhead-2*time.Second, serverAhead)
	}
}

// The offset's callback moves parked deadlines while podStates asks the
// offset for the time: neither may wait for the other (they did: a.mu was
// held across the callback, which takes the podStates lock, while podStates'
// loop held its lock and asked for the offset).
func TestAPIClockCallbackDoesNotDeadlockWithParkedKeys(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var states *podStates
	a := newAPIClock(clock.RealClock{}, func(time.Duration) { states.offsetChanged() })
	states = newPodStates(clock.RealClock{}, func() time.Time { return time.Now().Add(a.Offset()) }, nil)
	go states.run(ctx, func(cache.ObjectName) {})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20000 {
			now := time.Now()
			// Samples whose lower bound keeps rising, so every one calls back.
			a.observe(ctx, now, now, now.Add(time.Duration(i)*time.Millisecond))
			states.park(cache.ObjectName{Namespace: "default", Name: fmt.Sprint(i % 100)}, time.Duration(i%7)*time.Microsecond, true)
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("observe and the parked keys' loop deadlocked")
	}
}

// TestAPIClockKeepsItsCalibrationUnderTraffic: ordinary responses, at any
// phase of the server's second, bound the offset only to within a second;
// many of them must not push out the calibrated bounds. Each removal is a
// response, so under load podjanitor would otherwise act up to the spread of
// its last few dozen responses late (~15 ms for 64).
func TestAPIClockKeepsItsCalibrationUnderTraffic(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	clk := testingclock.NewFakeClock(t0)
	a := newAPIClock(clk, nil)
	srv := &simulatedServer{clk: clk, a: a, offset: 0, rtt: time.Millisecond}
	a.calibrate(ctx, srv.probe, srv.sleep)
	calibrated := a.Offset()
	if calibrated < -calibrationTarget-srv.rtt {
		t.Fatalf("calibration gave %v", calibrated)
	}
	// 3,000 responses over 2 minutes (25/s), at phases that do not land on
	// the second boundaries.
	for i := range 3000 {
		clk.Step(40*time.Millisecond + time.Duration(i%7)*time.Millisecond)
		if err := srv.probe(ctx); err != nil {
			t.Fatal(err)
		}
		if got := a.Offset(); got < calibrated || got > srv.offset {
			t.Fatalf("after %d responses the offset estimate is %v; calibrated %v, true %v", i+1, got, calibrated, srv.offset)
		}
	}
	// Past the window, the calibration has expired; what the traffic
	// measured since must still hold the true offset.
	clk.Step(offsetWindow)
	if err := srv.probe(ctx); err != nil {
		t.Fatal(err)
	}
	if lower, upper, _ := a.bounds(); lower > srv.offset || upper < srv.offset {
		t.Errorf("interval [%v, %v] does not hold the true offset %v", lower, upper, srv.offset)
	}
}
