package main

// The held waves of the cluster's policy (--hold-waves): a reload of the
// policy file, or a start with a policy other than the one the last leader
// acted on, that makes too many pods due at once waits for a person's
// approval on the record Lease (internal/wave).

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/internal/tenant"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// policyWaves holds a large wave of a change of the cluster's policy.
type policyWaves struct {
	guard *wave.Guard
	// options are --hold-waves' (read at each use: a test sets its
	// record's client after the controller is made).
	options *wave.Options
	// pods is the pod cache, the pods a change is measured against.
	pods cache.Indexer
	// decider decides pods by the rules of an evaluator and the running
	// tenant policies; evaluator is the running one.
	decider func(e *policy.Evaluator) wave.Decide
	// decideWith decides a pod by e as it is (the namespace's info looked up).
	decideWith func(e *policy.Evaluator, pod *corev1.Pod, now time.Time) (policy.Decision, error)
	evaluator  func() *policy.Evaluator
	now        func() time.Time
	clock      clock.WithTicker
	reporter   *events.Reporter
	// requeue decides a pod again: the held change was approved.
	requeue func(cache.ObjectName)
	// scope is what, besides the rules, decides which pods this process
	// removes; it is recorded with them (recordJSON).
	scope decisionScope
	// recordedHold is the hold the last leader published on the Lease, as
	// the start read it ("" for none): run takes an approval of it.
	recordedHold string

	// actedRules is the evaluator of the rules acted on while a change of
	// them is held (acted), made once per held change and running evaluator.
	actedRules *actedRules
}

type actedRules struct {
	mu      sync.Mutex
	hold    string
	running *policy.Evaluator
	acted   *policy.Evaluator
}

// decisionScope is what, besides the policy's rules, decides which pods the
// leader removes: the pods it watches, the annotations it reads, whether
// tenant policies apply, whether it removes at all. The leader records it
// with the rules in the record, so that a start with a wider scope (a label
// selector dropped, another namespace, tenant policies turned on, leaving
// --dry-run) is measured like a change of the rules.
type decisionScope struct {
	Namespace        string `json:"namespace"`
	LabelSelector    string `json:"labelSelector"`
	AnnotationPrefix string `json:"annotationPrefix"`
	TenantPolicies   bool   `json:"tenantPolicies"`
	DryRun           bool   `json:"dryRun"`
	// Tenant is what the cluster admin allows tenant policies (the
	// --tenant-* restrictions and limits), with TenantPolicies; nil in a
	// record written before they were recorded: taken as the current ones.
	Tenant *tenantScope `json:"tenant,omitempty"`
}

// tenantScope is what the cluster admin allows tenant policies. A policy
// they refuse shows it in its status, which the tenant policies' holds
// measure; the protected namespaces and priority classes also take pods
// out of every policy's reach with no status to show it, which a start
// measures (recordedEvaluator).
type tenantScope struct {
	Restrictions policy.Restrictions `json:"restrictions"`
	Limits       tenant.Limits       `json:"limits"`
}

// newTenantScope is the tenant scope as recorded: its lists sorted.
func newTenantScope(r policy.Restrictions, l tenant.Limits) *tenantScope {
	r.ForbiddenClocks, r.ForbiddenActions = slices.Sorted(slices.Values(r.ForbiddenClocks)), slices.Sorted(slices.Values(r.ForbiddenActions))
	r.ProtectedNamespaces, r.ProtectedPriorityClasses = slices.Sorted(slices.Values(r.ProtectedNamespaces)), slices.Sorted(slices.Values(r.ProtectedPriorityClasses))
	return &tenantScope{Restrictions: r, Limits: l}
}

// newDecisionScope is a scope as recorded: the default annotation prefix
// as none, the label selector as it prints once parsed; with tenant
// policies, what tenants allow them (nil: none restricted).
func newDecisionScope(namespace, labelSelector string, tenantPolicies bool, tenants *tenantScope, dryRun bool, prefix string) decisionScope {
	if prefix == policy.DefaultAnnotationPrefix {
		prefix = ""
	}
	if sel, err := labels.Parse(labelSelector); err == nil {
		labelSelector = sel.String()
	}
	switch {
	case !tenantPolicies:
		tenants = nil
	case tenants == nil:
		tenants = newTenantScope(policy.Restrictions{}, tenant.Limits{})
	}
	return decisionScope{Namespace: namespace, LabelSelector: labelSelector, AnnotationPrefix: prefix,
		TenantPolicies: tenantPolicies, Tenant: tenants, DryRun: dryRun}
}

// recordedPolicy is what the Lease records as the policy acted on: the
// rules, and the scope they were acted on in. A record without a scope
// (written before scopes were recorded) is taken to have the current one.
type recordedPolicy struct {
	Rules []policy.Rule
	Scope *decisionScope `json:"scope,omitempty"`
}

// newPolicyWaves guards the policy of e against large waves.
func newPolicyWaves(o *wave.Options, e *policy.Evaluator, w policyWaves, onHeld func(source string, n int)) *policyWaves {
	w.options, w.actedRules = o, &actedRules{}
	w.guard = wave.NewGuard(o.Threshold, o.Window, recordJSON(e, w.scope), w.decider(e), onHeld)
	return &w
}

// Held returns the held change, if any.
func (w *policyWaves) Held() (wave.Hold, bool) { return w.guard.Held() }

// acted is the evaluator of the rules acted on: the running one, or, while
// a change of them is held, the running one with the rules before that
// change (the guard's baseline; none for a first install's). Another
// scope's change (a namespace's, a tenant policy's) is measured by it, so
// that it is measured against what was acted on, not against a held change
// of the file's rules (whose hold holds the pods it brings forward).
func (w *policyWaves) acted() *policy.Evaluator {
	running := w.evaluator()
	h, held := w.guard.Held()
	if !held {
		return running
	}
	a := w.actedRules
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hold == h.ID && a.running == running {
		return a.acted
	}
	var rules *policy.Policy
	if b := w.guard.BaselinePolicy(); b != nil {
		r, _, ok := parseRecord(b, w.scope)
		if !ok {
			return running
		}
		rules = r
	}
	e := *running
	e.Policy = rules
	a.hold, a.running, a.acted = h.ID, running, &e
	return &e
}

// CheckPod says whether the held change holds the due pod, and the deadline
// it had before the change.
func (w *policyWaves) CheckPod(key cache.ObjectName, pod *corev1.Pod, now time.Time) (bool, time.Time) {
	return w.guard.Check(key.String(), pod, now)
}

// ForgetPod drops the pod from the hold: it is gone, or not due.
func (w *policyWaves) ForgetPod(key cache.ObjectName) { w.guard.Forget(key.String()) }

// reload measures a reloaded policy e before any worker decides by it, and
// holds its wave when too large.
func (w *policyWaves) reload(e *policy.Evaluator) {
	if h, held := w.guard.Change(wave.SourceFile, recordJSON(e, w.scope), w.decider(e), podcache.Pods(w.pods), w.now()); held {
		klog.Background().Info("Holding the removals of the reloaded policy: it makes too many pods due at once",
			"change", h.ID, "pods", h.Pods, "approve", w.options.Record.ApproveCommand(h.ID))
	}
}

// policyJSON is what names a policy in a change ID, with the zero scope
// (every namespace and label, the default prefix, no tenant policies, no
// dry run): see recordJSON.
func policyJSON(e *policy.Evaluator) []byte { return recordJSON(e, decisionScope{}) }

// recordJSON is what names a policy acted on in a scope, in a change ID and
// in the record: its rules and the scope as JSON, so that a comment or a
// reformatting of the file is no change, and a start in another scope is.
func recordJSON(e *policy.Evaluator, s decisionScope) []byte {
	r := recordedPolicy{Scope: &s}
	if e != nil && e.Policy != nil {
		r.Rules = e.Policy.Rules
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil
	}
	return b
}

// parseRecord reads a recorded policy; a record without a scope has
// current's. ok is false when it does not parse.
func parseRecord(b []byte, current decisionScope) (*policy.Policy, decisionScope, bool) {
	var r recordedPolicy
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, current, false
	}
	var p *policy.Policy // no rules: pods' own annotations and tenant policies only
	if len(r.Rules) > 0 {
		var err error
		if p, err = policy.NewPolicy(r.Rules...); err != nil {
			return nil, current, false
		}
	}
	if r.Scope == nil {
		return p, current, true
	}
	if r.Scope.TenantPolicies && r.Scope.Tenant == nil {
		r.Scope.Tenant = current.Tenant
	}
	return p, *r.Scope, true
}

// recordedEvaluator returns, for a pod, the evaluator that decides it as
// the leader that recorded rules in scope recorded decided it, by a process
// whose running evaluator is running and whose scope is current. Having run
// with --dry-run, the recorded process removed nothing: as at a first
// install, neither the rules nor the tenant policies decided. Without tenant
// policies then, they did not decide. What this start cannot tell — a pod
// outside the recorded namespace or label selector, keep annotations under
// another prefix (the cache keeps the current one's alone), tenant policies
// this start does not read — is decided by the pod's own annotations alone,
// so that a pod's own deadline is never in a wave.
func recordedEvaluator(running policy.Evaluator, rules *policy.Policy, recorded, current decisionScope) func(*corev1.Pod) policy.Evaluator {
	e := running
	e.Policy = rules
	if recorded.DryRun && !current.DryRun {
		e.Policy, e.Tenants = nil, nil
	}
	if !recorded.TenantPolicies && current.TenantPolicies {
		e.Tenants = nil
	}
	if e.Tenants != nil && recorded.Tenant != nil {
		e.Tenants = protectedAs{rest: e.Tenants, restrictions: recorded.Tenant.Restrictions}
	}
	annotationsOnly := e
	annotationsOnly.Policy, annotationsOnly.Tenants = nil, nil
	unknown := recorded.AnnotationPrefix != current.AnnotationPrefix || recorded.TenantPolicies && !current.TenantPolicies
	inScope := inScopeOf(recorded)
	return func(pod *corev1.Pod) policy.Evaluator {
		if unknown || !inScope(pod) {
			return annotationsOnly
		}
		return e
	}
}

// protectedAs is rest's tenant policies as if made under restrictions'
// protected namespaces and priority classes.
type protectedAs struct {
	rest         policy.Tenants
	restrictions policy.Restrictions
}

func (p protectedAs) For(namespace string) []*policy.TenantPolicy {
	list := p.rest.For(namespace)
	out := make([]*policy.TenantPolicy, len(list))
	for i, t := range list {
		out[i] = t.ProtectedAs(p.restrictions)
	}
	return out
}

// inScopeOf reports whether a pod was in scope s: its namespace and label
// selector (parsed once, here).
func inScopeOf(s decisionScope) func(*corev1.Pod) bool {
	selector, err := labels.Parse(s.LabelSelector)
	if err != nil {
		selector = labels.Everything() // recorded by a process that parsed it
	}
	return func(pod *corev1.Pod) bool {
		return (s.Namespace == "" || pod.Namespace == s.Namespace) && selector.Matches(labels.Set(pod.Labels))
	}
}

// run publishes held waves on the record Lease, reports each on it in a
// Warning Event, and takes their approvals, until ctx ends.
func (w *policyWaves) run(ctx context.Context) {
	w.options.Record.Keep(ctx, w.guard, w.recordedHold, w.clock, waveRecordInterval, func(h wave.Hold) {
		w.reporter.RemovalsHeld(w.options.Record.Ref(), waveChange(h.Source), h.Pods, w.options.Record.ApproveCommand(h.ID))
	}, func(h wave.Hold, keys []string) {
		w.reporter.RemovalsApproved(w.options.Record.Ref(), h.ID, len(keys))
		for _, k := range keys {
			if name, err := cache.ParseObjectName(k); err == nil {
				w.requeue(name)
			}
		}
	})
}

// waveChange says in an Event what made a held change of the cluster's policy.
func waveChange(source string) string {
	if source == wave.SourceStartup {
		return "the start with a policy file or scope (namespace, label selector, annotation prefix, tenant policies, dry run) other than the one recorded on this Lease (none recorded: a first install on a backlog)"
	}
	return "the reloaded policy file"
}

// readRecord reads the record (the Lease and the ConfigMap beside it),
// retrying for StartReadFor (wave.ReadAtStart). The start fails when it
// cannot be read, rather than act on a change it cannot measure.
func (w *policyWaves) readRecord(ctx context.Context) (wave.Stored, error) {
	var stored wave.Stored
	err := wave.ReadAtStart(ctx, w.options.StartReadFor, func(err error) bool { return !apierrors.IsForbidden(err) }, func(ctx context.Context) error {
		var err error
		stored, err = w.options.Record.Read(ctx)
		return err
	})
	if err != nil {
		return wave.Stored{}, fmt.Errorf("--hold-waves: the policy the last leader acted on: %w", err)
	}
	return stored, nil
}

// start measures the start against the policy the last leader acted on, as
// the record holds it, before any worker decides: the same rules in
// the same scope hold nothing; other rules, or the same in another scope
// (decisionScope), are a change like a reload, and its wave is held when
// too large; none recorded (a first install) is measured against no rules:
// the pods the policy's rules make due by now+window are the wave, the
// pods' own annotations are not. A policy recorded by its hash alone (too
// large to record) counts as none.
func (w *policyWaves) start(ctx context.Context, stored wave.Stored) {
	w.recordedHold, _ = stored.Held()
	hash, recorded := stored.Baseline()
	e := w.evaluator()
	current := recordJSON(e, w.scope)
	if hash != "" && hash == wave.BaselineHash(current) {
		w.guard.Rebase(current, w.decider(e))
		return
	}
	var oldDecide wave.Decide
	scope := w.scope
	if recorded != nil {
		if rules, s, ok := parseRecord(recorded, w.scope); ok {
			scope = s
			oldDecide = w.scopedDecider(rules, s)
		}
	}
	if oldDecide == nil {
		// None recorded: measured against no rules at all, so that the pods'
		// own deadlines (their annotations) are never in the wave.
		recorded, oldDecide = nil, w.decider(&policy.Evaluator{})
	}
	w.guard.Rebase(recorded, oldDecide)
	logger := klog.FromContext(ctx)
	scopeChanged := recorded != nil && !reflect.DeepEqual(scope, w.scope)
	if h, held := w.guard.Change(wave.SourceStartup, current, w.decider(e), podcache.Pods(w.pods), w.now()); held {
		logger.Info("Holding the removals of the start: its policy makes too many pods due at once against the one recorded (none: a first install)",
			"change", h.ID, "pods", h.Pods, "firstInstall", recorded == nil, "scopeChanged", scopeChanged,
			"recordedScope", scope, "scope", w.scope, "approve", w.options.Record.ApproveCommand(h.ID))
	} else {
		logger.Info("Started with a policy or scope other than the one recorded; its wave is small enough",
			"firstInstall", recorded == nil, "scopeChanged", scopeChanged)
	}
}

// scopedDecider decides pods as the recorded policy did: by its rules, in
// its scope (recordedEvaluator), with the running evaluator's other parts
// read at each call.
func (w *policyWaves) scopedDecider(rules *policy.Policy, s decisionScope) wave.Decide {
	return func(pod *corev1.Pod, now time.Time) (policy.Decision, error) {
		e := recordedEvaluator(*w.evaluator(), rules, s, w.scope)(pod)
		return w.decideWith(&e, pod, now)
	}
}

// waveRecordInterval is how often the record Lease is read for an approval.
const waveRecordInterval = 2 * time.Second
