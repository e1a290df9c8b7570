package main

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
)

// BenchmarkParkedMemory measures the live heap that podStates holds per pod
// parked for its deadline (the B/pod metric): the entry, its map slot and its
// place in the heap, not the key's strings (the pod's cache holds those).
// Run it with
//
//	go test -run '^$' -bench ParkedMemory -benchtime 1x .
func BenchmarkParkedMemory(b *testing.B) {
	const n = 100000
	keys := make([]cache.ObjectName, n)
	for i := range keys {
		keys[i] = cache.ObjectName{Namespace: "bench-idle", Name: fmt.Sprintf("idle-%06d", i)}
	}
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var perPod float64
	for b.Loop() {
		clk := clocktesting.NewFakeClock(start)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := newPodStates(clk, clk.Now, nil)
		for i, key := range keys {
			s.park(key, time.Duration(n-i)*time.Second, untilDeadline)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if s.len() != n {
			b.Fatalf("%d entries, want %d", s.len(), n)
		}
		perPod = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(s)
	}
	b.ReportMetric(perPod, "B/pod")
}

// BenchmarkBacklog measures a due pod's way through the backlog under the
// removal cap: reserve puts it in (held, as in a first pass), grant hands it
// its slot, reserve takes the token. It reports the time per pod of the three
// and the live heap per waiting pod (the entry and its place in the queues,
// not the pod's own state), with n pods over one namespace or many. Run it
// with
//
//	go test -run '^$' -bench Backlog -benchtime 3x .
func BenchmarkBacklog(b *testing.B) {
	const n = 100000
	start := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, namespaces := range []int{1, 1000} {
		b.Run(fmt.Sprintf("namespaces=%d", namespaces), func(b *testing.B) {
			keys := make([]cache.ObjectName, n)
			for i := range keys {
				keys[i] = cache.ObjectName{Namespace: fmt.Sprintf("bench-%04d", i%namespaces), Name: fmt.Sprintf("due-%06d", i)}
			}
			var perPod, nsPerPod float64
			for b.Loop() {
				clk := clocktesting.NewFakeClock(start)
				s := newPodStates(clk, clk.Now, nil)
				s.limiter = rate.NewLimiter(10, n)
				for _, key := range keys { // their entries, as the decision makes them
					s.get(key, types.UID(key.Name))
				}
				s.holdBacklog()
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				began := time.Now()
				for i, key := range keys {
					if got, _ := s.reserve(key, types.UID(key.Name), start.Add(-time.Duration(i*7919%n)*time.Millisecond)); got != slotQueued {
						b.Fatalf("pod %v: slot %v, want queued", key, got)
					}
				}
				took := time.Since(began)
				runtime.GC()
				runtime.ReadMemStats(&after)
				perPod = float64(after.HeapAlloc-before.HeapAlloc) / n
				began = time.Now()
				s.openBacklog()
				granted, _, _ := s.grant()
				for _, key := range granted {
					if got, _ := s.reserve(key, types.UID(key.Name), start); got != slotNow {
						b.Fatalf("pod %v granted: slot %v, want now", key, got)
					}
				}
				took += time.Since(began)
				if len(granted) != n {
					b.Fatalf("%d pods granted, want %d", len(granted), n)
				}
				nsPerPod = float64(took.Nanoseconds()) / n
			}
			b.ReportMetric(perPod, "B/pod")
			b.ReportMetric(nsPerPod, "ns/pod")
		})
	}
}
