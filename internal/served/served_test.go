package served

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	testingclock "k8s.io/utils/clock/testing"
)

var notServed = apierrors.NewNotFound(schema.GroupResource{Group: "podjanitor.io", Resource: "podlifetimepolicies"}, "")

// TestAwaitProbesEveryIntervalUntilServed: no probe before the first
// interval, one per interval after it; 404s are quiet, other errors are
// reported and do not end the wait; the first success does.
func TestAwaitProbesEveryIntervalUntilServed(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(0, 0))
	answers := []error{notServed, apierrors.NewInternalError(errors.New("etcd")), notServed, nil}
	probes := make(chan int, len(answers))
	var failed []error
	done := make(chan bool)
	go func() {
		n := 0
		done <- Await(context.Background(), clk, 30*time.Second, func(context.Context) error {
			n++
			probes <- n
			return answers[n-1]
		}, func(err error) { failed = append(failed, err) })
	}()
	for i := range answers {
		waitForTicker(t, clk)
		clk.Step(29 * time.Second)
		select {
		case n := <-probes:
			t.Fatalf("probe %d after 29s of interval %d, want none before 30s", n, i)
		case <-time.After(20 * time.Millisecond):
		}
		clk.Step(time.Second)
		select {
		case n := <-probes:
			if n != i+1 {
				t.Fatalf("probe %d, want %d", n, i+1)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no probe %d after its interval", i+1)
		}
	}
	if served := <-done; !served {
		t.Error("Await = false after a successful probe, want true")
	}
	if len(failed) != 1 || !apierrors.IsInternalError(failed[0]) {
		t.Errorf("failed got %v, want the one 500 (404s are the expected answer)", failed)
	}
}

func TestAwaitEndsWithItsContext(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool)
	go func() {
		done <- Await(ctx, clk, time.Second, func(context.Context) error { return notServed }, func(error) {})
	}()
	waitForTicker(t, clk)
	clk.Step(time.Second)
	cancel()
	select {
	case served := <-done:
		if served {
			t.Error("Await = true for a resource never served")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Await did not return after its context ended")
	}
}

func waitForTicker(t *testing.T, clk *testingclock.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("Await never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}
