package wave

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// BenchmarkCompute measures a change's wave at 10,000 and 150,000 pods,
// created a second apart, from `after: 7d` to `after: 12h`, with the horizon
// at the window (the pods due within 5 minutes alone: a few hundred) and at
// 24h (every pod brought forward within it, sorted by its new deadline to
// find the window where most come due). Run it with
//
//	go test -run '^$' -bench Compute -count 6 ./internal/wave/
func BenchmarkCompute(b *testing.B) {
	for _, n := range []int{10000, 150000} {
		all := make([]*corev1.Pod, n)
		for i := range all {
			all[i] = pod(fmt.Sprintf("pod-%06d", i), time.Duration(i)*time.Second)
		}
		old, new := after(7*24*time.Hour), after(12*time.Hour)
		for _, horizon := range []time.Duration{5 * time.Minute, 24 * time.Hour} {
			b.Run(fmt.Sprintf("pods=%d/horizon=%v", n, horizon), func(b *testing.B) {
				b.ReportAllocs()
				var w Wave
				for b.Loop() {
					w = Compute(pods(all...), old, new, t0, 5*time.Minute, horizon)
				}
				b.ReportMetric(float64(len(w.Pods)), "wave-pods")
			})
		}
	}
}
