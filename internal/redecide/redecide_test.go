package redecide

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"
)

// queue is a test's stand-in for the controller's workqueue.
type queue struct {
	mu   sync.Mutex
	keys []string
	room int
}

func (q *queue) add(key string) { q.mu.Lock(); q.keys = append(q.keys, key); q.mu.Unlock() }
func (q *queue) hasRoom() bool  { q.mu.Lock(); defer q.mu.Unlock(); return len(q.keys) < q.room }
func (q *queue) take() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.keys
	q.keys = nil
	return out
}

func start(t *testing.T, interval time.Duration, room int) (*Namespaces, *queue, *testingclock.FakeClock) {
	t.Helper()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	q := &queue{room: room}
	pods := map[string][]string{"a": {"a/1", "a/2", "a/3"}, "b": {"b/1"}}
	n := New(clk, interval, func(ns string) []string { return pods[ns] }, q.add, q.hasRoom)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return n, q, clk
}

func waitIdle(t *testing.T, n *Namespaces) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		n.Wake()
		return n.Idle(), nil
	}); err != nil {
		t.Fatal("never idle")
	}
}

// TestAddsCoalesceAndWaitTheInterval: many Adds of one namespace make one
// pass, the next one interval after it, not before.
func TestAddsCoalesceAndWaitTheInterval(t *testing.T) {
	n, q, clk := start(t, time.Second, 100)
	n.Add("a")
	waitIdle(t, n)
	for range 100 {
		n.Add("a")
	}
	waitIdle(t, n)
	if got := q.take(); !slices.Equal(got, []string{"a/1", "a/2", "a/3"}) || n.Passes() != 1 || n.Pending() != 1 {
		t.Fatalf("fed %v in %d passes, %d pending; want one pass of a's pods, a pending", got, n.Passes(), n.Pending())
	}
	clk.Step(999 * time.Millisecond)
	waitIdle(t, n)
	if got := q.take(); len(got) != 0 {
		t.Fatalf("fed %v before the interval", got)
	}
	clk.Step(time.Millisecond)
	waitIdle(t, n)
	if got := q.take(); !slices.Equal(got, []string{"a/1", "a/2", "a/3"}) || n.Passes() != 2 || n.Pending() != 0 {
		t.Fatalf("fed %v in %d passes after the interval; want a's pods, 2 passes", got, n.Passes())
	}
}

// TestFeedsOnlyWhileThereIsRoom: a pass adds no key while the queue is
// full, and goes on after a Wake once there is room.
func TestFeedsOnlyWhileThereIsRoom(t *testing.T) {
	n, q, _ := start(t, 0, 1)
	n.Add("a")
	n.Add("b")
	for _, want := range []string{"a/1", "a/2", "a/3", "b/1"} {
		if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			q.mu.Lock()
			defer q.mu.Unlock()
			return len(q.keys) == 1, nil
		}); err != nil {
			t.Fatalf("waiting for %s: never fed", want)
		}
		time.Sleep(20 * time.Millisecond) // a full queue stays at one key
		if got := q.take(); !slices.Equal(got, []string{want}) {
			t.Fatalf("fed %v, want [%s] (one key at a time)", got, want)
		}
		n.Wake()
	}
	waitIdle(t, n)
}
