package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	core "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podjanitor/podjanitor/internal/apiclock"
	"github.com/podjanitor/podjanitor/internal/apitest"
)

// parkedRun is a podStates whose run loop hands keys to a list, on a fake clock.
type parkedRun struct {
	t     *testing.T
	clk   *testingclock.FakeClock
	s     *podStates
	mu    sync.Mutex
	ready []cache.ObjectName
}

func newParkedRun(t *testing.T) *parkedRun {
	r := &parkedRun{t: t, clk: testingclock.NewFakeClock(t0)}
	r.s = newPodStates(r.clk, r.clk.Now, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.s.run(ctx, func(key cache.ObjectName) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.ready = append(r.ready, key)
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// step steps the clock by d once run waits for it, and returns the keys
// handed over since the last step once run waits again.
func (r *parkedRun) step(d time.Duration) []cache.ObjectName {
	r.t.Helper()
	r.settle()
	r.clk.Step(d)
	// The timer fires on the step; run then looks at the heap and waits again.
	_ = wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 200*time.Millisecond, true,
		func(context.Context) (bool, error) { return !r.s.settled(), nil })
	r.settle()
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.ready
	r.ready = nil
	return got
}

func (r *parkedRun) settle() {
	r.t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 5*time.Second, true,
		func(context.Context) (bool, error) { return r.s.settled(), nil }); err != nil {
		r.t.Fatal("the parked keys' loop never settled")
	}
}

func names(keys []cache.ObjectName) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.Name
	}
	slices.Sort(out)
	return out
}

// A key parked for centuries (an expires-at of 9999-12-31: syncHandler's
// Deadline.Sub(now) saturates at the largest Duration) must not hold up keys
// due in seconds. It held them up for ever: its wake-up time, in Unix
// nanoseconds, wrapped past 2262 to a time before 1970, so it sat at the top of
// the heap, and run slept on it for 290 years.
func TestFarFutureKeyDoesNotHoldUpOthers(t *testing.T) {
	r := newParkedRun(t)
	far := time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
	r.s.park(cache.ObjectName{Namespace: "default", Name: "far"}, far.Sub(r.clk.Now()), untilDeadline)
	r.s.park(cache.ObjectName{Namespace: "default", Name: "ttl-max"}, math.MaxInt64, untilDeadline)
	r.settle()
	for i := 1; i <= 3; i++ {
		r.s.park(cache.ObjectName{Namespace: "default", Name: fmt.Sprintf("soon-%d", i)}, time.Duration(i)*time.Second, untilDeadline)
	}
	if got := r.step(time.Second - time.Millisecond); len(got) != 0 {
		t.Fatalf("handed over early: %v", names(got))
	}
	for i := 1; i <= 3; i++ {
		want := []string{fmt.Sprintf("soon-%d", i)}
		d := time.Second
		if i == 1 {
			d = time.Millisecond
		}
		if got := names(r.step(d)); !slices.Equal(got, want) {
			t.Fatalf("at %v: handed over %v, want %v", r.clk.Since(t0), got, want)
		}
	}
	// The far keys are decided again after maxPark, not before.
	if got := r.step(maxPark - 3*time.Second - time.Millisecond); len(got) != 0 {
		t.Fatalf("handed over before maxPark: %v", names(got))
	}
	if got, want := names(r.step(time.Millisecond)), []string{"far", "ttl-max"}; !slices.Equal(got, want) {
		t.Fatalf("after maxPark: handed over %v, want %v", got, want)
	}
}

// The same through the controller: a pod that expires in 9999 and pods with
// ttls of seconds; the short ones come due at their deadlines.
func TestFarFuturePodDoesNotStallOtherPods(t *testing.T) {
	pods := []*corev1.Pod{apitest.Pod("far", t0, corev1.PodRunning, map[string]string{"podjanitor.io/expires-at": "9999-12-31"})}
	for i := 1; i <= 3; i++ {
		pods = append(pods, apitest.Pod(fmt.Sprintf("ttl-%d", i), t0, corev1.PodFailed,
			map[string]string{"podjanitor.io/ttl": fmt.Sprintf("%ds", 5*i)}))
	}
	f := newFixture(t, Options{}, pods...)
	for _, p := range pods {
		f.process(keyOf(p))
	}
	checkActions(t, nil, f.writes())
	for i := 1; i <= 3; i++ {
		step := 5 * time.Second
		if i == 1 {
			if f.stepAndCheckReady(step - time.Millisecond) {
				t.Fatal("a pod came due before its deadline")
			}
			step = time.Millisecond
		}
		if !f.stepAndWaitReady(step) {
			t.Fatalf("ttl-%d did not come due at its deadline", i)
		}
		f.next()
	}
	checkActions(t, []core.Action{deleteAction(pods[1]), deleteAction(pods[2]), deleteAction(pods[3])}, f.writes())
}

// An entry of a pod that is only parked stays in the 64-byte size class
// (BenchmarkParkedMemory).
func TestParkedEntrySize(t *testing.T) {
	if size := unsafe.Sizeof(podState{}); size > 64 {
		t.Errorf("a parked entry is %d bytes, want at most 64", size)
	}
}

// lastTime is the latest time.Time that Unix seconds can say.
var lastTime = time.Unix(math.MaxInt64-62135596800, 999999999)

// parkingTimes are the times the fuzz test sets the clock estimate to.
var parkingTimes = []time.Time{
	t0, {}, earliestWake, lastTime,
	time.Unix(0, 0), time.Unix(0, math.MaxInt64), time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64).Add(-time.Hour),
	time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(1677, 9, 21, 0, 12, 43, 145224192, time.UTC),
}

// parkingDurations are the durations the fuzz test parks keys for.
var parkingDurations = []time.Duration{
	0, 1, -1, time.Second, maxPark - 1, maxPark, maxPark + 1, math.MaxInt64, math.MinInt64,
	time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC).Sub(t0), time.Unix(0, math.MaxInt64).Sub(t0),
}

// FuzzParking checks the parking heap against a plain list with any order
// of parks, unparks and clock estimates: extreme and equal times, extreme
// durations, the estimate moving back and forth. After every step, popDue
// hands over every key whose time has come, never one early, and sleeps no
// longer than until the earliest key left is due (nor than maxPark).
//
// Each operation is 10 bytes: an opcode, a key and 8 bytes of argument.
func FuzzParking(f *testing.F) {
	op := func(code, key byte, arg uint64) []byte {
		return binary.LittleEndian.AppendUint64([]byte{code, key}, arg)
	}
	seq := func(ops ...[]byte) []byte { return slices.Concat(ops...) }
	u := func(d time.Duration) uint64 { return uint64(d) }
	f.Add(seq(op(0, 0, u(math.MaxInt64)), op(0, 1, u(time.Second)), op(4, 0, 0), op(3, 0, u(time.Second)), op(4, 0, 0)))
	f.Add(seq(op(2, 0, 3), op(1, 0, 7), op(1, 1, 9), op(1, 2, 0), op(3, 0, u(maxPark)), op(4, 0, 0), op(2, 0, 2), op(4, 0, 0)))
	f.Add(seq(op(2, 0, 3), op(0, 0, u(time.Second)), op(0, 1, u(time.Second)), op(2, 0, 0), op(4, 0, 0), op(2, 0, 2), op(4, 0, 0)))
	f.Add(seq(op(2, 0, 1), op(1, 0, 8), op(0, 1, 1), op(3, 0, u(math.MinInt64)), op(4, 0, 0), op(3, 0, u(math.MaxInt64)), op(4, 0, 0)))
	f.Add(seq(op(0, 0, 5), op(0, 1, 5), op(0, 2, 5), op(5, 1, 0), op(3, 0, 4), op(4, 0, 0), op(3, 0, 1), op(4, 0, 0)))
	f.Add(seq(op(2, 0, 4), op(1, 0, 3), op(1, 1, 6), op(2, 0, 5), op(4, 0, 0), op(2, 0, 3), op(4, 0, 0), op(2, 0, 4), op(4, 0, 0)))
	f.Fuzz(checkParking)
}

func checkParking(t *testing.T, data []byte) {
	now := t0
	var scheduled int
	s := newPodStates(testingclock.NewFakeClock(t0), func() time.Time { return now }, func(n int) { scheduled = n })
	type entry struct {
		wake    time.Time
		parking parking
	}
	model := map[cache.ObjectName]entry{}
	key := func(b byte) cache.ObjectName { return cache.ObjectName{Namespace: "fuzz", Name: fmt.Sprint(b % 8)} }
	for len(data) >= 10 {
		code, k, arg := data[0], key(data[1]), binary.LittleEndian.Uint64(data[2:10])
		data = data[10:]
		switch code % 6 {
		case 0, 1: // park for a raw duration, or for one of the extremes
			d := time.Duration(arg)
			if code%6 == 1 {
				d = parkingDurations[arg%uint64(len(parkingDurations))]
			}
			why := parking(arg&1 == 0)
			s.park(k, d, why)
			// What park promises: after d, but no later than maxPark.
			model[k] = entry{wake: now.Add(min(max(d, 0), maxPark)), parking: why}
		case 2: // the estimate jumps to one of the extreme times
			now = parkingTimes[arg%uint64(len(parkingTimes))]
		case 3: // the estimate moves by a raw duration, back or forth
			now = now.Add(time.Duration(arg))
			if now.Before(earliestWake) { // no clock reads 292 billion years BC
				now = earliestWake
			}
		case 4:
		case 5:
			s.unpark(k)
			delete(model, k)
		}

		due, wait, idle := s.popDue()
		var wantDue []string
		for k, e := range model {
			if !e.wake.After(now) {
				wantDue = append(wantDue, k.Name)
				delete(model, k)
			}
		}
		slices.Sort(wantDue)
		if got := names(due); !slices.Equal(got, wantDue) {
			t.Fatalf("at %v: handed over %v, want %v (still parked: %v)", now, got, wantDue, model)
		}
		if idle != (len(model) == 0) {
			t.Fatalf("idle = %v with %d keys parked", idle, len(model))
		}
		wantScheduled := 0
		if !idle {
			next := time.Duration(math.MaxInt64)
			for _, e := range model {
				next = min(next, e.wake.Sub(now))
				if e.parking == untilDeadline {
					wantScheduled++
				}
			}
			if want := min(next, maxPark); wait != want {
				t.Fatalf("at %v: run would sleep %v, want %v", now, wait, want)
			}
		}
		if scheduled != wantScheduled {
			t.Fatalf("%d keys scheduled, want %d", scheduled, wantScheduled)
		}
		if s.len() != len(model) {
			t.Fatalf("%d entries for %d parked keys", s.len(), len(model))
		}
	}
}

// The offset's callback moves parked deadlines while podStates asks the
// offset for the time: neither may wait for the other (they did: a.mu was
// held across the callback, which takes the podStates lock, while podStates'
// loop held its lock and asked for the offset).
func TestAPIClockCallbackDoesNotDeadlockWithParkedKeys(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var states *podStates
	a := apiclock.New(clock.RealClock{})
	a.Subscribe(func(time.Duration) { states.offsetChanged() })
	states = newPodStates(clock.RealClock{}, func() time.Time { return time.Now().Add(a.Offset()) }, nil)
	go states.run(ctx, func(cache.ObjectName) {})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20000 {
			now := time.Now()
			// Samples whose lower bound keeps rising, so every one calls back.
			a.Observe(ctx, now, now, now.Add(time.Duration(i)*time.Millisecond))
			states.park(cache.ObjectName{Namespace: "default", Name: fmt.Sprint(i % 100)}, time.Duration(i%7)*time.Microsecond, untilDeadline)
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("observe and the parked keys' loop deadlocked")
	}
}

// wakesWithin tells the API-server clock whether a removal is near: only the
// earliest parked key counts, a far-future one never is.
func TestWakesWithin(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	s := newPodStates(clk, clk.Now, nil)
	if s.wakesWithin(time.Hour) {
		t.Error("nothing parked, yet a removal is near")
	}
	far := cache.ObjectName{Namespace: "ns", Name: "far"}
	s.park(far, 1<<62, untilDeadline)
	if s.wakesWithin(30 * time.Second) {
		t.Error("a far-future pod makes a removal near")
	}
	soon := cache.ObjectName{Namespace: "ns", Name: "soon"}
	s.park(soon, 20*time.Second, untilDeadline)
	if !s.wakesWithin(30 * time.Second) {
		t.Error("a pod due in 20s is not near within 30s")
	}
	if s.wakesWithin(10 * time.Second) {
		t.Error("a pod due in 20s is near within 10s")
	}
	s.unpark(soon)
	if s.wakesWithin(30 * time.Second) {
		t.Error("an unparked pod still counts")
	}
}

// With a fine sleeper (apiclock.SleepFine in podjanitor), run's timer fires
// FineLead before a key's time and the sleeper waits the rest, since the
// clock's timers fire up to a millisecond late; the key is never handed
// over before its time.
func TestParkedKeysWakeWithTheFineSleeper(t *testing.T) {
	r := &parkedRun{t: t, clk: testingclock.NewFakeClock(t0)}
	r.s = newPodStates(r.clk, r.clk.Now, nil)
	var slept []time.Duration
	r.s.sleepFine = func(d time.Duration) {
		slept = append(slept, d) // run's goroutine only
		r.clk.Step(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var early []string
	go func() {
		defer close(done)
		r.s.run(ctx, func(key cache.ObjectName) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if want := t0.Add(10 * time.Second); key.Name == "a" && r.clk.Now().Before(want) {
				early = append(early, fmt.Sprintf("%s at %s", key.Name, r.clk.Now().Sub(want)))
			}
			r.ready = append(r.ready, key)
		})
	}()
	t.Cleanup(func() { cancel(); <-done })

	r.s.park(cache.ObjectName{Namespace: "ns", Name: "a"}, 10*time.Second, untilDeadline)
	if got := r.step(10*time.Second - apiclock.FineLead - time.Nanosecond); len(got) != 0 {
		t.Fatalf("handed %v before the timer's time", names(got))
	}
	if got := r.step(time.Nanosecond); !slices.Equal(names(got), []string{"a"}) {
		t.Fatalf("handed %v when the timer fired, want [a] after the fine sleep", names(got))
	}
	if !slices.Equal(slept, []time.Duration{apiclock.FineLead}) {
		t.Errorf("fine sleeps %v, want [%s]", slept, apiclock.FineLead)
	}
	if len(early) > 0 {
		t.Errorf("handed over early: %v", early)
	}
	// A key due within FineLead is slept for at once, without a timer.
	slept = nil
	r.s.park(cache.ObjectName{Namespace: "ns", Name: "b"}, time.Millisecond, untilDeadline)
	r.settle()
	r.mu.Lock()
	got := names(r.ready)
	r.mu.Unlock()
	if !slices.Equal(got, []string{"b"}) || !slices.Equal(slept, []time.Duration{time.Millisecond}) {
		t.Errorf("a key due in 1ms: handed %v after fine sleeps %v, want [b] after [1ms]", got, slept)
	}
}

// On the real clock with apiclock.SleepFine, as podjanitor runs: no key is
// handed over before its time, however close together the times are.
func TestParkedKeysAreNeverHandedOverEarlyOnTheRealClock(t *testing.T) {
	s := newPodStates(clock.RealClock{}, time.Now, nil)
	s.sleepFine = apiclock.SleepFine
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	due := map[string]time.Time{}
	var early []string
	handed := make(chan struct{}, 200)
	go s.run(ctx, func(key cache.ObjectName) {
		now := time.Now()
		mu.Lock()
		if now.Before(due[key.Name]) {
			early = append(early, fmt.Sprintf("%s by %s", key.Name, due[key.Name].Sub(now)))
		}
		mu.Unlock()
		handed <- struct{}{}
	})
	const n = 200
	for i := range n {
		d := time.Duration(i%37) * 173 * time.Microsecond
		mu.Lock()
		due[fmt.Sprint(i)] = time.Now().Add(d)
		mu.Unlock()
		s.park(cache.ObjectName{Namespace: "ns", Name: fmt.Sprint(i)}, d, untilDeadline)
	}
	for range n {
		select {
		case <-handed:
		case <-time.After(30 * time.Second):
			t.Fatal("parked keys were not handed over")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(early) > 0 {
		t.Errorf("%d keys handed over before their time: %v", len(early), early)
	}
}
