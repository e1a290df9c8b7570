package main

import (
	"fmt"
	"runtime"
	"testing"
	"time"

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
