// Package tenantcontroller is podjanitor's PodLifetimePolicy controller:
// the resources in which namespace owners write rules for the pods of their
// namespace (--tenant-policies), their admission under the limits, the
// holds of their changes, their status and finalizer writes.
package tenantcontroller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
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
	// which calls Sync at the namespace's pass).
	Redecide func(namespace string)
	// Requeue decides a pod again now: its policies changed, or a held
	// change was approved.
	Requeue func(key cache.ObjectName)
}

// Controller is the PodLifetimePolicy controller. Its informer's handler
// takes the initial list at once (take), then only marks the namespace of
// a policy created, changed or deleted for its coalesced pass
// (Config.Redecide), which calls Sync: the namespace's policies are
// converted, those used chosen under the Limits, their change measured
// (held when its wave is too large, --hold-waves, until approved on a
// policy) and put in the store the evaluator reads (Store). A policy whose
// deletion could be held carries a finalizer; statuses are written at a
// bounded rate (status.go).
//
// The pod controller sees it through Store, Observe, Confirm, Sync, Check
// and Forget; the controller reaches back only through its Config's
// callbacks.
type Controller struct {
	cfg    Config
	lister listers.PodLifetimePolicyLister
	// synced: the handler has taken the informer's initial list, so the
	// store holds every policy (the informer's own HasSynced says less).
	synced cache.InformerSynced
	limits tenant.Limits

	store   *tenant.Store
	tracker *tenant.Tracker
	status  *tenant.StatusWriter
	// reader is Confirm's reads from the API server.
	reader *tenant.Reader
	// holds are the held changes by namespace; nil without Config.Waves.
	holds *wave.Holds
	// finalizer is this podjanitor's on the policies it uses
	// (tenant.FinalizerFor its record Lease).
	finalizer string
	// finalizerRefused: the API server refused to put the finalizer on a
	// policy (RBAC): none gets it from then on.
	finalizerRefused atomic.Bool

	// mu guards what follows, and a namespace's store with its seen.
	mu sync.Mutex
	// seen is what the controller made of each policy as the store has
	// it, by namespace and name.
	seen map[string]map[string]Seen
	// converted is the last conversion of each policy, by namespace and
	// name: reused while its UID, generation and deletion are the same.
	converted map[string]map[string]conversion
	// usedApprovals are the approvals taken (the change ID, by policy
	// key) that WriteStatus takes off their policy: an approval covers one
	// occurrence of its change.
	usedApprovals map[string]usedApproval
	// policies counts the policies seen, notReady those not used and
	// overLimit those by the limit they pass (the metrics).
	policies, notReady int
	overLimit          map[string]int
}

// conversion is the conversion of one generation of a policy: the policy
// (nil when it cannot be used: Seen.Err says why) and the bytes of its rules.
type conversion struct {
	Seen
	deleting bool
	policy   *policy.TenantPolicy
	bytes    int
}

// Seen is what the controller made of one generation of a policy: Err
// says why it is not used (nil: it is).
type Seen struct {
	UID        types.UID
	Generation int64
	Rules      int
	Err        *policy.TenantError
}

func (s Seen) deleting() bool { return s.Err != nil && s.Err.Reason == DeletingReason }

func (s Seen) equal(o Seen) bool {
	return s.UID == o.UID && s.Generation == o.Generation && s.Rules == o.Rules &&
		(s.Err == o.Err || s.Err != nil && o.Err != nil && *s.Err == *o.Err)
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
		cfg:       cfg,
		lister:    listers.NewPodLifetimePolicyLister(cfg.Informer.GetIndexer()),
		store:     tenant.NewStore(),
		reader:    tenant.NewReader(cfg.Clock, cfg.WriteTimeout, readTenantPolicy(cfg.Client)),
		seen:      map[string]map[string]Seen{},
		converted: map[string]map[string]conversion{},
		overLimit: map[string]int{},
		finalizer: tenant.FinalizerFor("podjanitor", "podjanitor"), // artifacts/deploy's Lease
	}
	c.status = tenant.NewStatusWriter(cfg.Clock, cfg.StatusInterval, c.WriteStatus)
	c.tracker = tenant.NewTracker(c.status.Mark)
	if w := cfg.Waves; w != nil {
		c.holds = wave.NewHolds(wave.SourceTenant, w.Threshold, w.Window, cfg.Metrics.SetPodsHeld)
		if w.Spread != nil {
			c.holds.SetSpread(w.Spread)
		}
	}
	handler, err := cfg.Informer.AddEventHandlerWithOptions(c.eventHandler(), cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding tenant policy event handler: %w", err)
	}
	c.synced = handler.HasSynced
	return c, nil
}

// eventHandler takes the initial list at once (take), then marks the
// namespace of a policy created, changed (generation, UID, deletion) or
// deleted for its pass (Sync). An approval is taken as it comes
// (tenantWaveApproved); a status write (ours) is no work.
func (c *Controller) eventHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, isInInitialList bool) {
			if p, ok := obj.(*v1alpha1.PodLifetimePolicy); ok && isInInitialList {
				c.take(p)
				return
			}
			c.enqueue(obj)
		},
		UpdateFunc: func(old, cur interface{}) {
			o, ok1 := old.(*v1alpha1.PodLifetimePolicy)
			n, ok2 := cur.(*v1alpha1.PodLifetimePolicy)
			switch {
			case !ok1 || !ok2 || o.Generation != n.Generation || o.UID != n.UID || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil):
				c.enqueue(cur)
			case o.Annotations[wave.AnnotationApprove] != n.Annotations[wave.AnnotationApprove]:
				c.tenantWaveApproved(n)
			case c.hasFinalizer(o) != c.hasFinalizer(n):
				c.status.Mark(n.Namespace + "/" + n.Name) // put back on a policy in use
			}
		},
		DeleteFunc: c.enqueue,
	}
}

// enqueue marks the namespace of a policy for its pass; the policy's
// fresh read (Confirm) is read again.
func (c *Controller) enqueue(obj interface{}) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	namespace, name, _ := cache.SplitMetaNamespaceKey(key)
	c.reader.Forget(namespace, name)
	c.cfg.Redecide(namespace)
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
	var keys []string
	for _, key := range podKeys {
		if namespace, _, ok := strings.Cut(key, "/"); ok && len(c.store.For(namespace)) > 0 {
			keys = append(keys, key)
		}
	}
	return c.tracker.Expect(keys)
}

// RunStatus writes the policies' status until ctx ends, the first writes
// once ready is closed (nil: at once).
func (c *Controller) RunStatus(ctx context.Context, ready <-chan struct{}) { c.status.Run(ctx, ready) }

// Policy is what the controller made of the policy of key, as the store
// has it, if it took it.
func (c *Controller) Policy(key string) (Seen, bool) {
	namespace, name, _ := strings.Cut(key, "/")
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.seen[namespace][name]
	return s, ok
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

// take takes a policy of the informer's initial list at once: its
// namespace's policies as the last podjanitor acted on them (acted) go in
// the store unmeasured. When they differ from the policies as they are (a
// deletion held by the finalizer, a policy created or changed while none
// ran), the namespace's pass measures the difference (Sync), so that a
// restart lets no change through unapproved. A change its status says is
// held is held again (resumeTenantWave).
func (c *Controller) take(p *v1alpha1.PodLifetimePolicy) {
	policies := c.list(p.Namespace)
	c.mu.Lock()
	now := c.choose(p.Namespace, policies, c.current)
	acted := c.choose(p.Namespace, policies, c.acted)
	changed, _ := c.use(p.Namespace, acted)
	if s, ok := now.seen[p.Name]; ok && s.Err == nil && c.holds != nil {
		c.resumeTenantWave(p)
	}
	c.mu.Unlock()
	for _, key := range changed {
		c.status.Add(key)
	}
	if !slices.Equal(now.used, acted.used) {
		c.cfg.Redecide(p.Namespace)
	}
}

// Sync takes the policies of namespace as the cache has them now. The
// namespace's pass calls it before it lists the pods to decide again: the
// changes of one interval are measured once (a storm of writes costs one
// measurement per pass), before any worker decides by them. The policies
// used (choose) are measured (measure, --hold-waves), then the store takes
// them (use). Nothing is retried: the cache is read, and status writes
// retry on their own.
func (c *Controller) Sync(namespace string) {
	policies := c.list(namespace)
	c.mu.Lock()
	next := c.choose(namespace, policies, c.current)
	var object string
	var hold *wave.Hold
	if c.holds != nil {
		object, hold = c.measure(namespace, policies, c.store.For(namespace), next.used)
	}
	storeChanged := !slices.Equal(c.store.For(namespace), next.used)
	changed, gone := c.use(namespace, next)
	c.mu.Unlock()
	for _, key := range gone {
		c.status.Forget(key)
		klog.Background().V(2).Info("Tenant policy deleted", "policy", key)
	}
	by, _ := c.lister.PodLifetimePolicies(namespace).Get(object)
	if hold != nil {
		c.reportHold(by, *hold)
	}
	for _, key := range changed {
		c.status.Add(key)
	}
	for _, p := range policies {
		key := p.Namespace + "/" + p.Name
		if slices.Contains(changed, key) && p.DeletionTimestamp != nil && c.hasFinalizer(p) {
			c.status.Release(key) // its deletion waits on the write
		} else if storeChanged || object != "" {
			c.status.Mark(key) // the namespace's change may be held
		}
	}
}

// list is the policies of namespace in the informer's cache.
func (c *Controller) list(namespace string) []*v1alpha1.PodLifetimePolicy {
	policies, err := c.lister.PodLifetimePolicies(namespace).List(labels.Everything())
	if err != nil {
		utilruntime.HandleError(err)
	}
	return policies
}

// current is p as it is: one being deleted gives no deadline.
func (c *Controller) current(p *v1alpha1.PodLifetimePolicy) (conversion, bool) {
	return c.convert(p, p.DeletionTimestamp != nil), true
}

// acted is p as its status and finalizer say the last podjanitor acted on
// it (the start's view, with --hold-waves): one being deleted and held by
// the finalizer as it was before; a live one whose generation its status
// does not say used or held (ActedOn: created or changed while none ran)
// as not there.
func (c *Controller) acted(p *v1alpha1.PodLifetimePolicy) (conversion, bool) {
	switch {
	case c.holds == nil:
	case p.DeletionTimestamp != nil && c.hasFinalizer(p):
		return c.convert(p, false), true
	case p.DeletionTimestamp == nil && !ActedOn(p):
		return conversion{}, false
	}
	return c.current(p)
}

// choice is what the policies of a namespace come to: those used (in name
// order, as the store has them) and what was made of each, by name.
type choice struct {
	used []*policy.TenantPolicy
	seen map[string]Seen
}

// choose converts the policies of namespace as view has them (false: not
// there) and chooses the used ones under the Limits, in name order. c.mu
// is held.
func (c *Controller) choose(namespace string, policies []*v1alpha1.PodLifetimePolicy, view func(*v1alpha1.PodLifetimePolicy) (conversion, bool)) choice {
	policies = slices.SortedFunc(slices.Values(policies), func(a, b *v1alpha1.PodLifetimePolicy) int { return strings.Compare(a.Name, b.Name) })
	convs := map[string]conversion{}
	var candidates []tenant.Candidate
	for _, p := range policies {
		if conv, ok := view(p); ok {
			convs[p.Name] = conv
			if conv.Err == nil {
				candidates = append(candidates, tenant.Candidate{Name: p.Name, Rules: conv.Rules, Bytes: conv.bytes})
			}
		}
	}
	c.converted[namespace] = convs
	refused := map[string]string{}
	for i, reason := range c.limits.Admit(candidates) {
		refused[candidates[i].Name] = reason
	}
	ch := choice{seen: map[string]Seen{}}
	for _, p := range policies {
		conv, ok := convs[p.Name]
		if !ok {
			continue
		}
		s := conv.Seen
		if reason := refused[p.Name]; reason != "" {
			s.Err = &policy.TenantError{Reason: reason, Message: c.limits.Message(reason)}
		}
		if s.Err == nil {
			ch.used = append(ch.used, conv.policy)
		}
		ch.seen[p.Name] = s
	}
	return ch
}

// convert converts one generation of a policy (deleting: it gives no
// deadline), or reuses its last conversion; c.mu is held.
func (c *Controller) convert(p *v1alpha1.PodLifetimePolicy, deleting bool) conversion {
	if conv, ok := c.converted[p.Namespace][p.Name]; ok && conv.UID == p.UID && conv.Generation == p.Generation && conv.deleting == deleting {
		return conv
	}
	size, dropped := tenant.RulesBytes(p)
	conv := conversion{Seen: Seen{UID: p.UID, Generation: p.Generation, Rules: len(p.Spec.Rules)}, deleting: deleting, bytes: size}
	var err error
	switch {
	case deleting: // deleted, held by a finalizer: its deadlines are gone
		err = &policy.TenantError{Reason: DeletingReason,
			Message: fmt.Sprintf("the policy is being deleted (since %s): its rules give no deadline", p.DeletionTimestamp.UTC().Format(time.RFC3339))}
	case dropped:
		err = &policy.TenantError{Reason: tenant.TooLarge, Message: fmt.Sprintf(
			"its rules hold %d bytes, more than the %d a namespace's policies may hold in all (--tenant-max-bytes-per-namespace)", size, c.limits.Bytes)}
	default:
		conv.policy, err = Convert(p, c.cfg.Restrictions)
	}
	if err != nil {
		var te *policy.TenantError
		if !errors.As(err, &te) {
			te = &policy.TenantError{Reason: policy.TenantReasonInvalid, Message: err.Error()}
		}
		conv.policy, conv.Err = nil, te
	} else {
		conv.policy.UID, conv.policy.Generation = p.UID, p.Generation
	}
	return conv
}

// use puts ch in the store and seen; it returns the keys of the policies
// whose Seen changed, and of those gone. c.mu is held.
func (c *Controller) use(namespace string, ch choice) (changed, gone []string) {
	old := c.store.For(namespace)
	for _, p := range old {
		if !slices.ContainsFunc(ch.used, func(q *policy.TenantPolicy) bool { return q.Name == p.Name }) {
			c.store.Delete(namespace, p.Name)
		}
	}
	for _, p := range ch.used {
		if !slices.Contains(old, p) {
			c.store.Set(p)
		}
	}
	was := c.seen[namespace]
	c.count(was, -1)
	c.count(ch.seen, 1)
	for name, s := range ch.seen {
		if o, ok := was[name]; !ok || !o.equal(s) {
			changed = append(changed, namespace+"/"+name)
			klog.Background().V(2).Info("Tenant policy taken", "policy", namespace+"/"+name, "generation", s.Generation, "rules", s.Rules, "notUsed", s.Err)
		}
	}
	for name := range was {
		if _, ok := ch.seen[name]; !ok {
			gone = append(gone, namespace+"/"+name)
		}
	}
	if c.seen[namespace] = ch.seen; len(ch.seen) == 0 {
		delete(c.seen, namespace)
		delete(c.converted, namespace)
	}
	c.cfg.Metrics.SetTenantPolicies(c.policies-c.notReady, c.notReady)
	for _, reason := range metrics.TenantLimitReasons {
		c.cfg.Metrics.SetTenantPoliciesOverLimit(reason, c.overLimit[reason])
	}
	return changed, gone
}

// count adds sign times the policies of seen to the metrics' counts; c.mu
// is held.
func (c *Controller) count(seen map[string]Seen, sign int) {
	for _, s := range seen {
		c.policies += sign
		if s.Err != nil {
			c.notReady += sign
			c.overLimit[s.Err.Reason] += sign
		}
	}
}

// measure measures the change from old (the store's) to next against the
// namespace's pods, and holds it when its wave is too large; it returns the
// name of the policy that made it (the first whose use changed) and the
// hold. A policy gone from the cache (deleted without the finalizer) goes
// unmeasured, but a change that waits is measured again without it. A
// policy whose status says it was acted on at an earlier generation
// (changed while none ran: its rules then are not known) has the change
// measured against the pods' own annotations alone. A namespace being
// deleted loses its pods whatever its policies say: nothing is held there.
// c.mu is held.
func (c *Controller) measure(namespace string, policies []*v1alpha1.PodLifetimePolicy, old, next []*policy.TenantPolicy) (string, *wave.Hold) {
	listed := map[string]*v1alpha1.PodLifetimePolicy{}
	for _, p := range policies {
		listed[p.Name] = p
	}
	kept := slices.DeleteFunc(slices.Clone(old), func(q *policy.TenantPolicy) bool {
		p := listed[q.Name]
		return p == nil || p.UID != q.UID
	})
	object, unknown := "", false
	for _, name := range changedNames(kept, next) {
		if object == "" {
			object = name
		}
		if !slices.ContainsFunc(kept, func(q *policy.TenantPolicy) bool { return q.Name == name }) && actedOnEarlier(listed[name]) {
			unknown = true
		}
	}
	if object == "" && len(kept) < len(old) {
		if _, waits := c.holds.Before(namespace, c.cfg.Now()); waits {
			object = changedNames(old, kept)[0]
		}
	}
	if object == "" || podcache.NamespaceTerminating(c.cfg.Namespaces, namespace) {
		return object, nil
	}
	oldJSON, oldDecide := tenantsJSON(namespace, kept), c.tenantDecider(namespace, kept)
	if unknown {
		oldJSON, oldDecide = nil, c.annotationsDecider(namespace)
	}
	_, _, wasHeld := c.holds.Held(namespace)
	h, held := c.holds.Change(namespace, namespace+"/"+object, oldJSON, oldDecide,
		tenantsJSON(namespace, next), c.tenantDecider(namespace, next), podcache.PodsOf(c.cfg.Pods, namespace), c.cfg.Now())
	if !held {
		if wasHeld {
			klog.Background().Info("A namespace's tenant policies are back to what was acted on: the hold ends", "namespace", namespace)
		}
		return object, nil
	}
	return object, &h
}

// changedNames are the names, in order, of the policies whose use differs
// between a and b (each in name order).
func changedNames(a, b []*policy.TenantPolicy) []string {
	var names []string
	for _, p := range a {
		if !slices.Contains(b, p) {
			names = append(names, p.Name)
		}
	}
	for _, p := range b {
		if !slices.Contains(a, p) && !slices.Contains(names, p.Name) {
			names = append(names, p.Name)
		}
	}
	slices.Sort(names)
	return names
}

// reportHold logs a hold that p's change made; an approval of it that p
// carries already is an earlier occurrence's, taken off unused (p: nil
// when gone).
func (c *Controller) reportHold(p *v1alpha1.PodLifetimePolicy, hold wave.Hold) {
	if p == nil {
		return
	}
	what := "Holding the removals of a changed tenant policy: it makes too many pods of its namespace due at once"
	if p.DeletionTimestamp != nil {
		what = "Holding the deletion of a tenant policy: without its rules too many pods of its namespace are due at once"
	}
	klog.Background().Info(what, "policy", klog.KObj(p), "change", hold.ID, "pods", hold.Pods, "approve", ApproveCommand(p.Namespace, p.Name, hold.ID))
	if p.Annotations[wave.AnnotationApprove] == hold.ID {
		// There before the hold: an earlier occurrence's (the same change
		// made before, its approval left on), which approves nothing.
		c.setUsedApproval(p.Namespace+"/"+p.Name, usedApproval{id: hold.ID, stale: true})
	}
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
	seen, cached := c.Policy(d.Policy)
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
