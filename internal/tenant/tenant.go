// Package tenant keeps what the controller knows of tenant policies (the
// namespaced PodLifetimePolicy resources): the usable ones by namespace
// (Store), which of a namespace's may be used (Limits), what the informer
// keeps of each (Transform), which pods each gives a deadline (Tracker),
// the writes of their status, at most one per policy and interval
// (StatusWriter), and their reads from the API server before a removal
// (Reader).
package tenant

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/podjanitor/podjanitor/policy"
)

// Store holds the usable tenant policies by namespace, each namespace's by
// name. It is a policy.Tenants, safe for concurrent use.
type Store struct {
	mu          sync.RWMutex
	byNamespace map[string][]*policy.TenantPolicy
}

func NewStore() *Store { return &Store{byNamespace: map[string][]*policy.TenantPolicy{}} }

// For returns the namespace's policies by name; the slice is not to be modified.
func (s *Store) For(namespace string) []*policy.TenantPolicy {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byNamespace[namespace]
}

// Set adds p, or replaces the policy of its namespace and name.
func (s *Store) Set(p *policy.TenantPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := slices.DeleteFunc(slices.Clone(s.byNamespace[p.Namespace]), func(q *policy.TenantPolicy) bool { return q.Name == p.Name })
	list = append(list, p)
	slices.SortFunc(list, func(a, b *policy.TenantPolicy) int { return strings.Compare(a.Name, b.Name) })
	s.byNamespace[p.Namespace] = list
}

// Delete drops the policy of namespace and name, if any.
func (s *Store) Delete(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := slices.DeleteFunc(slices.Clone(s.byNamespace[namespace]), func(q *policy.TenantPolicy) bool { return q.Name == name })
	if len(list) == 0 {
		delete(s.byNamespace, namespace)
		return
	}
	s.byNamespace[namespace] = list
}

// Tracker knows which pods each tenant policy currently gives a deadline,
// for their status: how many, and the next deadline. It calls changed with
// the policy's key ("<namespace>/<name>") when either may have changed.
type Tracker struct {
	changed func(policyKey string)

	mu    sync.Mutex
	byPod map[string]string               // pod key → policy key
	pods  map[string]map[string]time.Time // policy key → pod key → deadline
	// expected are the pods to be decided before expectedDone is closed (Expect).
	expected     map[string]bool
	expectedDone chan struct{}
}

// Expect returns a channel closed once each of podKeys has been decided
// (Observe or Forget) after the call: at start, the pods of the
// namespaces with tenant policies, so that the first status written has
// the real figures.
func (t *Tracker) Expect(podKeys []string) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	done := make(chan struct{})
	t.expected, t.expectedDone = map[string]bool{}, done
	for _, k := range podKeys {
		t.expected[k] = true
	}
	t.decidedLocked("")
	return done
}

// decidedLocked notes that the pod was decided; t.mu is held.
func (t *Tracker) decidedLocked(podKey string) {
	if t.expectedDone == nil {
		return
	}
	delete(t.expected, podKey)
	if len(t.expected) == 0 {
		close(t.expectedDone)
		t.expected, t.expectedDone = nil, nil
	}
}

func NewTracker(changed func(policyKey string)) *Tracker {
	if changed == nil {
		changed = func(string) {}
	}
	return &Tracker{changed: changed, byPod: map[string]string{}, pods: map[string]map[string]time.Time{}}
}

// Observe records the decision of the pod with key podKey: a deadline of a
// tenant policy (d.Policy), or none of any.
func (t *Tracker) Observe(podKey string, d policy.Decision) {
	if d.Policy == "" || !d.HasDeadline() {
		t.Forget(podKey)
		return
	}
	t.mu.Lock()
	t.decidedLocked(podKey)
	old, had := t.byPod[podKey]
	var changed []string
	if had && old != d.Policy {
		changed = append(changed, t.drop(podKey, old))
	}
	pods := t.pods[d.Policy]
	if pods == nil {
		pods = map[string]time.Time{}
		t.pods[d.Policy] = pods
	}
	if prev, ok := pods[podKey]; !ok || !prev.Equal(d.Deadline) {
		pods[podKey] = d.Deadline
		changed = append(changed, d.Policy)
	}
	t.byPod[podKey] = d.Policy
	t.mu.Unlock()
	for _, key := range changed {
		t.changed(key)
	}
}

// Forget records that the pod has no deadline of a tenant policy (or is gone).
func (t *Tracker) Forget(podKey string) {
	t.mu.Lock()
	t.decidedLocked(podKey)
	old, had := t.byPod[podKey]
	if had {
		t.drop(podKey, old)
	}
	t.mu.Unlock()
	if had {
		t.changed(old)
	}
}

// drop removes the pod from policyKey's pods; t.mu is held.
func (t *Tracker) drop(podKey, policyKey string) string {
	delete(t.byPod, podKey)
	if pods := t.pods[policyKey]; pods != nil {
		delete(pods, podKey)
		if len(pods) == 0 {
			delete(t.pods, policyKey)
		}
	}
	return policyKey
}

// Summary is how many pods the policy gives a deadline and the earliest of
// those deadlines (zero when none).
func (t *Tracker) Summary(policyKey string) (pods int, next time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, deadline := range t.pods[policyKey] {
		if next.IsZero() || deadline.Before(next) {
			next = deadline
		}
	}
	return len(t.pods[policyKey]), next
}
