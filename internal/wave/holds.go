package wave

import (
	"bytes"
	"iter"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

// SourceTenant is a namespace's tenant policies (PodLifetimePolicy), created
// or changed.
const SourceTenant = "tenant"

// SourceNamespace is a namespace's labels or keep annotation, changed.
const SourceNamespace = "namespace"

// ReasonRemovalsHeld is the Ready condition's reason of a PodLifetimePolicy
// whose change is held.
const ReasonRemovalsHeld = "RemovalsHeld"

// ReasonRemovalsHeldAcrossNamespaces is the Ready condition's reason of a
// PodLifetimePolicy whose change is held with other namespaces' changes
// (Spread), on the Lease.
const ReasonRemovalsHeldAcrossNamespaces = "RemovalsHeldAcrossNamespaces"

// Holds are the held changes of many scopes (a namespace's tenant policies),
// each measured on its own: its wave against the pods of its scope, its
// approval by its own ID. A scope has a Guard only while a change of it is
// held; the rest of the time nothing is kept for it. Holds is safe for
// concurrent use.
type Holds struct {
	source    string
	threshold Threshold
	window    time.Duration
	onHeld    func(source string, n int) // the held pods of all scopes

	// spread measures the changes no scope holds together (SetSpread);
	// nil: none. spreadBefore is, by scope, what the scope was before the
	// first of its changes that wait there (Before), and the object that
	// made the latest of them (SpreadHeld).
	spread       *Spread
	spreadBefore map[string]spreadChange

	mu     sync.Mutex
	scopes map[string]*scopeHold

	countMu sync.Mutex
	counts  map[string]int
	total   int
}

// spreadChange is a scope's changes that wait in the Spread.
type spreadChange struct {
	before []byte
	object string
}

// scopeHold is a scope's held change: its Guard and the object that changed
// (the one a person approves on).
type scopeHold struct {
	guard  *Guard
	object string
}

// NewHolds returns Holds for changes of source; onHeld (may be nil) is told
// the held pods of all scopes together whenever that changes.
func NewHolds(source string, threshold Threshold, window time.Duration, onHeld func(source string, n int)) *Holds {
	if onHeld == nil {
		onHeld = func(string, int) {}
	}
	return &Holds{source: source, threshold: threshold, window: window, onHeld: onHeld,
		scopes: map[string]*scopeHold{}, counts: map[string]int{}, spreadBefore: map[string]spreadChange{}}
}

// Change is a change of scope by object from the policy old (its bytes,
// decided by oldDecide) to new, over the scope's pods at now. When a change
// of the scope is held already, the wave is measured against what that one
// holds back (its baseline), as Guard.Change does: a revert ends the hold,
// and another change needs its own approval. It returns the hold when the
// wave exceeds the threshold.
func (h *Holds) Change(scope, object string, old []byte, oldDecide Decide, new []byte, newDecide Decide, pods iter.Seq[*corev1.Pod], now time.Time) (Hold, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.scopes[scope]
	if s == nil {
		s = &scopeHold{guard: NewGuard(h.threshold, h.window, old, oldDecide, func(_ string, n int) { h.setCount(scope, n) })}
	}
	hold, held, w := s.guard.change(h.source, new, newDecide, pods, now)
	if !held {
		delete(h.scopes, scope)
		if c, ok := h.spreadBefore[scope]; ok && bytes.Equal(c.before, new) {
			// Back to what it was before its changes that wait in the
			// Spread: they leave it.
			h.spread.Revert(scope)
			delete(h.spreadBefore, scope)
			return Hold{}, false
		}
		if h.spread != nil {
			waiting := h.spread.Has(scope, now)
			h.spread.Add(scope, ChangeID(old, new), w, now)
			if !waiting {
				delete(h.spreadBefore, scope)
			}
			if h.spread.Has(scope, now) {
				c, ok := h.spreadBefore[scope]
				if !ok {
					c.before = old
				}
				c.object = object
				h.spreadBefore[scope] = c
			}
		}
		return Hold{}, false
	}
	s.object = object
	h.scopes[scope] = s
	return hold, true
}

// SetSpread has the changes that no scope holds on its own measured
// together by spread (one change made in many namespaces); call it before
// the first Change.
func (h *Holds) SetSpread(spread *Spread) { h.spread = spread }

// Resume holds the change h of scope by object from old to new again, as it
// was held before a restart (recorded in the API server): without measuring
// its wave, which was measured then. A scope held already keeps its hold,
// unless it is the same change taken up again (by another of its objects),
// which is held back to old from then on.
func (h *Holds) Resume(scope, object string, hold Hold, old []byte, oldDecide Decide, new []byte, newDecide Decide) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.scopes[scope]; s != nil {
		if held, ok := s.guard.Held(); !ok || held.ID != hold.ID {
			return
		}
		s.guard.endHold()
	}
	g := NewGuard(h.threshold, h.window, old, oldDecide, func(_ string, n int) { h.setCount(scope, n) })
	hold.Source = h.source
	g.resume(hold, new, newDecide)
	h.scopes[scope] = &scopeHold{guard: g, object: object}
}

// Before is what scope was before the changes of it that are not acted on
// yet at now: held by the scope's own hold (its baseline) or waiting in the
// Spread (pending or held there); false when every change of it is acted
// on.
func (h *Holds) Before(scope string, now time.Time) ([]byte, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.scopes[scope]; s != nil {
		if _, held := s.guard.Held(); held {
			return s.guard.BaselinePolicy(), true
		}
	}
	c, ok := h.spreadBefore[scope]
	if ok && !h.spread.Has(scope, now) {
		delete(h.spreadBefore, scope)
		return nil, false
	}
	return c.before, ok
}

// SpreadHeld returns the Spread's hold when a change of scope is in it,
// and the object that made the scope's latest change there.
func (h *Holds) SpreadHeld(scope string, now time.Time) (Hold, string, bool) {
	if h == nil || h.spread == nil {
		return Hold{}, "", false
	}
	h.mu.Lock()
	c, ok := h.spreadBefore[scope]
	h.mu.Unlock()
	if !ok {
		return Hold{}, "", false
	}
	held, scopes, isHeld := h.spread.Held()
	if !isHeld || !slices.Contains(scopes, scope) {
		return Hold{}, "", false
	}
	return held, c.object, true
}

// Held returns the held change of scope and the object that made it (none
// on a nil *Holds, which holds nothing).
func (h *Holds) Held(scope string) (hold Hold, object string, ok bool) {
	if h == nil {
		return Hold{}, "", false
	}
	h.mu.Lock()
	s := h.scopes[scope]
	if s != nil {
		object = s.object // Change sets it under h.mu
	}
	h.mu.Unlock()
	if s == nil {
		return Hold{}, "", false
	}
	hold, ok = s.guard.Held()
	return hold, object, ok
}

// Approve approves the held change id of scope, given on object: the scope
// acts on it from now on and is held no more. It returns the keys of the
// pods it held (to decide again), and false when id is not the scope's held
// change or object is not the one that made it.
func (h *Holds) Approve(scope, object, id string) ([]string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.scopes[scope]
	if s == nil || s.object != object {
		return nil, false
	}
	keys, ok := s.guard.Approve(id)
	if ok {
		delete(h.scopes, scope)
	}
	return keys, ok
}

// End drops the hold of scope, if object made it (the object is gone): its
// pods are decided as the scope's policies decide them now.
func (h *Holds) End(scope, object string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.scopes[scope]
	if s == nil || s.object != object {
		return false
	}
	s.guard.endHold()
	delete(h.scopes, scope)
	return true
}

// Check is Guard.Check for a pod of scope: whether a held change of the
// scope holds it, and its deadline under the baseline.
func (h *Holds) Check(scope, key string, pod *corev1.Pod, now time.Time) (bool, time.Time) {
	s := h.scope(scope)
	if s == nil {
		return false, time.Time{}
	}
	return s.guard.Check(key, pod, now)
}

// Forget is Guard.Forget for a pod of scope.
func (h *Holds) Forget(scope, key string) {
	if s := h.scope(scope); s != nil {
		s.guard.Forget(key)
	}
}

// CheckPod is Check for the pod of key, its namespace the scope.
func (h *Holds) CheckPod(key cache.ObjectName, pod *corev1.Pod, now time.Time) (bool, time.Time) {
	return h.Check(key.Namespace, key.String(), pod, now)
}

// ForgetPod is Forget for the pod of key, its namespace the scope.
func (h *Holds) ForgetPod(key cache.ObjectName) { h.Forget(key.Namespace, key.String()) }

func (h *Holds) scope(scope string) *scopeHold {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.scopes[scope]
}

func (h *Holds) setCount(scope string, n int) {
	h.countMu.Lock()
	defer h.countMu.Unlock()
	h.total += n - h.counts[scope]
	if n == 0 {
		delete(h.counts, scope)
	} else {
		h.counts[scope] = n
	}
	h.onHeld(h.source, h.total)
}
