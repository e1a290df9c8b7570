package apiclock

import (
	"context"
	"time"
)

// FineLead is how long before a wake-up its Go timer fires, for SleepFine to
// sleep the rest. On Linux the Go runtime waits for its timers in whole
// milliseconds (the netpoller's epoll_wait), so a timer fires up to a
// millisecond late: 0.6 ms at the median on the development machine
// (BENCHMARKS.md), which was a quarter of a removal's lateness beside the
// ideal remover.
const FineLead = 2 * time.Millisecond

// SleepFine sleeps d, which should be at most FineLead: on Linux until a
// timerfd fires, which ends it within tens of microseconds; elsewhere in a
// Go timer. Its goroutine parks meanwhile, its thread does not block.
func SleepFine(d time.Duration) {
	if d > 0 {
		sleepFine(d)
	}
}

// Sleep waits d, or until ctx ends (false): a Go timer until FineLead
// before the end, SleepFine for the rest, so that it ends within tens of
// microseconds of d rather than up to a millisecond after.
func Sleep(ctx context.Context, d time.Duration) bool {
	end := time.Now().Add(d)
	if d > FineLead {
		t := time.NewTimer(d - FineLead)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	for r := time.Until(end); r > 0 && ctx.Err() == nil; r = time.Until(end) {
		SleepFine(r)
	}
	return ctx.Err() == nil
}
