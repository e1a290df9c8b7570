package apiclock

import (
	"context"
	"testing"
	"time"
)

// Sleep and SleepFine never end before their time: a probe aimed at a
// second of the server's clock, or a parked key, relies on it.
func TestSleepIsNeverShort(t *testing.T) {
	ctx := context.Background()
	for i := range 60 {
		d := time.Duration(i%20) * 237 * time.Microsecond
		start := time.Now()
		if i%2 == 0 {
			if !Sleep(ctx, d) {
				t.Fatalf("Sleep(%s) reported its context done", d)
			}
		} else {
			SleepFine(min(d, FineLead))
			d = min(d, FineLead)
		}
		if slept := time.Since(start); slept < d {
			t.Errorf("slept %s of %s", slept, d)
		}
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	done := make(chan bool)
	go func() { done <- Sleep(ctx, time.Hour) }()
	select {
	case ok := <-done:
		if ok {
			t.Error("Sleep of an hour reported it slept, its context was cancelled")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Sleep did not end with its context")
	}
	if Sleep(ctx, time.Millisecond) {
		t.Error("Sleep with a cancelled context reported it slept")
	}
}
