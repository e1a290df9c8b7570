package wave

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

// SourceSpread is one change spread over many namespaces (a policy pushed
// into each, `kubectl label ns --all`): their tenant policies' or their
// labels' changes that no namespace holds on its own, measured together.
const SourceSpread = "namespaces"

// Spread measures together the changes of many scopes (namespaces) that
// each scope's own hold lets through (Holds.Change tells it their waves), so
// that one change made in many namespaces is held as one cluster-wide wave,
// on the Lease.
//
// The pods a change brings forward wait while changes keep coming: until
// settle has passed since the latest (pending). Changes made within settle
// of one another are so measured together before any of their pods goes.
// When the pending pods, with those of the changes let through in the last
// window, pass the threshold against every pod watched, the pending pods
// are held, and so are those of the changes that come while the hold lasts,
// until a person approves it (Approve). Otherwise, settle after the latest
// change the pending pods go. A pending or held pod that comes due under the
// rules before the change (its old deadline) goes then.
//
// A Spread is safe for concurrent use. What it holds lives in memory only:
// a restart ends a hold, and decides the pods by the namespaces' rules.
type Spread struct {
	threshold Threshold
	window    time.Duration
	settle    time.Duration
	inScope   func() int
	onHeld    func(source string, n int)

	mu      sync.Mutex
	pending map[string]time.Time // pod key: its deadline before the change (zero: none)
	changes map[string]string    // scope: the change (its ID) that brought its pods forward
	last    time.Time            // when the latest change came
	// gone are the pods the changes let through lately brought forward,
	// by scope: the most of one scope's that went together, and when
	// (settle after their last change). A scope counts once however often
	// it changes: its own hold measures its changes against each other.
	gone map[string]spreadGone
	held *Hold
}

type spreadGone struct {
	at time.Time
	n  int
}

// NewSpread returns a Spread that holds more pods than threshold allows (of
// inScope(), the pods watched), counting the changes let through within
// window, and lets pending pods go settle after the latest change. onHeld
// (may be nil) is told how many pods it holds.
func NewSpread(threshold Threshold, window, settle time.Duration, inScope func() int, onHeld func(source string, n int)) *Spread {
	if onHeld == nil {
		onHeld = func(string, int) {}
	}
	return &Spread{threshold: threshold, window: window, settle: settle, inScope: inScope, onHeld: onHeld,
		pending: map[string]time.Time{}, changes: map[string]string{}, gone: map[string]spreadGone{}}
}

// Add is a change of scope (its ID) that scope's own hold let through,
// with its wave, at now. It returns the hold when this change made the
// spread pass the threshold.
func (s *Spread) Add(scope, change string, w Wave, now time.Time) (Hold, bool) {
	if len(w.Pods) == 0 {
		return Hold{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked(now)
	for i, key := range w.Pods {
		if _, ok := s.pending[key]; !ok {
			s.pending[key] = w.Was[i]
		}
	}
	s.changes[scope] = change
	s.last = now
	if s.held != nil {
		// The hold is of the changes in it now: one joining it needs
		// the approval of the hold as it stands with it.
		s.held.ID = spreadID(s.changes)
		s.held.Pods = max(s.held.Pods, len(s.pending))
		s.onHeld(SourceSpread, len(s.pending))
		return Hold{}, false
	}
	gone := 0
	for scope, g := range s.gone {
		if _, pending := s.changes[scope]; !pending {
			gone += g.n // a scope pending now counts by its pending pods
		}
	}
	if !s.threshold.exceeded(len(s.pending)+gone, s.inScope()) {
		return Hold{}, false
	}
	s.held = &Hold{ID: spreadID(s.changes), Source: SourceSpread, Pods: len(s.pending)}
	s.onHeld(SourceSpread, len(s.pending))
	return *s.held, true
}

// Revert takes the changes of scope out (the scope is back to what it was
// before them): its pods wait no more. A hold left with no change in it
// ends; one left with others is of those, and named by them.
func (s *Spread) Revert(scope string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.changes[scope]; !ok {
		return
	}
	delete(s.changes, scope)
	maps.DeleteFunc(s.pending, func(key string, _ time.Time) bool { return strings.HasPrefix(key, scope+"/") })
	if s.held == nil {
		return
	}
	if len(s.changes) == 0 {
		clear(s.pending)
		s.held = nil
		s.onHeld(SourceSpread, 0)
		return
	}
	s.held.ID = spreadID(s.changes)
	s.onHeld(SourceSpread, len(s.pending))
}

// spreadID names a spread's hold by the changes in it.
func spreadID(changes map[string]string) string {
	h := sha256.New()
	for _, scope := range slices.Sorted(maps.Keys(changes)) {
		h.Write([]byte(scope))
		h.Write([]byte{0})
		h.Write([]byte(changes[scope]))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// settleLocked lets the pending pods go once settle has passed since the
// latest change with nothing held, and forgets the changes let through
// more than window ago.
func (s *Spread) settleLocked(now time.Time) {
	if s.held == nil && len(s.pending) > 0 && !now.Before(s.last.Add(s.settle)) {
		at := s.last.Add(s.settle)
		n := map[string]int{}
		for key := range s.pending {
			scope, _, _ := strings.Cut(key, "/")
			n[scope]++
		}
		for scope, k := range n {
			if g, ok := s.gone[scope]; !ok || k >= g.n {
				s.gone[scope] = spreadGone{at: at, n: k}
			}
		}
		clear(s.pending)
		clear(s.changes)
	}
	maps.DeleteFunc(s.gone, func(_ string, g spreadGone) bool { return now.Sub(g.at) > s.window })
}

// CheckPod says whether the due pod is held, pending or in a hold, and
// when to decide it again: at the end of settle while pending, at its old
// deadline (zero: none, the approval decides it again) while held.
func (s *Spread) CheckPod(key cache.ObjectName, _ *corev1.Pod, now time.Time) (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked(now)
	k := key.String()
	was, ok := s.pending[k]
	if !ok {
		return false, time.Time{}
	}
	if !was.IsZero() && !was.After(now) {
		s.forgetLocked(k) // due before the change too
		return false, time.Time{}
	}
	if s.held != nil {
		return true, was
	}
	again := s.last.Add(s.settle)
	if !was.IsZero() && was.Before(again) {
		again = was
	}
	return true, again
}

// ForgetPod drops a pod that is gone, or no longer due.
func (s *Spread) ForgetPod(key cache.ObjectName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(key.String())
}

func (s *Spread) forgetLocked(key string) {
	if _, ok := s.pending[key]; !ok {
		return
	}
	delete(s.pending, key)
	if s.held != nil {
		s.onHeld(SourceSpread, len(s.pending))
	}
}

// Has says whether a change of scope waits in the Spread at now: pending
// (its pods wait for settle) or held.
func (s *Spread) Has(scope string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked(now)
	_, ok := s.changes[scope]
	return ok
}

// Held returns the hold, if any, and the scopes whose changes are in it.
func (s *Spread) Held() (Hold, []string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		return Hold{}, nil, false
	}
	return *s.held, slices.Sorted(maps.Keys(s.changes)), true
}

// Approve approves the hold id: its pods go (their keys, to decide again),
// and the changes in it are acted on. False when id is not the hold's.
func (s *Spread) Approve(id string) ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil || s.held.ID != id {
		return nil, false
	}
	keys := slices.Sorted(maps.Keys(s.pending))
	clear(s.gone) // approved: what came before counts no more
	clear(s.pending)
	clear(s.changes)
	s.held = nil
	s.onHeld(SourceSpread, 0)
	return keys, true
}

// The record Lease's annotations of a Spread's hold, which podjanitor
// writes: its ID, its pods, and the namespaces whose changes are in it.
const (
	AnnotationHeldSpread           = "podjanitor.io/held-spread"
	AnnotationHeldSpreadPods       = "podjanitor.io/held-spread-pods"
	AnnotationHeldSpreadNamespaces = "podjanitor.io/held-spread-namespaces"
)

// maxSpreadNamespaces is the most bytes of namespace names recorded.
const maxSpreadNamespaces = 4 << 10

// PublishSpread records the Spread's hold h (nil: none) and the namespaces
// whose changes are in it on the Lease, and takes off an approval of used
// ("" for none): an approval is used once.
func (r Record) PublishSpread(ctx context.Context, h *Hold, namespaces []string, used string) error {
	return r.update(ctx, func(l *coordinationv1.Lease) bool {
		changed := false
		if a, ok := l.Annotations[AnnotationApprove]; ok && used != "" && a == used {
			delete(l.Annotations, AnnotationApprove)
			changed = true
		}
		want := map[string]string{}
		if h != nil {
			want[AnnotationHeldSpread] = h.ID
			want[AnnotationHeldSpreadPods] = strconv.Itoa(h.Pods)
			want[AnnotationHeldSpreadNamespaces] = SpreadNamespaces(namespaces)
		}
		return setAnnotations(l, want, AnnotationHeldSpread, AnnotationHeldSpreadPods, AnnotationHeldSpreadNamespaces) || changed
	})
}

// SpreadNamespaces lists namespaces, comma-separated, cut after
// maxSpreadNamespaces bytes ("…, and N more").
func SpreadNamespaces(namespaces []string) string {
	var b strings.Builder
	for i, ns := range namespaces {
		if b.Len()+len(ns) > maxSpreadNamespaces {
			fmt.Fprintf(&b, ", and %d more", len(namespaces)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(ns)
	}
	return b.String()
}
