package tenantcontroller

// The holds of tenant policies' changes (--hold-waves): what a change is
// measured with, its hold resumed at a start, its approval.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/wave"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/policy"
)

// ActedOn reports whether p's status says a podjanitor acted on its
// current generation: its Ready condition observed it, and it was used
// (True) or its change held (RemovalsHeld with the held change recorded in
// status.heldChange, resumed by resumeTenantWave; a RemovalsHeld written
// without it, by a podjanitor before heldChange, is measured again).
// A policy its status says was not used (over the namespace's limits,
// refused by a restriction) that a start with other limits or restrictions
// uses is so measured as a creation, like one never seen.
func ActedOn(p *v1alpha1.PodLifetimePolicy) bool {
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
	if c == nil || c.ObservedGeneration != p.Generation {
		return false
	}
	_, held := HeldInStatus(p)
	return c.Status == metav1.ConditionTrue || held
}

// actedOnEarlier reports whether p's status says a podjanitor acted on an
// earlier generation of it than its current one (changed since, while none
// ran): its rules then are not known.
func actedOnEarlier(p *v1alpha1.PodLifetimePolicy) bool {
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
	return c != nil && c.ObservedGeneration < p.Generation && (c.Status == metav1.ConditionTrue || c.Reason == wave.ReasonRemovalsHeld)
}

// resumeTenantWave holds p's change again after a restart (or in a replica
// that starts): its status, written by the leader, says that this
// generation's change is held (RemovalsHeld, with the change's ID) and p
// carries no approval of it, until the change is approved (its recorded
// ID), changed again or deleted. What was acted on before it: for p's
// first generation (its creation), the namespace's policies without p;
// for a later one, p's earlier rules, which are not known any more, so
// nothing but the pods' own annotations: a pod of the namespace that a
// rule (p's, another policy's, the cluster's) makes due is held, as p's
// earlier rules may have kept it, and goes by its own deadline only.
// c.mu is held.
func (c *Controller) resumeTenantWave(p *v1alpha1.PodLifetimePolicy) {
	h, ok := HeldInStatus(p)
	if !ok || p.Annotations[wave.AnnotationApprove] == h.ID {
		return
	}
	cur := c.store.For(p.Namespace)
	without := slices.DeleteFunc(slices.Clone(cur), func(q *policy.TenantPolicy) bool { return q.Name == p.Name })
	beforeJSON, before := tenantsJSON(p.Namespace, without), c.tenantDecider(p.Namespace, without)
	if held, _, ok := c.holds.Held(p.Namespace); p.Generation > 1 || ok && held.ID == h.ID {
		// Its earlier rules are not known, or another policy of the same
		// held change was taken up first: what was acted on before the
		// change is not known, so nothing but the pods' own annotations.
		beforeJSON, before = nil, c.annotationsDecider(p.Namespace)
	}
	c.holds.Resume(p.Namespace, p.Namespace+"/"+p.Name, h,
		beforeJSON, before,
		tenantsJSON(p.Namespace, cur), c.tenantDecider(p.Namespace, cur))
	klog.Background().Info("Holding the removals of a tenant policy's change again: its status says it is held and not approved",
		"policy", klog.KObj(p), "change", h.ID, "pods", h.Pods, "approve", ApproveCommand(p.Namespace, p.Name, h.ID))
}

// HeldInStatus reads the held change of p's current generation from its
// status (heldChange, with a Ready condition RemovalsHeld of that
// generation), as the leader wrote it.
func HeldInStatus(p *v1alpha1.PodLifetimePolicy) (wave.Hold, bool) {
	cond := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
	h := p.Status.HeldChange
	if cond == nil || cond.Reason != wave.ReasonRemovalsHeld || cond.ObservedGeneration != p.Generation || h == nil || h.ID == "" {
		return wave.Hold{}, false
	}
	return wave.Hold{ID: h.ID, Pods: int(h.Pods)}, true
}

// tenantWaveApproved takes the approval annotation of p, if it names the
// held change of p's namespace that p made: the held pods are decided again,
// and go at the removal cap.
func (c *Controller) tenantWaveApproved(p *v1alpha1.PodLifetimePolicy) {
	if c.holds == nil {
		return
	}
	key := p.Namespace + "/" + p.Name
	id := p.Annotations[wave.AnnotationApprove]
	_, object, held := c.holds.Held(p.Namespace)
	if !held || !c.inHeldChange(p) {
		return
	}
	keys, ok := c.holds.Approve(p.Namespace, object, id)
	if !ok {
		return
	}
	klog.Background().Info("Tenant policy's wave approved, removing its pods at the removal rate", "policy", key, "change", id, "pods", len(keys))
	c.setUsedApproval(key, usedApproval{id: id, pods: len(keys)})
	c.status.Mark(key)
	for _, k := range keys {
		if name, err := cache.ParseObjectName(k); err == nil {
			c.cfg.Requeue(name)
		}
	}
}

// ApproveCommand is the one command that approves the held change id
// of a tenant policy: an annotation on the policy itself, which the
// namespace's owners may write.
func ApproveCommand(namespace, name, id string) string {
	return fmt.Sprintf("kubectl annotate podlifetimepolicy -n %s %s --overwrite %s=%s", namespace, name, wave.AnnotationApprove, id)
}

// tenantDecider decides pods as the running evaluator does, with list for
// the tenant policies of namespace (the others as they are), for a wave.
func (c *Controller) tenantDecider(namespace string, list []*policy.TenantPolicy) wave.Decide {
	over := tenantOverlay{namespace: namespace, list: list, rest: c.store}
	return func(pod *corev1.Pod, now time.Time) (policy.Decision, error) {
		e := *c.cfg.Evaluator()
		e.Tenants = over
		return e.Decide(pod, c.cfg.NamespaceInfo(pod.Namespace), now)
	}
}

// annotationsDecider decides the pods of namespace by their own
// annotations alone: no rule, the cluster's or a tenant policy's, gives a
// deadline.
func (c *Controller) annotationsDecider(namespace string) wave.Decide {
	return func(pod *corev1.Pod, now time.Time) (policy.Decision, error) {
		e := *c.cfg.Evaluator()
		e.Policy, e.Tenants = nil, nil
		return e.Decide(pod, c.cfg.NamespaceInfo(namespace), now)
	}
}

// Overlay is rest with list for the policies of namespace.
func Overlay(namespace string, list []*policy.TenantPolicy, rest policy.Tenants) policy.Tenants {
	return tenantOverlay{namespace: namespace, list: list, rest: rest}
}

// tenantOverlay is rest with list for the policies of namespace.
type tenantOverlay struct {
	namespace string
	list      []*policy.TenantPolicy
	rest      policy.Tenants
}

func (o tenantOverlay) For(namespace string) []*policy.TenantPolicy {
	if namespace == o.namespace {
		return o.list
	}
	return o.rest.For(namespace)
}

// tenantsJSON names the tenant policies of a namespace in a change ID: the
// namespace, and each policy's name and rules.
func tenantsJSON(namespace string, list []*policy.TenantPolicy) []byte {
	type entry struct {
		Name  string         `json:"name"`
		Rules *policy.Policy `json:"rules"`
	}
	entries := make([]entry, len(list))
	for i, p := range list {
		entries[i] = entry{Name: p.Name, Rules: p.Policy}
	}
	b, err := json.Marshal(map[string]any{"namespace": namespace, "policies": entries})
	if err != nil {
		return []byte(namespace)
	}
	return b
}

// tenantHeld returns the held change of p's namespace, if p is part of it.
func (c *Controller) tenantHeld(p *v1alpha1.PodLifetimePolicy) (wave.Hold, bool) {
	if c.holds == nil {
		return wave.Hold{}, false
	}
	h, _, ok := c.holds.Held(p.Namespace)
	return h, ok && c.inHeldChange(p)
}

// inHeldChange reports whether p is part of the held change of its
// namespace: its rules as used now differ from those acted on before the
// change (created, changed or being deleted since). Every policy of the
// change shows the hold, and an approval on any of them approves it.
func (c *Controller) inHeldChange(p *v1alpha1.PodLifetimePolicy) bool {
	before, ok := c.holds.Before(p.Namespace, c.cfg.Now())
	if !ok {
		return false
	}
	c.mu.Lock()
	now := tenantsJSON(p.Namespace, c.store.For(p.Namespace))
	c.mu.Unlock()
	return !bytes.Equal(tenantRules(before, p.Name), tenantRules(now, p.Name))
}

// tenantRules is the rules of the policy name in b (tenantsJSON), as JSON;
// nil when b has no such policy.
func tenantRules(b []byte, name string) []byte {
	var list struct {
		Policies []struct {
			Name  string          `json:"name"`
			Rules json.RawMessage `json:"rules"`
		} `json:"policies"`
	}
	if json.Unmarshal(b, &list) != nil {
		return nil
	}
	for _, p := range list.Policies {
		if p.Name == name {
			return p.Rules
		}
	}
	return nil
}

// MarkNamespaces has the status of every policy of namespaces written again,
// if it changed: a hold of many namespaces' changes together started or
// ended.
func (c *Controller) MarkNamespaces(namespaces []string) {
	var keys []string
	c.mu.Lock()
	for _, ns := range slices.Compact(slices.Sorted(slices.Values(namespaces))) {
		for name := range c.seen[ns] {
			keys = append(keys, ns+"/"+name)
		}
	}
	c.mu.Unlock()
	for _, key := range keys {
		c.status.Mark(key)
	}
}

// heldChange is the status.heldChange of p, part of the held change h.
func heldChange(p *v1alpha1.PodLifetimePolicy, h wave.Hold, now time.Time) *v1alpha1.HeldChange {
	since := metav1.NewTime(now.UTC().Truncate(time.Second))
	if was := p.Status.HeldChange; was != nil && was.ID == h.ID && was.Since != nil {
		since = *was.Since // the same change, held since then (a restart, a new leader)
	}
	return &v1alpha1.HeldChange{ID: h.ID, Pods: int32(h.Pods), Since: &since, Approve: ApproveCommand(p.Namespace, p.Name, h.ID)}
}

// HeldMessage is the Ready condition's message of a policy whose
// change is held.
func HeldMessage(p *v1alpha1.PodLifetimePolicy, h wave.Hold) string {
	if p.DeletionTimestamp != nil {
		return fmt.Sprintf("change %s holds %d pod removal(s): the policy's deletion makes them due at once in namespace %s; podjanitor removes none of them, and the policy stays (finalizer %s), until the deletion is approved (%s)",
			h.ID, h.Pods, p.Namespace, tenant.FinalizerPrefix+"…", ApproveCommand(p.Namespace, p.Name, h.ID))
	}
	return fmt.Sprintf("change %s holds %d pod removal(s): it makes them due at once in namespace %s; podjanitor removes none of them until it is approved (%s) or reverted",
		h.ID, h.Pods, p.Namespace, ApproveCommand(p.Namespace, p.Name, h.ID))
}
