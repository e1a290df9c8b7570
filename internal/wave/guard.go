package wave

import (
	"bytes"
	"iter"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Source names what changed: the label of podjanitor_pods_held.
const (
	// SourceFile is the policy file, reloaded while running.
	SourceFile = "file"
	// SourceStartup is the start of a leader with a policy other than the
	// one the last leader acted on (none recorded: a first install).
	SourceStartup = "startup"
)

// Hold is a held change.
type Hold struct {
	// ID names the change (ChangeID); a person approves it by this value.
	ID     string
	Source string
	// Pods is the size of the wave when the change came.
	Pods int
}

// Guard remembers the policy whose decisions podjanitor acts on (the
// baseline) and the one change of it that is held, if any. While a change is
// held, a pod that is due under it but not under the baseline is held: it is
// not removed (Check). Approving the change makes it the baseline; a change
// back to the baseline (a revert) ends the hold, and the held pods keep the
// baseline's decisions. A Guard is safe for concurrent use.
type Guard struct {
	threshold Threshold
	window    time.Duration
	// onHeld is told how many pods are held now, whenever that changes.
	onHeld func(source string, n int)

	mu             sync.Mutex
	baseline       Decide // nil: no decision acted on yet
	baselinePolicy []byte
	held           *Hold
	pending        Decide
	pendingPolicy  []byte
	pods           map[string]struct{} // keys held now
}

// NewGuard returns a Guard whose baseline is policy (its bytes) decided by
// decide. onHeld may be nil.
func NewGuard(threshold Threshold, window time.Duration, policy []byte, decide Decide, onHeld func(source string, n int)) *Guard {
	if onHeld == nil {
		onHeld = func(string, int) {}
	}
	return &Guard{threshold: threshold, window: window, onHeld: onHeld,
		baseline: decide, baselinePolicy: policy, pods: map[string]struct{}{}}
}

// Change is a change of the policy to newPolicy, decided by decide, over the
// pods in scope at now. It returns the hold when the change's wave (against
// the baseline, not against a change held before it) exceeds the threshold;
// otherwise the change becomes the baseline, and any hold ends.
func (g *Guard) Change(source string, newPolicy []byte, decide Decide, pods iter.Seq[*corev1.Pod], now time.Time) (Hold, bool) {
	h, held, _ := g.change(source, newPolicy, decide, pods, now)
	return h, held
}

// change is Change that also returns the change's wave when it is not held
// (empty for a revert).
func (g *Guard) change(source string, newPolicy []byte, decide Decide, pods iter.Seq[*corev1.Pod], now time.Time) (Hold, bool, Wave) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.baseline != nil && bytes.Equal(newPolicy, g.baselinePolicy) {
		g.baseline = decide // the same policy; its evaluator may be new
		g.endHoldLocked()
		return Hold{}, false, Wave{}
	}
	w := Compute(pods, g.baseline, decide, now, g.window, g.threshold.Horizon)
	if !g.threshold.Exceeded(w) {
		g.baseline, g.baselinePolicy = decide, newPolicy
		g.endHoldLocked()
		return Hold{}, false, w
	}
	var old []byte
	if g.baseline != nil {
		old = g.baselinePolicy
	}
	g.endHoldLocked()
	g.held = &Hold{ID: ChangeID(old, newPolicy), Source: source, Pods: len(w.Pods)}
	g.pending, g.pendingPolicy = decide, newPolicy
	return *g.held, true, Wave{}
}

// Rebase makes policy, decided by decide, the baseline (nil: no decision
// acted on yet, a first install), for a start measured against the policy
// the last leader acted on: the record is what was acted on, so a hold this
// process measured before it led (a standby's reload) ends.
func (g *Guard) Rebase(policy []byte, decide Decide) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.endHoldLocked()
	g.baseline, g.baselinePolicy = decide, policy
}

// Approve approves the held change id: it becomes the baseline. It returns
// the keys of the pods it held (to decide again), and false when id is not
// the held change.
func (g *Guard) Approve(id string) ([]string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held == nil || g.held.ID != id {
		return nil, false
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range g.pods {
			if !yield(k) {
				return
			}
		}
	})
	g.baseline, g.baselinePolicy = g.pending, g.pendingPolicy
	g.endHoldLocked()
	return keys, true
}

// BaselinePolicy is the policy whose decisions are acted on (its bytes).
func (g *Guard) BaselinePolicy() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.baselinePolicy
}

// Held returns the held change, if any.
func (g *Guard) Held() (Hold, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held == nil {
		return Hold{}, false
	}
	return *g.held, true
}

// Check is asked about a pod that the running policy makes due now: held
// says that it must not be removed, because a change is held and the
// baseline does not make the pod due. A held pod keeps the baseline's
// deadline (zero for none): it goes then, hold or not.
func (g *Guard) Check(key string, pod *corev1.Pod, now time.Time) (held bool, deadline time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held == nil {
		g.forgetLocked(key)
		return false, time.Time{}
	}
	if held, deadline = HeldBy(g.baseline, pod, now); !held {
		g.forgetLocked(key)
		return false, time.Time{}
	}
	g.addLocked(key)
	return true, deadline
}

// HeldBy says whether a held change holds a pod that the running rules
// make due now: it does unless the rules acted on before it, baseline
// (nil: none), make the pod due now too; deadline is the one they give it
// (zero for none), when it goes, hold or not. The daemon's holds and
// podjanitor plan's HELD marks both say it by this.
func HeldBy(baseline Decide, pod *corev1.Pod, now time.Time) (held bool, deadline time.Time) {
	if baseline == nil {
		return true, time.Time{}
	}
	d, err := baseline(pod, now)
	if err != nil || !d.HasDeadline() {
		return true, time.Time{}
	}
	return d.Deadline.After(now), d.Deadline
}

// Forget drops a pod that is gone or not due: it is held no more.
func (g *Guard) Forget(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.forgetLocked(key)
}

// resume holds the change h to newPolicy (decided by decide) against the
// baseline at once, its wave measured before (a hold recorded in the API
// server, taken up again after a restart).
func (g *Guard) resume(h Hold, newPolicy []byte, decide Decide) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.endHoldLocked()
	g.held = &h
	g.pending, g.pendingPolicy = decide, newPolicy
}

// endHold ends the hold, if any, without a new baseline.
func (g *Guard) endHold() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.endHoldLocked()
}

func (g *Guard) addLocked(key string) {
	if _, ok := g.pods[key]; !ok {
		g.pods[key] = struct{}{}
		g.onHeld(g.held.Source, len(g.pods))
	}
}

func (g *Guard) forgetLocked(key string) {
	if _, ok := g.pods[key]; ok {
		delete(g.pods, key)
		if g.held != nil {
			g.onHeld(g.held.Source, len(g.pods))
		}
	}
}

func (g *Guard) endHoldLocked() {
	if g.held != nil {
		g.onHeld(g.held.Source, 0)
	}
	g.held, g.pending, g.pendingPolicy = nil, nil, nil
	clear(g.pods)
}
