package namespacecontroller

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podjanitor/podjanitor/policy"
)

// TestNamespaceReadIsRefreshedAhead proves that a namespace whose pods go one
// after another has its read refreshed before it is stale, so that no
// removal waits for a GET while the namespace can be read: the removal that
// finds the read more than half Freshness old goes by it and starts
// one GET behind it, which the removals after it use; that no read older
// than Freshness is used; that a removal starts at most one GET and
// a namespace has at most one refresh under way; and that a failed refresh
// leaves the read it was to replace in place until that is stale.
func TestNamespaceReadIsRefreshedAhead(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	clk := testingclock.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	var gets atomic.Int32
	release := make(chan error)
	r := &Reader{clock: clk, reads: map[string]*read{}, refreshes: map[string]*read{},
		get: func(ctx context.Context, name string) (*policy.Namespace, error) {
			n := gets.Add(1)
			if err := <-release; err != nil {
				return nil, err
			}
			return &policy.Namespace{Labels: map[string]string{"read": fmt.Sprint(n)}}, nil
		}}
	type answer struct {
		ns  *policy.Namespace
		err error
	}
	readAsync := func() <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			ns, err := r.Read(ctx, "a")
			ch <- answer{ns, err}
		}()
		return ch
	}
	waitGets := func(want int32) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 5*time.Second, true,
			func(context.Context) (bool, error) { return gets.Load() == want, nil }); err != nil {
			t.Fatalf("%d GETs, want %d", gets.Load(), want)
		}
	}
	// noMoreGets checks that no GET beyond want starts: refreshes start on
	// goroutines of their own, so it gives them a moment first.
	noMoreGets := func(want int32, why string) {
		t.Helper()
		time.Sleep(100 * time.Millisecond)
		if n := gets.Load(); n != want {
			t.Fatalf("%d GETs, want %d: %s", n, want, why)
		}
	}
	got := func(ch <-chan answer, want string) {
		t.Helper()
		select {
		case a := <-ch:
			if a.err != nil || a.ns.Labels["read"] != want {
				t.Fatalf("read gave %v, %v; want the namespace of GET %s", a.ns, a.err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("read waited, want the namespace of GET %s at once", want)
		}
	}

	first := readAsync() // nothing read yet: waits for GET 1
	waitGets(1)
	release <- nil
	got(first, "1")
	clk.Step(Freshness / 4)
	got(readAsync(), "1") // young: no GET
	noMoreGets(1, "a read a quarter of its freshness old is not refreshed")

	clk.Step(Freshness / 4) // half its freshness old
	got(readAsync(), "1")   // goes by it, and reads again behind it
	waitGets(2)
	got(readAsync(), "1") // one refresh under way at a time
	clk.Step(Freshness / 4)
	got(readAsync(), "1")
	noMoreGets(2, "one refresh under way at a time")
	release <- nil // GET 2 done: it takes the place of GET 1
	waitGets(2)
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		ns, err := r.Read(ctx, "a")
		return err == nil && ns.Labels["read"] == "2", nil
	}); err != nil {
		t.Fatal("the refresh did not take the place of the read it refreshed")
	}
	// GET 1 is stale now; GET 2, sent when GET 1 was half old, answers,
	// and is half old itself: it is refreshed in turn.
	clk.Step(Freshness / 4)
	got(readAsync(), "2")
	waitGets(3)

	// A failed refresh: the read it was to replace stands until stale.
	release <- errors.New("refused")
	clk.Step(Freshness / 8)
	got(readAsync(), "2") // no second refresh right after the failed one
	noMoreGets(3, "a failed refresh holds back the next for half the freshness")
	clk.Step(3 * Freshness / 8) // GET 2 stale: the failed refresh is the newest read, shared
	if _, err := r.Read(ctx, "a"); err == nil {
		t.Fatal("a read older than Freshness was used after its refresh failed")
	}
	noMoreGets(3, "the failed refresh is shared for Freshness")
	clk.Step(Freshness)
	blocked := readAsync() // nothing fresh: waits for its own GET
	waitGets(4)
	select {
	case a := <-blocked:
		t.Fatalf("read answered %v, %v before its GET", a.ns, a.err)
	default:
	}
	release <- nil
	got(blocked, "4")
}
