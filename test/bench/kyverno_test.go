package main

import (
	"testing"
	"time"
)

func TestKyvernoCopiesRotate(t *testing.T) {
	first := map[string]int{}
	for k := range 30 {
		seen := map[string]bool{}
		for c := range 3 {
			gotK, ns := kyvernoCopy(3*k + c)
			if gotK != k {
				t.Fatalf("pod %d: k = %d, want %d", 3*k+c, gotK, k)
			}
			if seen[ns] {
				t.Fatalf("pod %d has two copies in %s", k, ns)
			}
			seen[ns] = true
			if c == 0 {
				first[ns]++
			}
		}
	}
	for _, ns := range []string{kyvernoJanitorNS, kyvernoKyvernoNS, kyvernoIdealNS} {
		if first[ns] != 10 {
			t.Errorf("%s's copy went first %d times in 30, want 10", ns, first[ns])
		}
	}
}

func TestKyvernoSideFill(t *testing.T) {
	created := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ttls := map[string]time.Duration{"kyv-000000": time.Minute, "kyv-000001": 2 * time.Minute, "kyv-000002": time.Minute}
	deadline := func(name string, c time.Time) (time.Time, bool) {
		ttl, ok := ttls[name]
		return c.Add(ttl), ok
	}
	var s kyvernoSide
	s.fill(map[string]peerPod{
		"kyv-000000": {created: created, gone: created.Add(time.Minute + 5*time.Millisecond)},
		"kyv-000001": {created: created, gone: created.Add(time.Minute)}, // a minute early
		"kyv-000002": {created: created},                                 // not removed
		"probe":      {created: created, gone: created},                  // not one of the run's pods
	}, deadline)
	if s.Removed != 2 || s.Early != 1 || s.NotRemoved != 1 {
		t.Errorf("removed %d, early %d, not removed %d; want 2, 1, 1", s.Removed, s.Early, s.NotRemoved)
	}
	if s.Lateness.Max != 5 {
		t.Errorf("max lateness %v ms, want 5", s.Lateness.Max)
	}
}
