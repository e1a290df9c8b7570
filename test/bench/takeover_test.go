package main

import (
	"math"
	"testing"
	"time"
)

func TestMeasureTakeover(t *testing.T) {
	kill := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return kill.Add(time.Duration(s * float64(time.Second))) }
	deadlines := map[string]time.Time{
		"a": at(1), "b": at(2), "c": at(10), // due in the gap: before the first removal at 16 s
		"d": at(20), "e": at(25), // due after it
		"f": at(28), // never removed
	}
	gone := map[string]time.Time{
		"a": at(16), "b": at(16.5), "c": at(17),
		"d": at(20.01), "e": at(26), // e 1 s late: late by 1 s until 26 s
		"far-1": at(40), // not due: counted apart
	}
	got := measureTakeover(kill, deadlines, gone)
	want := takeoverTimes{First: 16, Last: 26, Removed: 5, NotRemvd: 1, Others: 1, GapPods: 3, CatchUp: 1, CatchRate: 3, OnTime: 26}
	got.Lateness = latency{}
	if got != want {
		t.Errorf("measureTakeover = %+v,\n want %+v", got, want)
	}
	if l := measureTakeover(kill, deadlines, gone).Lateness; l.Count != 5 || l.Max != 15000 {
		t.Errorf("lateness = %+v, want 5 pods, max 15 s (a: 16 s - 1 s)", l)
	}

	// Early and before the kill: a pod removed before its deadline, and one
	// removed before the kill.
	early := measureTakeover(kill, map[string]time.Time{"a": at(1), "b": at(5)}, map[string]time.Time{"a": at(-0.5), "b": at(4)})
	if early.Early != 2 || early.BeforeK != 1 || early.First != -0.5 || early.GapPods != 0 || early.CatchUp != 0 || early.OnTime != 0 {
		t.Errorf("early = %+v: want 2 early, 1 before the kill, first at -0.5 s, no gap pods", early)
	}

	none := measureTakeover(kill, map[string]time.Time{"a": at(1)}, nil)
	if none.NotRemvd != 1 || !math.IsNaN(none.First) || !math.IsNaN(none.Last) {
		t.Errorf("nothing removed = %+v: want 1 not removed, first and last NaN", none)
	}
}

func TestShareOfCap(t *testing.T) {
	// 1,100 pods at 50/s with a burst of 100 need 20 s: in 25 s that is 80 %.
	if got := shareOfCap(1100, 25, 50, 100); math.Abs(got-0.8) > 1e-9 {
		t.Errorf("shareOfCap(1100, 25 s, 50/s, 100) = %v, want 0.8", got)
	}
	for _, c := range []struct {
		n          int
		secs, rate float64
	}{{100, 10, 50}, {1000, 10, 0}, {1000, 0, 50}} {
		if got := shareOfCap(c.n, c.secs, c.rate, 100); !math.IsNaN(got) {
			t.Errorf("shareOfCap(%d, %v, %v, 100) = %v, want NaN (no more than the burst, no cap, or no time)", c.n, c.secs, c.rate, got)
		}
	}
}

func TestKlogTime(t *testing.T) {
	got, ok := klogTime(`I1201 10:30:08.657993   17924 memory.go:170] "First pass done; GOMAXPROCS set for the steady state"`, 2026)
	want := time.Date(2026, 12, 1, 10, 30, 8, 657993000, time.Local)
	if !ok || !got.Equal(want) {
		t.Errorf("klogTime = %v, %v; want %v", got, ok, want)
	}
	if _, ok := klogTime("gc 7 @2.1s 3%: 0.021+1.2+0.003 ms clock", 2026); ok {
		t.Error("klogTime read a gctrace line")
	}
}

// The results' JSON (finite) keeps a takeover's removal figures.
func TestTakeoverRunJSON(t *testing.T) {
	run := takeoverRun{Removals: takeoverTimes{First: 16.5, Last: math.NaN()}}
	m, ok := finite(&run).(map[string]any)
	if !ok {
		t.Fatalf("finite(takeoverRun) = %T, want a map", finite(&run))
	}
	rem, ok := m["removals"].(map[string]any)
	if !ok || rem["first_removal_after_kill_seconds"] != 16.5 || rem["last_removal_after_kill_seconds"] != nil {
		t.Errorf("finite(takeoverRun)[removals] = %v, want first 16.5 and last null", m["removals"])
	}
}
