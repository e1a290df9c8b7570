// Package budgets keeps the evictions of pods under one PodDisruptionBudget
// from running into each other at the API server.
//
// Every eviction of a pod that a budget covers writes that budget's status
// (EvictionREST.checkAndDecrement in k8s.io/kubernetes
// pkg/registry/core/pod/storage/eviction.go). Two at once conflict, and the
// API server retries the loser after 500 ms (EvictionsRetry), up to 20 times:
// with many workers evicting one workload's pods, most evictions wait there,
// and a backlog drains at a fraction of the removal cap. A Gate lets at most
// n evictions per budget be in flight; the others wait for their turn in
// podjanitor, where waiting costs nothing.
//
// The Gate is an optimisation, never a safety: the API server enforces the
// budgets. A budget the cache does not have yet (not synced, no RBAC to list
// them) only means that evictions are not spaced for it.
package budgets

import (
	"context"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
)

// Covering returns the keys ("namespace/name") of the budgets among pdbs that
// cover pod, sorted, as the eviction API finds them: in the pod's namespace,
// with a selector that parses, is not empty and matches the pod's labels (the
// API server treats a nil or empty selector as matching nothing).
func Covering(pdbs []*policyv1.PodDisruptionBudget, pod *corev1.Pod) []string {
	var keys []string
	for _, pdb := range pdbs {
		if pdb.Namespace != pod.Namespace {
			continue
		}
		selector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || selector.Empty() || !selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		keys = append(keys, pdb.Namespace+"/"+pdb.Name)
	}
	slices.Sort(keys)
	return keys
}

// Gate admits at most perBudget evictions at a time under each budget. A nil
// Gate admits everything.
type Gate struct {
	budgets   cache.Indexer // PodDisruptionBudgets, with cache.NamespaceIndex
	perBudget int

	mu    sync.Mutex
	slots map[string]*slot
}

// slot is one budget's semaphore, kept while anyone holds or waits for it.
type slot struct {
	sem   chan struct{}
	users int
}

// NewGate admits perBudget (at least 1) evictions at a time under each of
// the budgets in the indexer (a PodDisruptionBudget informer's, with the
// namespace index).
func NewGate(budgets cache.Indexer, perBudget int) *Gate {
	return &Gate{budgets: budgets, perBudget: max(perBudget, 1), slots: map[string]*slot{}}
}

// Transform keeps of a PodDisruptionBudget what Covering reads: its name,
// namespace and selector.
func Transform(obj interface{}) (interface{}, error) {
	pdb, ok := obj.(*policyv1.PodDisruptionBudget)
	if !ok {
		return obj, nil // a tombstone
	}
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: pdb.Name, Namespace: pdb.Namespace, UID: pdb.UID, ResourceVersion: pdb.ResourceVersion},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: pdb.Spec.Selector},
	}, nil
}

// Acquire waits until the pod may be evicted: a turn under every budget that
// covers it, taken in key order so that two pods under the same two budgets
// cannot each hold one. release gives them back; it is never nil. The error
// is the context's, when it ends first (nothing is then held).
func (g *Gate) Acquire(ctx context.Context, pod *corev1.Pod) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	objs, err := g.budgets.ByIndex(cache.NamespaceIndex, pod.Namespace)
	if err != nil || len(objs) == 0 {
		return func() {}, nil
	}
	pdbs := make([]*policyv1.PodDisruptionBudget, 0, len(objs))
	for _, o := range objs {
		if pdb, ok := o.(*policyv1.PodDisruptionBudget); ok {
			pdbs = append(pdbs, pdb)
		}
	}
	keys := Covering(pdbs, pod)
	held := make([]string, 0, len(keys))
	release = func() {
		for _, k := range held {
			g.leave(k)
		}
	}
	for _, k := range keys {
		if err := g.enter(ctx, k); err != nil {
			release()
			return func() {}, err
		}
		held = append(held, k)
	}
	return release, nil
}

// Waiting says how many evictions wait for a turn now, for the metrics.
func (g *Gate) Waiting() int {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, s := range g.slots {
		n += max(s.users-len(s.sem), 0)
	}
	return n
}

func (g *Gate) enter(ctx context.Context, key string) error {
	g.mu.Lock()
	s := g.slots[key]
	if s == nil {
		s = &slot{sem: make(chan struct{}, g.perBudget)}
		g.slots[key] = s
	}
	s.users++
	g.mu.Unlock()
	select {
	case s.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		g.drop(key, s)
		return ctx.Err()
	}
}

func (g *Gate) leave(key string) {
	g.mu.Lock()
	s := g.slots[key]
	g.mu.Unlock()
	<-s.sem
	g.drop(key, s)
}

// drop forgets one user of the slot, and the slot with its last one.
func (g *Gate) drop(key string, s *slot) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s.users--; s.users == 0 {
		delete(g.slots, key)
	}
}
