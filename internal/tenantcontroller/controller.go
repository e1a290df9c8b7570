// Package tenantcontroller is podjanitor's PodLifetimePolicy controller:
// the resources in which namespace owners write rules for the pods of their
// namespace (--tenant-policies), their admission under the limits, the
// holds of their changes, their status and finalizer writes.
package tenantcontroller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/metrics"
	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/internal/served"
	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/wave"
	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned"
	listers "github.com/podjanitor/podjanitor/pkg/generated/listers/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/policy"
)

// Ready condition reasons besides policy.TenantReason*.
const (
	InUseReason = "RulesInUse"
	// DeletingReason: the policy has a deletion timestamp (a
	// finalizer holds it): it gives no deadline, and no Warning says so.
	DeletingReason = "Deleting"
)

// Config is what the controller is given. Every field but DryRun, Waves
// and StatusInterval is required.
type Config struct {
	// Informer is a PodLifetimePolicy informer of the namespaces watched
	// (tenant.Transform); Client writes their status and finalizer.
	Informer cache.SharedIndexInformer
	Client   versioned.Interface
	// Restrictions are what tenants' rules may not do.
	Restrictions policy.Restrictions
	// StatusInterval is the least time between two status writes of a
	// policy.
	StatusInterval time.Duration
	// Pods is the pod cache with its namespace index; Namespaces the
	// namespace cache (podcache.NamespaceTransform), for a namespace's
	// deletion; NamespaceInfo what decisions read of a namespace (its
	// change measured: the namespace controller's Info).
	Pods, Namespaces cache.Indexer
	NamespaceInfo    func(name string) *policy.Namespace
	// Evaluator is the evaluator of the cluster's rules acted on, for a
	// wave's decisions (the running one, but while a change of them is
	// held).
	Evaluator func() *policy.Evaluator
	// Now is the API server's time as the process estimates it.
	Now          func() time.Time
	Clock        clock.WithTicker
	WriteTimeout time.Duration
	// Waves holds a change whose wave is too large; nil holds nothing.
	Waves *wave.Options
	// DryRun: no finalizer is put on a policy.
	DryRun   bool
	Reporter *events.Reporter
	Metrics  *metrics.Metrics
	// Redecide decides a namespace's pods again (coalesced by the caller,
	// which calls ApplyPending at the namespace's pass).
	Redecide func(namespace string)
	// Requeue decides a pod again now: its policies changed, or a held
	// change was approved.
	Requeue func(key cache.ObjectName)
}

// Controller is the PodLifetimePolicy controller: it converts each policy
// into a policy.TenantPolicy when it changes, chooses which of a namespace's
// policies are used (the Limits), keeps those in a tenant.Store that the
// evaluator reads (Store), has the namespace's pods decided again, holds a
// change whose wave is too large (--hold-waves) until a person approves it
// on the policy, keeps a finalizer on the policies whose deletion could be
// held, and writes each policy's status at a bounded rate.
//
// The pod controller sees it through Store, Observe, Confirm, ApplyPending,
// Check and Forget; the controller reaches back only through its Config's
// callbacks.
type Controller struct {
	cfg    Config
	client versioned.Interface
	lister listers.PodLifetimePolicyLister
	// synced: the handler has taken the informer's initial list, so the
	// store holds every policy (the informer's own HasSynced says less).
	synced       cache.InformerSynced
	restrictions policy.Restrictions
	limits       tenant.Limits

	store   *tenant.Store
	tracker *tenant.Tracker
	status  *tenant.StatusWriter
	// holds are the held changes by namespace; nil without Config.Waves.
	holds *wave.Holds
	// finalizer is this podjanitor's on the policies it uses
	// (tenant.FinalizerFor its record Lease).
	finalizer string
	// finalizerRefused: the API server refused to put the finalizer on a
	// policy (RBAC): none gets it from then on.
	finalizerRefused atomic.Bool

	mu sync.Mutex
	// seen is what the controller made of each policy it read, by key.
	seen map[string]Seen
	// usedApprovals are the approvals taken (the change ID, by policy
	// key) that WriteStatus takes off their policy: an approval covers one
	// occurrence of its change.
	usedApprovals map[string]usedApproval
	// reader is confirm's reads from the API server.
	reader *tenant.Reader
	// converted is each policy's conversion, by namespace and name; the
	// namespace's Limits choose which of those converted are used.
	converted map[string]map[string]tenantConverted
	// notReady counts the policies seen and not used; overLimit those by
	// the limit they pass (the metrics, kept as seen changes).
	notReady  int
	overLimit map[string]int
	// pending are the changes of the store by namespace and policy name
	// (the last of each: a replica that does not lead, whose passes wait,
	// keeps one per policy) that wait for the namespace's coalesced pass to
	// be measured (--hold-waves) and made, and pendingBy the last policy
	// that made one: a storm of writes costs one measurement per pass, not
	// one per write.
	pending   map[string]map[string]tenantOp
	pendingBy map[string]*v1alpha1.PodLifetimePolicy
	// unknownBefore are the namespaces whose pending changes include a
	// policy changed while no podjanitor ran (acted on at an earlier
	// generation, whose rules are not known): measured against the pods'
	// own annotations alone.
	unknownBefore map[string]bool
}

// tenantConverted is the conversion of one generation of a policy: the
// policy (nil when it cannot be used, err says why), its rule count and
// the bytes of its rules.
type tenantConverted struct {
	uid          types.UID
	generation   int64
	policy       *policy.TenantPolicy
	err          *policy.TenantError
	rules, bytes int
}

// Seen is what the controller made of one generation of a policy: Err
// says why it is not used (nil: it is).
type Seen struct {
	UID        types.UID
	Generation int64
	Rules      int
	Err        *policy.TenantError
}

// Convert makes the policy.TenantPolicy of a resource under the
// restrictions: the checks of the loader the API server's validation agrees
// with (policy.ParseTenantRules is policy.ParseRules on typed rules), with
// the resource's strings shared, not copied.
func Convert(obj *v1alpha1.PodLifetimePolicy, r policy.Restrictions) (*policy.TenantPolicy, error) {
	parsed, err := policy.ParseTenantRules(tenant.RuleSpecs(obj))
	if err != nil {
		return nil, &policy.TenantError{Reason: policy.TenantReasonInvalid, Message: err.Error()}
	}
	return policy.NewTenantPolicy(obj.Namespace, obj.Name, parsed.Rules, r)
}

// New makes the controller of the tenant policies of cfg.Informer and
// registers its handler. Call it before the informer starts.
func New(ctx context.Context, cfg Config) (*Controller, error) {
	logger := klog.FromContext(ctx)
	c := &Controller{
		cfg:          cfg,
		client:       cfg.Client,
		lister:       listers.NewPodLifetimePolicyLister(cfg.Informer.GetIndexer()),
		restrictions: cfg.Restrictions,
		store:        tenant.NewStore(),
		seen:         map[string]Seen{},
		reader:       tenant.NewReader(cfg.Clock, cfg.WriteTimeout, readTenantPolicy(cfg.Client)),
		converted:    map[string]map[string]tenantConverted{},
		overLimit:    map[string]int{},
		pending:      map[string]map[string]tenantOp{},
		pendingBy:    map[string]*v1alpha1.PodLifetimePolicy{},
		finalizer:    tenant.FinalizerFor("podjanitor", "podjanitor"), // artifacts/deploy's Lease
	}
	c.status = tenant.NewStatusWriter(cfg.Clock, cfg.StatusInterval, func(ctx context.Context, key string) error {
		return c.WriteStatus(ctx, key)
	})
	c.tracker = tenant.NewTracker(c.status.Mark)
	if w := cfg.Waves; w != nil {
		c.holds = wave.NewHolds(wave.SourceTenant, w.Threshold, w.Window, cfg.Metrics.SetPodsHeld)
		if w.Spread != nil {
			c.holds.SetSpread(w.Spread)
		}
	}
	handler, err := cfg.Informer.AddEventHandlerWithOptions(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, isInInitialList bool) { c.PolicyChanged(obj, !isInInitialList) },
		UpdateFunc: func(old, cur interface{}) {
			o, ok1 := old.(*v1alpha1.PodLifetimePolicy)
			n, ok2 := cur.(*v1alpha1.PodLifetimePolicy)
			// Status writes (ours) change none of these: no work for them.
			if !ok1 || !ok2 || o.Generation != n.Generation || o.UID != n.UID || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) {
				c.PolicyChanged(cur, true)
				if ok1 && ok2 && o.DeletionTimestamp == nil && n.DeletionTimestamp != nil && c.hasFinalizer(n) {
					c.status.Release(n.Namespace + "/" + n.Name) // its deletion waits on the write
				}
			} else if o.Annotations[wave.AnnotationApprove] != n.Annotations[wave.AnnotationApprove] {
				c.tenantWaveApproved(n)
			} else if c.hasFinalizer(o) != c.hasFinalizer(n) {
				c.status.Mark(n.Namespace + "/" + n.Name) // put back on a policy in use
			}
		},
		DeleteFunc: c.PolicyDeleted,
	}, cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding tenant policy event handler: %w", err)
	}
	c.synced = handler.HasSynced
	return c, nil
}

// Store is the usable tenant policies by namespace: the evaluator's Tenants.
func (c *Controller) Store() *tenant.Store { return c.store }

// HasSynced reports whether the handler has taken the informer's initial
// list (at once while the API server does not serve the policies: AwaitAPI).
func (c *Controller) HasSynced() bool { return c.synced() }

// Observe tells the policies' status which policy, if any, gives the pod
// of podKey its deadline now.
func (c *Controller) Observe(podKey string, d policy.Decision) { c.tracker.Observe(podKey, d) }

// Holds are the held changes by namespace; nil without Config.Waves.
func (c *Controller) Holds() *wave.Holds { return c.holds }

// Expect returns a channel closed once the pods of podKeys (the cache's at
// the start, before any worker decides) in namespaces with a usable policy
// have been decided: the first status writes wait for it, so that they
// count those pods.
func (c *Controller) Expect(podKeys []string) <-chan struct{} {
	return c.tracker.Expect(c.podsOfPolicyNamespaces(podKeys))
}

// RunStatus writes the policies' status until ctx ends, the first writes
// once ready is closed (nil: at once).
func (c *Controller) RunStatus(ctx context.Context, ready <-chan struct{}) { c.status.Run(ctx, ready) }

// Policy is what the controller made of the policy of key, if it read it.
func (c *Controller) Policy(key string) (Seen, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.seen[key]
	return s, ok
}

// Pending is the number of changes of namespace's policies that wait for
// the namespace's pass.
func (c *Controller) Pending(namespace string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending[namespace])
}

// Summary is the number of pods the policy of key gives a deadline, and
// the first of those deadlines.
func (c *Controller) Summary(key string) (int, time.Time) { return c.tracker.Summary(key) }

// StatusPending is the number of policies whose status waits for a write.
func (c *Controller) StatusPending() int { return c.status.Len() }

// FinalizerRefused reports whether the API server refused the finalizer.
func (c *Controller) FinalizerRefused() bool { return c.finalizerRefused.Load() }

// Lister lists the policies of the informer's cache.
func (c *Controller) Lister() listers.PodLifetimePolicyLister { return c.lister }

// SetFinalizer names this podjanitor's finalizer on the policies it
// uses after its record Lease (tenant.FinalizerFor); call it after
// New, before Run. Unset, it is the default Lease's.
func (c *Controller) SetFinalizer(leaseNamespace, leaseName string) {
	c.finalizer = tenant.FinalizerFor(leaseNamespace, leaseName)
}

// SetLimits bounds what each namespace's usable policies hold; call
// it after New, before Run. The zero Limits bound nothing.
func (c *Controller) SetLimits(l tenant.Limits) { c.limits = l }

// PolicyChanged converts a created or changed policy, chooses again
// which of its namespace's policies are used (the Limits, by name), puts
// those in the store and takes the others out (those it cannot use or
// that are being deleted; WriteStatus warns about the former),
// and decides the namespace's pods again (not for the initial list: every
// pod is decided once the caches have synced).
func (c *Controller) PolicyChanged(obj interface{}, enqueue bool) {
	p, ok := obj.(*v1alpha1.PodLifetimePolicy)
	if !ok {
		utilruntime.HandleError(fmt.Errorf("tenant policy informer: unexpected %T", obj))
		return
	}
	key := p.Namespace + "/" + p.Name
	conv := c.convert(p, p.DeletionTimestamp != nil)
	// A policy the initial list finds being deleted and held by podjanitor's
	// finalizer: its deletion was not measured yet, or was held, when the
	// last leader stopped. The policy as it was before it is the one acted
	// on, and its deletion a change of the namespace measured at the
	// namespace's pass, as a live one is: a restart cannot let a held
	// deletion through.
	resume := !enqueue && c.holds != nil && p.DeletionTimestamp != nil && c.hasFinalizer(p)
	// A live policy the initial list finds with no status of its current
	// generation: created or changed while no podjanitor ran (or just
	// before the last leader stopped, its status not written yet). Nothing
	// says what was acted on before it: measured against the namespace
	// without it, as a creation, at the namespace's pass.
	unseen := !enqueue && c.holds != nil && p.DeletionTimestamp == nil && !ActedOn(p)
	c.reader.Forget(p.Namespace, p.Name)
	c.mu.Lock()
	if c.converted[p.Namespace] == nil {
		c.converted[p.Namespace] = map[string]tenantConverted{}
	}
	if resume {
		c.converted[p.Namespace][p.Name] = c.convert(p, false)
		_, before := c.admit(p.Namespace, key)
		c.apply(c.store, before)
	}
	c.converted[p.Namespace][p.Name] = conv
	changed, ops := c.admit(p.Namespace, key)
	if (enqueue || resume || unseen) && c.holds != nil {
		c.setPendingLocked(p, ops)
		if unseen && actedOnEarlier(p) {
			if c.unknownBefore == nil {
				c.unknownBefore = map[string]bool{}
			}
			c.unknownBefore[p.Namespace] = true
		}
	} else {
		c.apply(c.store, ops)
	}
	if !enqueue && c.holds != nil && c.seen[key].Err == nil {
		c.resumeTenantWave(p)
	}
	seen := c.seen[key]
	c.setTenantMetrics()
	c.mu.Unlock()
	if seen.Err != nil {
		klog.Background().V(2).Info("Tenant policy read, not used", "policy", key, "generation", p.Generation, "reason", seen.Err.Reason, "err", seen.Err.Message)
	} else {
		klog.Background().V(2).Info("Tenant policy read", "policy", key, "generation", p.Generation, "rules", seen.Rules)
	}
	c.status.Add(key)
	for _, k := range changed {
		if k != key {
			c.status.Mark(k)
		}
	}
	if enqueue || resume || unseen {
		c.cfg.Redecide(p.Namespace)
	}
}

// setPendingLocked leaves ops, made by p, to the namespace's pass, which
// measures them first (ApplyPending); c.mu is held.
func (c *Controller) setPendingLocked(p *v1alpha1.PodLifetimePolicy, ops []tenantOp) {
	if c.pending[p.Namespace] == nil {
		c.pending[p.Namespace] = map[string]tenantOp{}
	}
	for _, op := range ops {
		c.pending[p.Namespace][op.name] = op
	}
	c.pendingBy[p.Namespace] = p
}

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

// convert converts one generation of a policy: deleting, it gives no
// deadline.
func (c *Controller) convert(p *v1alpha1.PodLifetimePolicy, deleting bool) tenantConverted {
	conv := tenantConverted{uid: p.UID, generation: p.Generation, rules: len(p.Spec.Rules)}
	size, dropped := tenant.RulesBytes(p)
	conv.bytes = size
	var err error
	switch {
	case deleting: // deleted, held by a finalizer: its deadlines are gone
		err = &policy.TenantError{Reason: DeletingReason,
			Message: fmt.Sprintf("the policy is being deleted (since %s): its rules give no deadline", p.DeletionTimestamp.UTC().Format(time.RFC3339))}
	case dropped:
		err = &policy.TenantError{Reason: tenant.TooLarge, Message: fmt.Sprintf(
			"its rules hold %d bytes, more than the %d a namespace's policies may hold in all (--tenant-max-bytes-per-namespace)", size, c.limits.Bytes)}
	default:
		conv.policy, err = Convert(p, c.restrictions)
	}
	if err != nil {
		var te *policy.TenantError
		if !errors.As(err, &te) {
			te = &policy.TenantError{Reason: policy.TenantReasonInvalid, Message: err.Error()}
		}
		conv.policy, conv.err = nil, te
	} else {
		conv.policy.UID, conv.policy.Generation = p.UID, p.Generation
	}
	return conv
}

// ApplyPending makes the pending changes of namespace's tenant
// policies, their wave measured first (holdTenantWave): the namespace's
// pass calls it before it lists the pods to decide again, so that the
// changes of one interval are measured once, before any worker decides by
// them.
func (c *Controller) ApplyPending(namespace string) {
	c.mu.Lock()
	p, hold := c.applyPendingLocked(namespace)
	var keys []string // their status waited for this pass (WriteStatus)
	if p != nil {
		for name := range c.converted[namespace] {
			keys = append(keys, namespace+"/"+name)
		}
	}
	c.mu.Unlock()
	for _, key := range keys {
		c.status.Mark(key)
	}
	c.reportTenantWave(p, hold)
}

// applyPendingLocked measures and makes the pending changes of namespace
// and returns the policy that made the last of them and the hold, if any;
// c.mu is held.
func (c *Controller) applyPendingLocked(namespace string) (*v1alpha1.PodLifetimePolicy, *wave.Hold) {
	ops, p, unknown := slices.Collect(maps.Values(c.pending[namespace])), c.pendingBy[namespace], c.unknownBefore[namespace]
	delete(c.pending, namespace)
	delete(c.pendingBy, namespace)
	delete(c.unknownBefore, namespace)
	if p == nil {
		return nil, nil
	}
	hold := c.holdTenantWave(p, ops, unknown)
	c.apply(c.store, ops)
	return p, hold
}

// reportTenantWave logs a hold p's change made and marks p's status for a
// write; an approval of it that p carries already is an earlier
// occurrence's, taken off unused.
func (c *Controller) reportTenantWave(p *v1alpha1.PodLifetimePolicy, hold *wave.Hold) {
	if p == nil {
		return
	}
	key := p.Namespace + "/" + p.Name
	defer c.status.Mark(key) // after usedApprovals: the write takes a stale approval off
	if hold == nil {
		return
	}
	what := "Holding the removals of a changed tenant policy: it makes too many pods of its namespace due at once"
	if p.DeletionTimestamp != nil {
		what = "Holding the deletion of a tenant policy: without its rules too many pods of its namespace are due at once"
	}
	klog.Background().Info(what, "policy", key, "change", hold.ID, "pods", hold.Pods, "approve", ApproveCommand(p.Namespace, p.Name, hold.ID))
	if p.Annotations[wave.AnnotationApprove] == hold.ID {
		// There before the hold: an earlier occurrence's (the same change
		// made before, its approval left on), which approves nothing.
		c.mu.Lock()
		if c.usedApprovals == nil {
			c.usedApprovals = map[string]usedApproval{}
		}
		c.usedApprovals[key] = usedApproval{id: hold.ID, stale: true}
		c.mu.Unlock()
	}
}

// holdTenantWave measures the change that ops make to the tenant policies
// of p's namespace (before they are applied: no worker decides by them
// yet) against the pods of the namespace, and holds it when its wave is too
// large; c.mu is held. unknown: what was acted on before is not known (a
// policy changed while no podjanitor ran), so the change is measured
// against the pods' own annotations alone.
func (c *Controller) holdTenantWave(p *v1alpha1.PodLifetimePolicy, ops []tenantOp, unknown bool) *wave.Hold {
	old := c.store.For(p.Namespace)
	next := tenant.NewStore()
	for _, q := range old {
		next.Set(q)
	}
	c.apply(next, ops)
	cur := next.For(p.Namespace)
	if slices.Equal(old, cur) || podcache.NamespaceTerminating(c.cfg.Namespaces, p.Namespace) {
		// A namespace being deleted loses its pods whatever its policies
		// say: holding a policy's deletion there would only hold the
		// namespace's.
		return nil
	}
	key := p.Namespace + "/" + p.Name
	oldJSON, oldDecide := tenantsJSON(p.Namespace, old), c.tenantDecider(p.Namespace, old)
	if unknown {
		oldJSON, oldDecide = nil, c.annotationsDecider(p.Namespace)
	}
	h, held := c.holds.Change(p.Namespace, key, oldJSON, oldDecide,
		tenantsJSON(p.Namespace, cur), c.tenantDecider(p.Namespace, cur),
		podcache.PodsOf(c.cfg.Pods, p.Namespace), c.cfg.Now())
	if !held {
		return nil
	}
	return &h
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
	c.mu.Lock()
	if c.usedApprovals == nil {
		c.usedApprovals = map[string]usedApproval{}
	}
	c.usedApprovals[key] = usedApproval{id: id, pods: len(keys)}
	c.mu.Unlock()
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

// PolicyDeleted takes a deleted policy out of the store, lets the
// namespace's policies past a limit take its place, and decides its
// namespace's pods again: the deadlines it gave are gone with it.
func (c *Controller) PolicyDeleted(obj interface{}) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	key := m.GetNamespace() + "/" + m.GetName()
	c.mu.Lock()
	// Changes pending before the deletion are measured and made first (one
	// of them may set this very policy).
	pendingBy, hold := c.applyPendingLocked(m.GetNamespace())
	c.store.Delete(m.GetNamespace(), m.GetName())
	c.reader.Forget(m.GetNamespace(), m.GetName())
	delete(c.converted[m.GetNamespace()], m.GetName())
	if len(c.converted[m.GetNamespace()]) == 0 {
		delete(c.converted, m.GetNamespace())
	}
	c.setSeen(key, nil)
	changed, ops := c.admit(m.GetNamespace(), "")
	if by := c.unlockedBy(m.GetNamespace(), ops); by != nil {
		// A policy refused for the namespace's limits is used now that this
		// one is gone: measured as its creation, at the namespace's pass.
		c.setPendingLocked(by, ops)
	} else {
		c.apply(c.store, ops)
	}
	c.setTenantMetrics()
	c.mu.Unlock()
	c.reportTenantWave(pendingBy, hold)
	c.status.Forget(key)
	for _, k := range changed {
		c.status.Mark(k)
	}
	klog.Background().V(2).Info("Tenant policy deleted", "policy", key)
	c.measureHeld(m.GetNamespace(), key)
	c.cfg.Redecide(m.GetNamespace())
}

// measureHeld measures a namespace whose change waits (held on its own,
// or with other namespaces' changes) again after a change that was not
// measured on its way in (a policy deleted with no finalizer): against what
// was acted on before the waiting change, so that the namespace's policies
// as they are now are held, or go when they are back to it.
func (c *Controller) measureHeld(namespace, object string) {
	if c.holds == nil {
		return
	}
	if _, waits := c.holds.Before(namespace, c.cfg.Now()); !waits {
		return
	}
	_, _, wasHeld := c.holds.Held(namespace)
	c.mu.Lock()
	cur := c.store.For(namespace)
	b, decide := tenantsJSON(namespace, cur), c.tenantDecider(namespace, cur)
	h, held := c.holds.Change(namespace, object, b, decide, b, decide, podcache.PodsOf(c.cfg.Pods, namespace), c.cfg.Now())
	c.mu.Unlock()
	c.MarkNamespaces([]string{namespace})
	switch {
	case held:
		klog.Background().Info("Holding the removals of a namespace's tenant policies as they are after a deletion: they still make too many pods due at once",
			"namespace", namespace, "change", h.ID, "pods", h.Pods)
	case wasHeld:
		klog.Background().Info("A namespace's tenant policies are back to what was acted on: the hold ends", "namespace", namespace)
	}
}

// unlockedBy returns the first policy that ops (a re-admission after a
// deletion) start to use, as the informer has it, when waves are held:
// the change is then measured as that policy's creation. nil: none, or
// waves are not held. c.mu is held.
func (c *Controller) unlockedBy(namespace string, ops []tenantOp) *v1alpha1.PodLifetimePolicy {
	if c.holds == nil {
		return nil
	}
	for _, op := range ops {
		if op.set == nil {
			continue
		}
		if p, err := c.lister.PodLifetimePolicies(namespace).Get(op.name); err == nil {
			return p
		}
	}
	return nil
}

// hasFinalizer reports whether p has this podjanitor's finalizer.
func (c *Controller) hasFinalizer(p *v1alpha1.PodLifetimePolicy) bool {
	return tenant.HasFinalizer(p, c.finalizer)
}

// NamespaceTerminating ends the held change of a namespace being
// deleted (its pods go with it whatever its policies say) and marks its
// policies, so that a held deletion lets its policy go: the namespace's own
// deletion waits for its policies'.
func (c *Controller) NamespaceTerminating(namespace string) {
	if c.holds == nil {
		return
	}
	if _, object, held := c.holds.Held(namespace); held && c.holds.End(namespace, object) {
		klog.Background().Info("The namespace of a held tenant policy change is being deleted: its hold ends", "namespace", namespace, "policy", object)
	}
	c.MarkNamespaces([]string{namespace})
}

// tenantOp is a change of the store: set a policy, or delete one (set nil).
type tenantOp struct {
	namespace, name string
	set             *policy.TenantPolicy
}

// apply makes the changes ops to store.
func (c *Controller) apply(store *tenant.Store, ops []tenantOp) {
	for _, op := range ops {
		if op.set != nil {
			store.Set(op.set)
		} else {
			store.Delete(op.namespace, op.name)
		}
	}
}

// admit chooses which converted policies of namespace are used (the
// Limits, in name order), updates seen for those whose use changed, and
// returns their keys, and written's (the policy just converted) always,
// and the changes of the store that follow (apply); c.mu is held.
func (c *Controller) admit(namespace, written string) (changed []string, ops []tenantOp) {
	convs := c.converted[namespace]
	names := slices.Sorted(maps.Keys(convs))
	var candidates []tenant.Candidate
	for _, name := range names {
		if conv := convs[name]; conv.err == nil {
			candidates = append(candidates, tenant.Candidate{Name: name, Rules: conv.rules, Bytes: conv.bytes})
		}
	}
	reasons := c.limits.Admit(candidates)
	refused := make(map[string]string, len(candidates))
	for i, c := range candidates {
		refused[c.Name] = reasons[i]
	}
	for _, name := range names {
		conv, key := convs[name], namespace+"/"+name
		s := Seen{UID: conv.uid, Generation: conv.generation, Rules: conv.rules, Err: conv.err}
		if reason := refused[name]; reason != "" {
			s.Err = &policy.TenantError{Reason: reason, Message: c.limits.Message(reason)}
		}
		if old, ok := c.seen[key]; ok && key != written && old.UID == s.UID && old.Generation == s.Generation && sameTenantError(old.Err, s.Err) {
			continue
		}
		c.setSeen(key, &s)
		if s.Err == nil {
			ops = append(ops, tenantOp{namespace: namespace, name: name, set: conv.policy})
		} else {
			ops = append(ops, tenantOp{namespace: namespace, name: name})
		}
		changed = append(changed, key)
	}
	return changed, ops
}

func sameTenantError(a, b *policy.TenantError) bool {
	return a == b || a != nil && b != nil && *a == *b
}

// setSeen sets (nil: deletes) what the controller made of the policy of
// key, and the counts the metrics read; c.mu is held.
func (c *Controller) setSeen(key string, s *Seen) {
	if old, ok := c.seen[key]; ok && old.Err != nil {
		c.notReady--
		c.overLimit[old.Err.Reason]--
	}
	if s == nil {
		delete(c.seen, key)
		return
	}
	c.seen[key] = *s
	if s.Err != nil {
		c.notReady++
		c.overLimit[s.Err.Reason]++
	}
}

// setTenantMetrics sets the tenant metrics from the counts; c.mu is held.
func (c *Controller) setTenantMetrics() {
	c.cfg.Metrics.SetTenantPolicies(len(c.seen)-c.notReady, c.notReady)
	for _, reason := range metrics.TenantLimitReasons {
		c.cfg.Metrics.SetTenantPoliciesOverLimit(reason, c.overLimit[reason])
	}
}

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
	cond := metav1.Condition{Type: v1alpha1.ConditionReady, ObservedGeneration: seen.Generation}
	if seen.Err != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, seen.Err.Reason, events.CutNote(seen.Err.Message)
		status.PodsWithDeadline, status.NextDeadline = 0, nil
		if h, held := c.tenantHeld(p); held && seen.Err.Reason == DeletingReason {
			cond.Reason, cond.Message = wave.ReasonRemovalsHeld, HeldMessage(p, h)
			status.HeldChange = heldChange(p, h, c.cfg.Now())
		}
	} else {
		cond.Status, cond.Reason = metav1.ConditionTrue, InUseReason
		cond.Message = fmt.Sprintf("podjanitor uses the %d rule(s) for the pods of namespace %s", seen.Rules, p.Namespace)
		if h, held := c.tenantHeld(p); held {
			cond.Status, cond.Reason = metav1.ConditionFalse, wave.ReasonRemovalsHeld
			cond.Message = HeldMessage(p, h)
			status.HeldChange = heldChange(p, h, c.cfg.Now())
		} else if h, object, held := c.holds.SpreadHeld(p.Namespace, c.cfg.Now()); held && object == p.Namespace+"/"+p.Name {
			// Not acted on yet: a restart measures the policy again, and
			// holds it with the other namespaces' changes again.
			cond.Status, cond.Reason = metav1.ConditionFalse, wave.ReasonRemovalsHeldAcrossNamespaces
			cond.Message = fmt.Sprintf("change %s holds %d pod removal(s) in all: this change, made with the changes of other namespaces, makes them due at once; podjanitor removes none of them until a cluster admin approves it on its Lease (%s) or the changes are reverted",
				h.ID, h.Pods, c.cfg.Waves.Record.ApproveCommand(h.ID))
		}
		n, next := c.tracker.Summary(p.Namespace + "/" + p.Name)
		status.PodsWithDeadline, status.NextDeadline = int32(n), nil
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
	c.mu.Lock()
	seen, ok := c.seen[key]
	_, pending := c.pendingBy[namespace]
	c.mu.Unlock()
	if !ok || seen.UID != p.UID {
		return nil // not read yet: its event marks it again
	}
	if seen.Generation != p.Generation {
		// The cache has a generation the handler has not read yet (it
		// updates before it calls the handler), a deletion's among them:
		// written when the handler marks it, so that the finalizer comes off
		// only once the deletion has been measured.
		return tenant.ErrNotYet
	}
	if pending {
		// A change of the namespace's policies waits for its pass, which
		// may hold it: the pass marks every policy of the namespace.
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
	_, err = c.client.PodjanitorV1alpha1().PodLifetimePolicies(p.Namespace).Patch(ctx, p.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
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
	_, err = c.client.PodjanitorV1alpha1().PodLifetimePolicies(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	// One Warning per new reason or message, by the writer of the status
	// (the leader), not by every replica's informer.
	was := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
	deleting := seen.Err != nil && seen.Err.Reason == DeletingReason
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
// finalizer (Controller.finalizer), so that its deletion is measured as
// a change (--hold-waves) before the policy goes: a policy in use whose
// deletion could be held (mayHoldDeletion) gets it (not in a dry run, which
// changes nothing that blocks a deletion) and keeps it while it is not being
// deleted; a policy being deleted keeps it while
// its deletion is held, in a namespace that is not being deleted itself.
// Once the API server has refused the finalizer (RBAC without patch), no
// policy gets it. Without --hold-waves no policy keeps it.
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
// wave is at most the pods the policy gives a deadline now (the others
// decide as they would without it), and a wave of no more than the
// threshold's floor is never held. A policy of a few pods gets no finalizer,
// and its deletion (its namespace's) never waits for podjanitor; once it
// has one, it keeps it while it is not being deleted.
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
	policies := c.client.PodjanitorV1alpha1().PodLifetimePolicies(p.Namespace)
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
	in := map[string]bool{}
	for _, ns := range namespaces {
		in[ns] = true
	}
	var keys []string
	c.mu.Lock()
	for key := range c.seen {
		if ns, _, _ := strings.Cut(key, "/"); in[ns] {
			keys = append(keys, key)
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

// ErrChanged: the policy as read now is not the one that decided.
var ErrChanged = errors.New("the policy was deleted or changed since it decided")

// Confirm reads the tenant policy that made decision d (from the API
// server, or a read shared with other removals: tenant.Reader) and says
// whether it is still the one that decided: same UID and generation, no
// deletion timestamp, and usable in the cache. A pod it gave a deadline is
// removed only then, so that a policy deleted or changed a moment ago removes
// nothing even while its watch lags behind.
func (c *Controller) Confirm(ctx context.Context, d policy.Decision) error {
	namespace, name, ok := policy.TenantPolicyOf(d)
	if !ok {
		return ErrChanged
	}
	c.mu.Lock()
	seen, cached := c.seen[d.Policy]
	c.mu.Unlock()
	if !cached || seen.Err != nil {
		return ErrChanged
	}
	fresh, err := c.reader.Read(ctx, namespace, name)
	if err != nil {
		return fmt.Errorf("reading the tenant policy: %w", err)
	}
	if fresh.Deleting || fresh.UID != d.PolicyUID || fresh.Generation != d.PolicyGeneration {
		return ErrChanged
	}
	return nil
}

// readTenantPolicy is the tenant.Reader's read of a policy.
func readTenantPolicy(client versioned.Interface) func(ctx context.Context, namespace, name string) (tenant.Identity, error) {
	return func(ctx context.Context, namespace, name string) (tenant.Identity, error) {
		got, err := client.PodjanitorV1alpha1().PodLifetimePolicies(namespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return tenant.Identity{}, nil
		case err != nil:
			return tenant.Identity{}, err
		}
		return tenant.Identity{UID: got.UID, Generation: got.Generation, Deleting: got.DeletionTimestamp != nil}, nil
	}
}

// podsOfPolicyNamespaces are those of podKeys whose namespace has a usable
// tenant policy.
func (c *Controller) podsOfPolicyNamespaces(podKeys []string) []string {
	var out []string
	for _, key := range podKeys {
		if namespace, _, ok := strings.Cut(key, "/"); ok && len(c.store.For(namespace)) > 0 {
			out = append(out, key)
		}
	}
	return out
}

// Start starts the informer of a served API (AwaitAPI when it is not).
func (c *Controller) Start(ctx context.Context) {
	c.cfg.Metrics.SetTenantPoliciesAvailable(true)
	go c.cfg.Informer.RunWithContext(ctx)
}

// AwaitAPI runs the controller without tenant policies while the API
// server does not serve them (absent is the probe's answer: their CRD is not
// installed, as after a `helm upgrade` from a chart without it): the
// controller's caches and /readyz do not wait for them, and the probe is
// made again every interval. Once it succeeds, the informer starts, and when
// its handler has seen the initial list every pod is decided again with the
// policies it found. Until then pods are decided as without --tenant-policies.
func (c *Controller) AwaitAPI(ctx context.Context, probe func(context.Context) error, interval time.Duration, absent error) (synced func() bool) {
	logger := klog.FromContext(ctx)
	logger.Error(absent, "Tenant policies unavailable: the API server does not serve them; running without them until it does (install the CRD: kubectl apply -k artifacts/crd, or the chart's crds.install)",
		"kind", policy.TenantKind, "checkEvery", interval)
	c.cfg.Metrics.SetTenantPoliciesAvailable(false)
	handlerSynced := c.synced
	c.synced = func() bool { return true }
	go func() {
		if !served.Await(ctx, c.cfg.Clock, interval, probe, func(err error) {
			logger.Error(err, "Checking whether the API server serves tenant policies", "kind", policy.TenantKind)
		}) {
			return
		}
		logger.Info("The API server serves tenant policies now: starting their informer", "kind", policy.TenantKind)
		go c.cfg.Informer.RunWithContext(ctx)
		if !cache.WaitForNamedCacheSyncWithContext(ctx, handlerSynced) {
			return
		}
		c.cfg.Metrics.SetTenantPoliciesAvailable(true)
		for _, key := range c.cfg.Pods.ListKeys() {
			if name, err := cache.ParseObjectName(key); err == nil {
				c.cfg.Requeue(name)
			}
		}
		logger.Info("Honouring tenant policies from now on: every pod decided again", "kind", policy.TenantKind)
	}()
	return c.synced
}
