package tenantcontroller

// The status and finalizer of tenant policies, written at a bounded rate
// (tenant.StatusWriter), and the approvals taken off once used.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/wave"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/policy"
)

// PolicyRef is the reference of p's Events.
func PolicyRef(p *v1alpha1.PodLifetimePolicy) *corev1.ObjectReference {
	return &corev1.ObjectReference{
		APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: policy.TenantKind,
		// No resourceVersion: the events library merges the Warnings of one
		// policy into a series only when their references are equal.
		Namespace: p.Namespace, Name: p.Name, UID: p.UID,
	}
}

// Status is the status the policy should have now, given what the
// controller made of it and the pods it gives a deadline.
func (c *Controller) Status(p *v1alpha1.PodLifetimePolicy, seen Seen) v1alpha1.PodLifetimePolicyStatus {
	status := *p.Status.DeepCopy()
	status.ObservedGeneration = seen.Generation
	status.HeldChange = nil
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, ObservedGeneration: seen.Generation, Status: metav1.ConditionFalse}
	h, held := c.tenantHeld(p)
	spread, object, spreadHeld := c.holds.SpreadHeld(p.Namespace, c.cfg.Now())
	switch {
	case held && (seen.Err == nil || seen.deleting()):
		cond.Reason, cond.Message = wave.ReasonRemovalsHeld, HeldMessage(p, h)
		status.HeldChange = heldChange(p, h, c.cfg.Now())
	case seen.Err != nil:
		cond.Reason, cond.Message = seen.Err.Reason, events.CutNote(seen.Err.Message)
	case spreadHeld && object == p.Namespace+"/"+p.Name:
		// Not acted on yet: a restart measures the policy again, and
		// holds it with the other namespaces' changes again.
		cond.Reason = wave.ReasonRemovalsHeldAcrossNamespaces
		cond.Message = fmt.Sprintf("change %s holds %d pod removal(s) in all: this change, made with the changes of other namespaces, makes them due at once; podjanitor removes none of them until a cluster admin approves it on its Lease (%s) or the changes are reverted",
			spread.ID, spread.Pods, c.cfg.Waves.Record.ApproveCommand(spread.ID))
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, InUseReason
		cond.Message = fmt.Sprintf("podjanitor uses the %d rule(s) for the pods of namespace %s", seen.Rules, p.Namespace)
	}
	status.PodsWithDeadline, status.NextDeadline = 0, nil
	if n, next := c.tracker.Summary(p.Namespace + "/" + p.Name); seen.Err == nil {
		status.PodsWithDeadline = int32(n)
		if !next.IsZero() {
			t := metav1.NewTime(next.UTC().Truncate(time.Second))
			status.NextDeadline = &t
		}
	}
	cond.LastTransitionTime = metav1.NewTime(c.cfg.Now())
	meta.SetStatusCondition(&status.Conditions, cond)
	return status
}

// WriteStatus writes the policy's status if it differs from the
// cached one (the tenant.StatusWriter calls it, at a bounded rate).
func (c *Controller) WriteStatus(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	p, err := c.lister.PodLifetimePolicies(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	seen, ok := c.Policy(key)
	if !ok || seen.UID != p.UID {
		return nil // not taken yet: its namespace's pass marks it
	}
	if seen.Generation != p.Generation || seen.deleting() != (p.DeletionTimestamp != nil) {
		// The cache has a generation, or a deletion, that the namespace's
		// pass has not taken yet (it may hold it): written when the pass
		// marks it, so that the finalizer comes off only once the deletion
		// has been measured.
		return tenant.ErrNotYet
	}
	wantFinalizer := c.wantTenantFinalizer(p, seen)
	if p.DeletionTimestamp != nil && c.hasFinalizer(p) && !wantFinalizer {
		// Its deletion is measured and not held (or approved): let it go.
		return c.setTenantFinalizer(ctx, p, false)
	}
	if err := c.patchTenantStatus(ctx, p, seen); err != nil {
		return err
	}
	if wantFinalizer != c.hasFinalizer(p) {
		if err := c.setTenantFinalizer(ctx, p, wantFinalizer); err != nil {
			return err
		}
	}
	return c.takeOffUsedApproval(ctx, p)
}

// setUsedApproval notes an approval taken of the policy of key.
func (c *Controller) setUsedApproval(key string, used usedApproval) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.usedApprovals == nil {
		c.usedApprovals = map[string]usedApproval{}
	}
	c.usedApprovals[key] = used
}

// usedApproval is an approval taken: the change's ID and the pods it held.
type usedApproval struct {
	id   string
	pods int
	// stale: on the policy before its change was held (an earlier
	// occurrence's), taken off unused.
	stale bool
}

// takeOffUsedApproval takes an approval that was used (tenantWaveApproved)
// off the policy: the same change made again later (reverted and applied
// again) is measured again and needs an approval of its own. A JSON patch
// that tests the value first, so that an approval written since stays.
func (c *Controller) takeOffUsedApproval(ctx context.Context, p *v1alpha1.PodLifetimePolicy) error {
	key := p.Namespace + "/" + p.Name
	c.mu.Lock()
	used, ok := c.usedApprovals[key]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	id := used.id
	// The policy as cached now, not as this write read it before: the
	// approval was taken (tenantWaveApproved) after the cache had it, so
	// a read made before that may not show it yet.
	p, err := c.lister.PodLifetimePolicies(p.Namespace).Get(p.Name)
	if apierrors.IsNotFound(err) {
		p = nil
	} else if err != nil {
		return err
	}
	done := func() {
		c.mu.Lock()
		if c.usedApprovals[key] == used {
			delete(c.usedApprovals, key)
		}
		c.mu.Unlock()
	}
	if p == nil || p.Annotations[wave.AnnotationApprove] != id {
		done() // gone, or the approval taken off or replaced already
		return nil
	}
	path := "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(wave.AnnotationApprove, "~", "~0"), "/", "~1")
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": id},
		{"op": "remove", "path": path},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.WriteTimeout)
	defer cancel()
	_, err = c.cfg.Client.PodjanitorV1alpha1().PodLifetimePolicies(p.Namespace).Patch(ctx, p.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if err == nil && !used.stale {
		// The leader's Event (the status writer's), not every replica's.
		c.cfg.Reporter.RemovalsApproved(PolicyRef(p), id, used.pods)
	}
	switch {
	case err == nil, apierrors.IsNotFound(err), apierrors.IsInvalid(err):
		// Taken off, gone, or the test failed: the approval is not the one used.
		done()
		return nil
	case apierrors.IsForbidden(err):
		done() // RBAC older than this version: the approval stays (docs/policy.md)
		klog.FromContext(ctx).Error(err, "podjanitor may not patch PodLifetimePolicies (RBAC: patch on podlifetimepolicies): a used approval stays on the policy", "policy", key, "change", id)
		return nil
	}
	return fmt.Errorf("taking the used approval %s off %s: %w", id, key, err)
}

// patchTenantStatus writes the policy's status if it differs from the
// cached one, and warns of what changed.
func (c *Controller) patchTenantStatus(ctx context.Context, p *v1alpha1.PodLifetimePolicy, seen Seen) error {
	status := c.Status(p, seen)
	if apiequality.Semantic.DeepEqual(status, p.Status) {
		return nil
	}
	// A merge patch of the status subresource, without resourceVersion: a
	// tenant writing the policy's metadata cannot make it conflict. Every
	// field is named, null clearing nextDeadline and heldChange.
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"observedGeneration": status.ObservedGeneration, "conditions": status.Conditions,
		"podsWithDeadline": status.PodsWithDeadline, "nextDeadline": status.NextDeadline,
		"heldChange": status.HeldChange,
	}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.WriteTimeout)
	defer cancel()
	_, err = c.cfg.Client.PodjanitorV1alpha1().PodLifetimePolicies(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	// One Warning per new reason or message, by the writer of the status
	// (the leader), not by every replica's informer.
	was := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
	deleting := seen.deleting()
	if h, held := c.tenantHeld(p); held && (seen.Err == nil || deleting) {
		if msg := HeldMessage(p, h); was == nil || was.Reason != wave.ReasonRemovalsHeld || was.Message != msg {
			what := "this change of the PodLifetimePolicy"
			if deleting {
				what = "the deletion of the PodLifetimePolicy (the policy stays until it is approved)"
			}
			c.cfg.Reporter.RemovalsHeld(PolicyRef(p), what, h.Pods, ApproveCommand(p.Namespace, p.Name, h.ID))
		}
	}
	if seen.Err != nil && !deleting && (was == nil || was.Status != metav1.ConditionFalse || was.Reason != seen.Err.Reason || was.Message != events.CutNote(seen.Err.Message)) {
		c.cfg.Reporter.TenantPolicyNotUsed(PolicyRef(p), seen.Err.Reason, seen.Err.Message)
	}
	return nil
}

// wantTenantFinalizer says whether the policy should carry podjanitor's
// finalizer, so that its deletion is measured (--hold-waves) before it
// goes: a policy in use whose deletion could be held (mayHoldDeletion) gets
// it (not in a dry run, nor once the API server refused it) and keeps it
// while not being deleted; one being deleted keeps it while its deletion is
// held, in a namespace not being deleted itself.
func (c *Controller) wantTenantFinalizer(p *v1alpha1.PodLifetimePolicy, seen Seen) bool {
	switch {
	case c.holds == nil:
		return false
	case p.DeletionTimestamp != nil:
		_, held := c.tenantHeld(p)
		return held && c.hasFinalizer(p) && !podcache.NamespaceTerminating(c.cfg.Namespaces, p.Namespace)
	}
	return c.hasFinalizer(p) || seen.Err == nil && !c.cfg.DryRun && !c.finalizerRefused.Load() && c.mayHoldDeletion(p)
}

// mayHoldDeletion reports whether the policy's deletion could be held: its
// wave is at most the pods it gives a deadline now, and a wave of no more
// than the threshold's floor is never held. A policy of a few pods gets no
// finalizer: its deletion (its namespace's) never waits for podjanitor.
func (c *Controller) mayHoldDeletion(p *v1alpha1.PodLifetimePolicy) bool {
	n, _ := c.tracker.Summary(p.Namespace + "/" + p.Name)
	return n > c.cfg.Waves.Threshold.Floor()
}

// setTenantFinalizer puts podjanitor's finalizer on the policy or takes it
// off, on the policy as read now: a merge patch of metadata.finalizers
// alone, with the resourceVersion read as its precondition, so that another
// finalizer's change in between fails the patch (409: the writer tries
// again) rather than being lost. No finalizer is put on a policy being
// deleted (the API server refuses that).
func (c *Controller) setTenantFinalizer(ctx context.Context, p *v1alpha1.PodLifetimePolicy, want bool) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.WriteTimeout)
	defer cancel()
	policies := c.cfg.Client.PodjanitorV1alpha1().PodLifetimePolicies(p.Namespace)
	got, err := policies.Get(ctx, p.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	case got.UID != p.UID:
		return nil // replaced: the new one's events mark it
	}
	finalizer := c.finalizer
	finalizers := slices.DeleteFunc(slices.Clone(got.Finalizers), func(f string) bool { return f == finalizer })
	if want && got.DeletionTimestamp == nil {
		finalizers = append(finalizers, finalizer)
	}
	if slices.Equal(finalizers, got.Finalizers) {
		return nil
	}
	// The resourceVersion read is the patch's precondition (a conflict
	// otherwise): the list replaced is the one read.
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"finalizers": finalizers, "resourceVersion": got.ResourceVersion,
	}})
	if err != nil {
		return err
	}
	_, err = policies.Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsForbidden(err) && want:
		// RBAC older than this version (patch on podlifetimepolicies is
		// new): no policy gets the finalizer, and their deletions are not
		// held, rather than one refused write per policy every interval.
		if c.finalizerRefused.CompareAndSwap(false, true) {
			klog.FromContext(ctx).Error(err, "podjanitor may not patch PodLifetimePolicies (RBAC: patch on podlifetimepolicies): it puts its finalizer on none, and their deletions are not held", "finalizer", finalizer)
		}
		return nil
	case err != nil:
		return fmt.Errorf("setting the finalizer %s on %s/%s: %w", finalizer, p.Namespace, p.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Tenant policy's finalizer set", "policy", klog.KObj(p), "finalizer", finalizer, "on", want && got.DeletionTimestamp == nil)
	return nil
}

// hasFinalizer reports whether p has this podjanitor's finalizer.
func (c *Controller) hasFinalizer(p *v1alpha1.PodLifetimePolicy) bool {
	return tenant.HasFinalizer(p, c.finalizer)
}
