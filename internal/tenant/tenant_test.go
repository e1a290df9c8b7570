package tenant

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podjanitor/podjanitor/policy"
)

// writeLog records the writer's writes, by policy, with the fake clock's time.
type writeLog struct {
	clock  *testingclock.FakeClock
	mu     sync.Mutex
	writes map[string][]time.Time
	wrote  chan string
	// hold, when set, makes the next write wait inside write until it is
	// closed, after sending on entered.
	hold, entered chan struct{}
}

func (l *writeLog) write(_ context.Context, key string) error {
	l.mu.Lock()
	hold, entered := l.hold, l.entered
	l.hold = nil
	l.mu.Unlock()
	if hold != nil {
		entered <- struct{}{}
		<-hold
	}
	l.mu.Lock()
	l.writes[key] = append(l.writes[key], l.clock.Now())
	l.mu.Unlock()
	l.wrote <- key
	return nil
}

func (l *writeLog) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.writes[key])
}

// expectWrite waits (in real time, generously) for one write of key.
func (l *writeLog) expectWrite(t *testing.T, key string) {
	t.Helper()
	select {
	case got := <-l.wrote:
		if got != key {
			t.Fatalf("wrote %s, want %s", got, key)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no write of %s", key)
	}
}

func (l *writeLog) expectNoWrite(t *testing.T) {
	t.Helper()
	select {
	case got := <-l.wrote:
		t.Fatalf("wrote %s, want no write", got)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestStatusWriterRateBound proves that a policy's status is written at most
// once per interval however often it is marked, that marks in an interval
// coalesce into one write at its end, and that policies do not share a bound.
func TestStatusWriterRateBound(t *testing.T) {
	const interval = 10 * time.Second
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	log := &writeLog{clock: clk, writes: map[string][]time.Time{}, wrote: make(chan string, 1000)}
	w := NewStatusWriter(clk, interval, log.write)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { w.Run(ctx, nil); close(done) }()
	defer func() { cancel(); <-done }()

	// A first mark is written at once; a thousand more in the interval
	// (a pod event each) wait for its end.
	w.Add("a/p")
	log.expectWrite(t, "a/p")
	for range 1000 {
		w.Mark("a/p")
	}
	w.Add("b/q") // another policy is not held back by a/p's writes
	log.expectWrite(t, "b/q")
	log.expectNoWrite(t)
	clk.Step(interval - time.Second)
	log.expectNoWrite(t)
	clk.Step(time.Second)
	log.expectWrite(t, "a/p")
	log.expectNoWrite(t)
	if n := log.count("a/p"); n != 2 {
		t.Fatalf("a/p written %d times in one interval and 1001 marks, want 2", n)
	}
	// No mark, no write, however long.
	clk.Step(10 * interval)
	log.expectNoWrite(t)
	// A mark long after the last write is written at once.
	w.Mark("a/p")
	log.expectWrite(t, "a/p")

	log.mu.Lock()
	defer log.mu.Unlock()
	for key, times := range log.writes {
		for i := 1; i < len(times); i++ {
			if gap := times[i].Sub(times[i-1]); gap < interval {
				t.Errorf("%s written %v after its previous write, want at least %v", key, gap, interval)
			}
		}
	}
}

// TestTrackerSummary proves that the tracker counts each policy's pods and
// their next deadline, moves a pod between policies, forgets pods, and
// reports each change to the policies it concerns only.
func TestTrackerSummary(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var changed []string
	tr := NewTracker(func(key string) { changed = append(changed, key) })
	d := func(p string, minutes int) policy.Decision {
		return policy.Decision{Policy: p, Deadline: t0.Add(time.Duration(minutes) * time.Minute)}
	}
	tr.Observe("a/pod-1", d("a/p", 10))
	tr.Observe("a/pod-2", d("a/p", 5))
	tr.Observe("a/pod-2", d("a/p", 5)) // the same: no change
	if n, next := tr.Summary("a/p"); n != 2 || !next.Equal(t0.Add(5*time.Minute)) {
		t.Errorf("Summary(a/p) = %d, %v; want 2, +5m", n, next)
	}
	tr.Observe("a/pod-2", d("a/q", 5)) // now another policy's
	if n, next := tr.Summary("a/p"); n != 1 || !next.Equal(t0.Add(10*time.Minute)) {
		t.Errorf("Summary(a/p) = %d, %v; want 1, +10m", n, next)
	}
	tr.Observe("a/pod-1", policy.Decision{Deadline: t0, Source: "rule/cluster"}) // the cluster file's now
	tr.Forget("a/pod-2")
	tr.Forget("a/pod-3") // never seen: no change
	for _, key := range []string{"a/p", "a/q"} {
		if n, next := tr.Summary(key); n != 0 || !next.IsZero() {
			t.Errorf("Summary(%s) = %d, %v; want 0, zero", key, n, next)
		}
	}
	want := []string{"a/p", "a/p", "a/p", "a/q", "a/p", "a/q"}
	if len(changed) != len(want) {
		t.Fatalf("changed %v, want %v", changed, want)
	}
	for i := range want {
		if changed[i] != want[i] {
			t.Fatalf("changed %v, want %v", changed, want)
		}
	}
}

// TestStoreOrder proves that a namespace's policies are tried by name and
// that Set replaces and Delete drops.
func TestStoreOrder(t *testing.T) {
	s := NewStore()
	mk := func(ns, name string) *policy.TenantPolicy { return &policy.TenantPolicy{Namespace: ns, Name: name} }
	s.Set(mk("a", "zeta"))
	s.Set(mk("a", "alpha"))
	s.Set(mk("b", "beta"))
	s.Set(mk("a", "alpha")) // replaced, not doubled
	names := func(ns string) (out []string) {
		for _, p := range s.For(ns) {
			out = append(out, p.Name)
		}
		return out
	}
	if got := names("a"); len(got) != 2 || got[0] != "alpha" || got[1] != "zeta" {
		t.Errorf("For(a) = %v, want [alpha zeta]", got)
	}
	s.Delete("a", "alpha")
	s.Delete("b", "beta")
	if got := names("a"); len(got) != 1 || got[0] != "zeta" {
		t.Errorf("For(a) = %v, want [zeta]", got)
	}
	if got := names("b"); len(got) != 0 {
		t.Errorf("For(b) = %v, want none", got)
	}
}

// TestStatusWriterForgetsDeletedPolicies proves that the writer keeps no
// state for a deleted policy, on a standby (never running) and on the
// leader, even when pods decided again after the deletion mark it, and
// writes nothing for it.
// TestStatusWriterReleaseWritesAtOnce: a policy written a moment ago and
// marked waits for the interval's end; released (its deletion), it is
// written at once, and its next mark waits a whole interval from then.
func TestStatusWriterReleaseWritesAtOnce(t *testing.T) {
	const interval = 10 * time.Second
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	log := &writeLog{clock: clk, writes: map[string][]time.Time{}, wrote: make(chan string, 1000)}
	w := NewStatusWriter(clk, interval, log.write)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx, nil); close(done) }()
	defer func() { cancel(); <-done }()
	w.Add("a/p")
	log.expectWrite(t, "a/p")
	w.Mark("a/p")
	log.expectNoWrite(t)
	w.Release("a/p")
	log.expectWrite(t, "a/p")
	w.Mark("a/p")
	clk.Step(interval - time.Second)
	log.expectNoWrite(t)
	clk.Step(time.Second)
	log.expectWrite(t, "a/p")
	w.Release("a/unknown") // never added: nothing
	log.expectNoWrite(t)
}

func TestStatusWriterForgetsDeletedPolicies(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	log := &writeLog{clock: clk, writes: map[string][]time.Time{}, wrote: make(chan string, 1000)}
	w := NewStatusWriter(clk, time.Second, log.write)
	churn := func() {
		for i := range 1000 {
			key := fmt.Sprintf("a/p-%d", i)
			w.Add(key)
			w.Mark(key)
			w.Forget(key)
			w.Mark(key) // its pods decided again after the deletion
		}
	}
	churn()
	if n := w.Len(); n != 0 {
		t.Errorf("standby: state for %d policies after 1,000 created and deleted, want 0", n)
	}
	w.Add("a/kept")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx, nil); close(done) }()
	defer func() { cancel(); <-done }()
	log.expectWrite(t, "a/kept")
	// The churn while the writer is busy writing a/kept again, so that it
	// cannot take a churned policy before its deletion: the deletions, and
	// the marks after them, must leave nothing to write.
	hold, entered := make(chan struct{}), make(chan struct{})
	log.mu.Lock()
	log.hold, log.entered = hold, entered
	log.mu.Unlock()
	w.Mark("a/kept")
	clk.Step(time.Second)
	<-entered
	churn()
	close(hold)
	log.expectWrite(t, "a/kept")
	clk.Step(time.Second)
	log.expectNoWrite(t)
	if n := w.Len(); n != 1 {
		t.Errorf("leader: state for %d policies, want 1 (a/kept)", n)
	}
}

// TestTrackerExpect proves that Expect's channel is closed once each
// expected pod was decided, with or without a deadline, and not before.
func TestTrackerExpect(t *testing.T) {
	tr := NewTracker(nil)
	done := tr.Expect([]string{"a/1", "a/2"})
	tr.Observe("a/1", policy.Decision{Policy: "a/p", Deadline: time.Now()})
	tr.Observe("b/other", policy.Decision{})
	select {
	case <-done:
		t.Fatal("closed with a/2 not decided")
	default:
	}
	tr.Observe("a/2", policy.Decision{})
	select {
	case <-done:
	default:
		t.Fatal("not closed once a/1 and a/2 were decided")
	}
	select {
	case <-tr.Expect(nil):
	default:
		t.Fatal("Expect(nil) not closed at once")
	}
}

// TestStatusWriterNotYetIsNotAWrite proves that a write answered ErrNotYet
// (a change of the policy's namespace waits for its pass) does not count
// against the interval: the pass's mark writes at once, not an interval
// later.
func TestStatusWriterNotYetIsNotAWrite(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	var notYet atomic.Bool
	notYet.Store(true)
	wrote := make(chan string, 10)
	w := NewStatusWriter(clk, time.Minute, func(_ context.Context, key string) error {
		if notYet.Load() {
			wrote <- "not yet"
			return ErrNotYet
		}
		wrote <- key
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx, nil); close(done) }()
	defer func() { cancel(); <-done }()
	w.Add("a/p")
	if got := <-wrote; got != "not yet" {
		t.Fatalf("first write %q, want the not-yet answer", got)
	}
	notYet.Store(false)
	w.Mark("a/p") // the pass
	select {
	case got := <-wrote:
		if got != "a/p" {
			t.Fatalf("wrote %q, want a/p", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the mark after a not-yet answer waited for the interval")
	}
}

// gate is a status write that announces each call, with the fake clock's
// time, and returns what the test answers.
type gate struct {
	clock   *testingclock.FakeClock
	entered chan gateCall
	answer  chan error
}

type gateCall struct {
	key string
	at  time.Time
}

func newGate(clk *testingclock.FakeClock) *gate {
	return &gate{clock: clk, entered: make(chan gateCall), answer: make(chan error)}
}

func (g *gate) write(ctx context.Context, key string) error {
	select {
	case g.entered <- gateCall{key: key, at: g.clock.Now()}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-g.answer:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// next waits for the writer's next write, which must be of key, and
// returns the fake clock's time at its start. The timeout only keeps a
// hang from lasting: the order of the writes is what is tested.
func (g *gate) next(t *testing.T, key string) time.Time {
	t.Helper()
	select {
	case c := <-g.entered:
		if c.key != key {
			t.Fatalf("wrote %s, want %s next", c.key, key)
		}
		return c.at
	case <-time.After(30 * time.Second):
		t.Fatalf("no write of %s", key)
	}
	return time.Time{}
}

// runWriter runs w until the test ends.
func runWriter(t *testing.T, w *StatusWriter) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx, nil); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// TestStatusWriterMarkDuringNotYetWrite proves that a policy marked while
// its first write is in flight, a write then answered ErrNotYet (the
// namespace's pass marks it as the write finds the pass pending), is
// written at once, not an interval later: the mark queued behind the write
// comes forward when the write turns out not to count.
func TestStatusWriterMarkDuringNotYetWrite(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	g := newGate(clk)
	w := NewStatusWriter(clk, 10*time.Second, g.write)
	runWriter(t, w)

	w.Add("a/p")
	g.next(t, "a/p")
	w.Mark("a/p") // the pass, while the write is in flight
	w.Add("b/q")
	g.answer <- ErrNotYet
	// b/q was queued before a/p's write ended, so a/p, if queued again, is
	// behind b/q and ahead of c/r, queued while b/q is written.
	g.next(t, "b/q")
	w.Add("c/r")
	g.answer <- nil
	g.next(t, "a/p")
	g.answer <- nil
	g.next(t, "c/r")
	g.answer <- nil
}

// TestStatusWriterKeepsIntervalAfterEarlyWrite proves that a write out of
// the interval's order (a release; a mark after a write answered ErrNotYet)
// does not leave the policy's earlier queued time in force: marked after
// it, the policy is written a whole interval after it, not when the
// earlier mark's time comes. The clock steps to multiples of the queue's
// 10s heartbeat, which wakes its wait for the time of a key even if the
// step came just before the wait's timer was set (then set a step late).
func TestStatusWriterKeepsIntervalAfterEarlyWrite(t *testing.T) {
	const interval, step = 20 * time.Second, 10 * time.Second
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	g := newGate(clk)
	w := NewStatusWriter(clk, interval, g.write)
	runWriter(t, w)

	w.Add("a/p")
	g.next(t, "a/p")
	g.answer <- nil
	w.Mark("a/p") // queued for an interval after the write
	clk.Step(step)
	w.Release("a/p")
	released := g.next(t, "a/p")
	g.answer <- nil
	w.Mark("a/p")
	// The writer busy with x/busy when the first mark's time comes, a/p is
	// taken from the queue after that time and before b/q.
	w.Add("x/busy")
	g.next(t, "x/busy")
	clk.Step(step)
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return w.queue.Len() == 1, nil }); err != nil {
		t.Fatalf("a/p not queued at its first mark's time: %d keys queued", w.queue.Len())
	}
	w.Add("b/q")
	g.answer <- nil
	g.next(t, "b/q")
	g.answer <- nil
	clk.Step(step)
	if at := g.next(t, "a/p"); at.Sub(released) < interval {
		t.Fatalf("a/p written %v after its release's write, want %v", at.Sub(released), interval)
	}
	g.answer <- nil
}
