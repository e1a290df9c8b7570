package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"

	"github.com/podjanitor/podjanitor/internal/namespacecontroller"
	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/internal/tenantcontroller"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned"
	"github.com/podjanitor/podjanitor/policy"
)

// planEntry is one pod that has a deadline; planInvalid one whose annotation
// does not parse or is not one podjanitor knows.
type planEntry struct {
	Namespace string    `json:"namespace"`
	Pod       string    `json:"pod"`
	Source    string    `json:"source"`
	Reason    string    `json:"reason"`
	Rule      string    `json:"rule,omitempty"`
	Policy    string    `json:"policy,omitempty"` // namespace/name of the tenant policy
	Action    string    `json:"action"`
	Deadline  time.Time `json:"deadline"`
	In        string    `json:"in"`
	Overdue   bool      `json:"overdue"`
	// Held: due, but held with the change of planHold (or, for a tenant
	// policy's change, HeldChange).
	Held       bool   `json:"held,omitempty"`
	HeldChange string `json:"heldChange,omitempty"`
	// Rank is the pod's place when its rule keeps a number of pods.
	Rank *planRank `json:"rank,omitempty"`
}

// planRank is a pod's place among the pods of a rule that keeps a number
// of them (keepNewest, maxPods): 1 is the newest.
type planRank struct {
	Group      string `json:"group,omitempty"`
	Rank       int    `json:"rank,omitempty"`
	Of         int    `json:"of,omitempty"`
	KeepNewest int32  `json:"keepNewest,omitempty"`
	// InNamespace is the pod's place among the rule's pods of its
	// namespace, which MaxPods bounds.
	InNamespace int   `json:"inNamespace,omitempty"`
	MaxPods     int32 `json:"maxPods,omitempty"`
}

// newPlanRank is d's place, nil when its rule keeps no number of pods.
func newPlanRank(c *policy.CountPlace) *planRank {
	if c == nil || !c.Known {
		return nil
	}
	return &planRank{Group: c.Group, Rank: c.Rank + 1, Of: c.Size, KeepNewest: c.KeepNewest, InNamespace: c.NamespaceRank + 1, MaxPods: c.MaxPods}
}

// String is how the table shows the place: "2/5 owner Job/a, keeps 3".
func (r *planRank) String() string {
	if r == nil {
		return ""
	}
	var parts []string
	if r.KeepNewest > 0 {
		parts = append(parts, fmt.Sprintf("%d/%d %s, keeps %d", r.Rank, r.Of, r.Group, r.KeepNewest))
	}
	if r.MaxPods > 0 {
		parts = append(parts, fmt.Sprintf("%d in namespace, max %d", r.InNamespace, r.MaxPods))
	}
	return strings.Join(parts, "; ")
}

// listJobControllers lists the Jobs the daemon would watch, for their
// CronJobs (policy.Controllers); nil, logged, when it cannot.
func listJobControllers(ctx context.Context, client metadata.Interface, scope scopeFlags) policy.Controllers {
	list, err := client.Resource(jobsResource).Namespace(scope.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		klog.Background().Info("Cannot list Jobs: a CronJob's pods are grouped by their Jobs", "err", err)
		return nil
	}
	byName := map[string]*metav1.PartialObjectMetadata{}
	for i := range list.Items {
		byName[list.Items[i].Namespace+"/"+list.Items[i].Name] = &list.Items[i]
	}
	return func(namespace string, owner *metav1.OwnerReference) *metav1.OwnerReference {
		if m := byName[namespace+"/"+owner.Name]; m != nil && m.UID == owner.UID {
			return metav1.GetControllerOfNoCopy(m)
		}
		return nil
	}
}

// planRanks places pods by counting them, for plan's decisions.
func planRanks(pods []*corev1.Pod) policy.Ranks {
	byNamespace := map[string][]*corev1.Pod{}
	for _, p := range pods {
		byNamespace[p.Namespace] = append(byNamespace[p.Namespace], p)
	}
	return &policy.BatchRanks{Pods: func(namespace string) []*corev1.Pod { return byNamespace[namespace] }}
}

// planHold is the held change of the policy file, as podjanitor's Lease
// records it, when the plan's policy file is that change.
type planHold struct {
	Change  string `json:"change"`
	Pods    int    `json:"pods"`
	Approve string `json:"approve"`
	// Approved is the approval found where the hold is (the
	// podjanitor.io/approve-wave annotation), if any: the held change's
	// (podjanitor takes it within seconds) or another's (it approves nothing).
	Approved string `json:"approved,omitempty"`
}

// approvalLine says what the approval found beside a hold does, for plan's
// text ("" for none).
func (h planHold) approvalLine(indent string) string {
	switch h.Approved {
	case "":
		return ""
	case h.Change:
		return fmt.Sprintf("%sapproved: %s=%s is there; podjanitor takes it within seconds, removes the held pods at the cap, and takes the approval off (used once).\n", indent, wave.AnnotationApprove, h.Approved)
	}
	return fmt.Sprintf("%snot approved: %s=%s names another change; it approves nothing here (an earlier occurrence's approval is used).\n", indent, wave.AnnotationApprove, h.Approved)
}

type planInvalid struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Error     string `json:"error"`
}

// planTenant is a tenant policy plan read (with --tenant-policies): used,
// or why not.
type planTenant struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Used      bool   `json:"used"`
	Reason    string `json:"reason,omitempty"`
	Error     string `json:"error,omitempty"`
	// Held is the policy's held change, as its status says (not approved).
	Held *planHold `json:"held,omitempty"`
	// HeldDeletion: the held change is the policy's deletion (the policy
	// is being deleted, its finalizer keeps it).
	HeldDeletion bool `json:"heldDeletion,omitempty"`
	// rules are a policy's being deleted, whose deletion is held.
	rules *policy.TenantPolicy
	// changed: the held change is of the policy's rules (a generation
	// after its first), whose earlier rules are not known.
	changed bool
}

type planReport struct {
	GeneratedAt time.Time      `json:"generatedAt"`
	Pods        []planEntry    `json:"pods"`
	Totals      map[string]int `json:"totals"`
	Invalid     []planInvalid  `json:"invalid"`
	// KeptForRank are the pods a rule keeps for their place among the
	// newest of their group (keepNewest): no deadline while they are.
	KeptForRank []planEntry `json:"keptForRank,omitempty"`
	// TenantPolicies are the tenant policies read; absent without --tenant-policies.
	TenantPolicies []planTenant `json:"tenantPolicies,omitempty"`
	Scanned        int          `json:"scanned"`
	// Hold is the held change that the plan's policy file is; absent when none.
	Hold *planHold `json:"hold,omitempty"`
	// NamespaceHolds are the held changes of namespaces' labels or keep
	// annotation, as podjanitor's Lease records them (not approved).
	NamespaceHolds []planNamespaceHold `json:"namespaceHolds,omitempty"`
	// SpreadHold is the held change of many namespaces together, as the
	// Lease records it (its pods are not marked: the leader alone knows them).
	SpreadHold *planSpreadHold `json:"spreadHold,omitempty"`
}

// planSpreadHold is the held change of many namespaces together.
type planSpreadHold struct {
	planHold
	Namespaces string `json:"namespaces"`
}

// markSpreadHeld reads the held change of many namespaces together from
// the record Lease (nil: none).
func markSpreadHeld(r *planReport, record wave.Record, lease *coordinationv1.Lease) {
	if lease == nil || lease.Annotations[wave.AnnotationHeldSpread] == "" {
		return
	}
	id := lease.Annotations[wave.AnnotationHeldSpread]
	pods, _ := strconv.Atoi(lease.Annotations[wave.AnnotationHeldSpreadPods])
	r.SpreadHold = &planSpreadHold{
		planHold:   planHold{Change: id, Pods: pods, Approve: record.ApproveCommand(id), Approved: lease.Annotations[wave.AnnotationApprove]},
		Namespaces: lease.Annotations[wave.AnnotationHeldSpreadNamespaces],
	}
}

// planNamespaceHold is a namespace's held change.
type planNamespaceHold struct {
	Namespace string `json:"namespace"`
	planHold
}

// runPlan is `podjanitor plan`: what the daemon would do to the cluster now.
func runPlan(args []string) int {
	o, code, done := parseCommand(planCommand, args)
	if done {
		return code
	}
	if err := plan(context.Background(), o, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "podjanitor plan: %v\n", err)
		return 1
	}
	return 0
}

func plan(ctx context.Context, o *flagValues, out io.Writer) error {
	evaluator, _, err := loadEvaluator(o.configFile, o.scope.annotationPrefix)
	if err != nil {
		return err
	}
	// "In 11s" in the API server's time, as the daemon counts: the Date
	// headers of the listing's responses give the offset (uncalibrated, to
	// within a second and a round trip).
	clients, err := connect(klog.Background(), o.cluster)
	if err != nil {
		return err
	}
	namespaces, err := listNamespaces(ctx, clients.metadata, o.scope)
	if err != nil {
		return err
	}
	pods, err := listPods(ctx, clients.kube, o.scope)
	if err != nil {
		return err
	}
	var tenants []planTenant
	if o.tenants.enabled {
		var used policy.StaticTenants
		if used, tenants, err = listTenantPolicies(ctx, clients.podjanitor, o.scope, o.tenants.restrictions); err != nil {
			return err
		}
		evaluator.Tenants = used
	}
	evaluator.Ranks = planRanks(pods)
	evaluator.Controllers = listJobControllers(ctx, clients.metadata, o.scope)
	report := buildPlan(evaluator, pods, namespaces, clients.clock.Now().Add(clients.apiClock.Offset()))
	report.TenantPolicies = tenants
	markTenantHeld(&report, evaluator, pods, namespaces, report.GeneratedAt)
	record := wave.Record{Client: clients.kube, Namespace: cmp.Or(o.lease.namespace, ownNamespace()), Name: o.lease.name}
	stored, err := record.Read(ctx)
	if err != nil { // a reader without access to the record still gets the plan
		klog.Background().Info("Cannot tell held pods from others", "err", err)
	}
	scope := newDecisionScope(o.scope.namespace, o.scope.labelSelector, o.tenants.enabled,
		newTenantScope(o.tenants.restrictions, o.tenants.limits), false, o.scope.annotationPrefix)
	if err := markHeld(&report, record, stored, evaluator, scope, pods, namespaces, report.GeneratedAt); err != nil {
		return err
	}
	markNamespaceHeld(&report, stored, evaluator, pods, namespaces, report.GeneratedAt)
	markSpreadHeld(&report, record, stored.Lease)
	if o.output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	}
	return printPlan(out, report)
}

func listPods(ctx context.Context, client kubernetes.Interface, scope scopeFlags) ([]*corev1.Pod, error) {
	var pods []*corev1.Pod
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		opts.LabelSelector = scope.labelSelector
		return client.CoreV1().Pods(scope.namespace).List(ctx, opts)
	})
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		pods = append(pods, obj.(*corev1.Pod))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	return pods, nil
}

// listNamespaces reads the metadata of the namespaces the daemon would watch
// (only --namespace when it is set), as its namespace cache holds them.
func listNamespaces(ctx context.Context, client metadata.Interface, scope scopeFlags) (map[string]*policy.Namespace, error) {
	namespaces := map[string]*policy.Namespace{}
	transform := podcache.NamespaceTransform(keepAnnotationKey(scope.annotationPrefix))
	p := pager.New(func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		opts.FieldSelector = namespaceFieldSelector(scope.namespace)
		return client.Resource(corev1.SchemeGroupVersion.WithResource("namespaces")).List(ctx, opts)
	})
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		lean, err := transform(obj)
		if err != nil {
			return err
		}
		m := lean.(*metav1.PartialObjectMetadata)
		namespaces[m.Name] = &policy.Namespace{Labels: m.Labels, Annotations: m.Annotations}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	return namespaces, nil
}

// buildPlan decides every pod as the daemon would at now; a pod whose
// namespace is not in namespaces is left alone, as the daemon leaves it.
func buildPlan(e *policy.Evaluator, pods []*corev1.Pod, namespaces map[string]*policy.Namespace, now time.Time) planReport {
	r := planReport{GeneratedAt: now.UTC(), Totals: map[string]int{}, Pods: []planEntry{}, Invalid: []planInvalid{}, Scanned: len(pods)}
	if e.Ranks == nil {
		ranked := *e
		ranked.Ranks = planRanks(pods)
		e = &ranked
	}
	for _, pod := range pods {
		d, err := e.Decide(pod, namespaces[pod.Namespace], now)
		if err != nil {
			r.Invalid = append(r.Invalid, planInvalid{Namespace: pod.Namespace, Pod: pod.Name, Error: err.Error()})
			continue
		}
		if !d.HasDeadline() {
			if rank := newPlanRank(d.Count); rank != nil && !d.Kept {
				r.KeptForRank = append(r.KeptForRank, planEntry{Namespace: pod.Namespace, Pod: pod.Name, Source: d.Source, Rule: d.Rule, Policy: d.Policy, Rank: rank})
			}
			continue
		}
		left := d.Deadline.Sub(now)
		r.Pods = append(r.Pods, planEntry{
			Namespace: pod.Namespace, Pod: pod.Name, Source: d.Source, Reason: d.Reason, Rule: d.Rule, Policy: d.Policy,
			Action: string(d.Action), Deadline: d.Deadline.UTC(), In: relative(left), Overdue: left <= 0, Rank: newPlanRank(d.Count),
		})
		r.Totals[d.Source]++
	}
	sort.SliceStable(r.KeptForRank, func(i, j int) bool {
		a, b := r.KeptForRank[i], r.KeptForRank[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Rank.Group != b.Rank.Group {
			return a.Rank.Group < b.Rank.Group
		}
		return a.Rank.Rank < b.Rank.Rank
	})
	sort.SliceStable(r.Pods, func(i, j int) bool {
		a, b := r.Pods[i], r.Pods[j]
		if !a.Deadline.Equal(b.Deadline) {
			return a.Deadline.Before(b.Deadline)
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Pod < b.Pod
	})
	return r
}

// markHeld marks HELD the due pods of a held change (the record's, as
// read), when the plan's policy file is that change: due by it, not by the
// policy podjanitor acts on (recorded beside the hold).
func markHeld(r *planReport, record wave.Record, stored wave.Stored, e *policy.Evaluator, scope decisionScope, pods []*corev1.Pod,
	namespaces map[string]*policy.Namespace, now time.Time) error {
	id, n := stored.Held()
	_, baselineJSON := stored.Baseline()
	current := recordJSON(e, scope)
	// A first install's hold (no baseline) is against no rules: every pod
	// due by a rule, not by its own annotations.
	firstInstall := id != "" && baselineJSON == nil && wave.ChangeID(nil, current) == id
	if !firstInstall && (id == "" || baselineJSON == nil || wave.ChangeID(baselineJSON, current) != id) {
		return nil
	}
	noRules := *e
	noRules.Policy = nil
	baseline := func(*corev1.Pod) policy.Evaluator { return noRules }
	if !firstInstall {
		rules, recorded, ok := parseRecord(baselineJSON, scope)
		if !ok {
			return fmt.Errorf("lease %s/%s: the held wave's baseline does not parse", record.Namespace, record.Name)
		}
		baseline = recordedEvaluator(*e, rules, recorded, scope)
	}
	byKey := map[string]*corev1.Pod{}
	for _, p := range pods {
		byKey[p.Namespace+"/"+p.Name] = p
	}
	for i := range r.Pods {
		entry := &r.Pods[i]
		if !entry.Overdue {
			continue
		}
		pod := byKey[entry.Namespace+"/"+entry.Pod]
		old := baseline(pod)
		if held, _ := wave.HeldBy(decideBy(&old, namespaces[entry.Namespace]), pod, now); !held {
			continue
		}
		entry.Held = true
	}
	r.Hold = &planHold{Change: id, Pods: n, Approve: record.ApproveCommand(id), Approved: stored.Approval()}
	return nil
}

// markNamespaceHeld marks HELD the due pods of the namespaces whose change
// of labels or keep annotation is held (the record Lease's, as read: nil,
// none): those due with the namespace as it is and not as it was before the
// change, as podjanitor holds them; a change approved on its Namespace is
// not held.
func markNamespaceHeld(r *planReport, stored wave.Stored, e *policy.Evaluator, pods []*corev1.Pod,
	namespaces map[string]*policy.Namespace, now time.Time) {
	held, err := stored.HeldScopes()
	if err != nil {
		klog.Background().Info("Cannot tell the pods of held namespace changes from others", "err", err)
		return
	}
	byKey := map[string]*corev1.Pod{}
	for _, p := range pods {
		byKey[p.Namespace+"/"+p.Name] = p
	}
	for _, name := range slices.Sorted(maps.Keys(held)) {
		h, ns := held[name], namespaces[name]
		if ns == nil || ns.Annotations[podcache.ApproveWaveAnnotation] == h.Change {
			continue
		}
		m, err := namespacecontroller.NamespaceFromJSON(name, h.Before)
		if err != nil {
			continue
		}
		before := policy.Namespace{Labels: m.Labels, Annotations: m.Annotations}
		marked := 0
		for i := range r.Pods {
			entry := &r.Pods[i]
			if !entry.Overdue || entry.Held || entry.Namespace != name {
				continue
			}
			if held, _ := wave.HeldBy(decideBy(e, &before), byKey[entry.Namespace+"/"+entry.Pod], now); !held {
				continue
			}
			entry.Held, entry.HeldChange = true, h.Change
			marked++
		}
		if marked > 0 {
			r.NamespaceHolds = append(r.NamespaceHolds, planNamespaceHold{Namespace: name,
				planHold: planHold{Change: h.Change, Pods: h.Pods, Approve: namespacecontroller.ApproveCommand(name, h.Change),
					Approved: ns.Annotations[podcache.ApproveWaveAnnotation]}})
		}
	}
}

// markTenantHeld marks HELD the due pods of the tenant policies whose
// change is held (their status says so): those due with the policy and not
// without it, as podjanitor holds them after a restart.
func markTenantHeld(r *planReport, e *policy.Evaluator, pods []*corev1.Pod, namespaces map[string]*policy.Namespace, now time.Time) {
	if e.Tenants == nil {
		return
	}
	byKey := map[string]*corev1.Pod{}
	for _, p := range pods {
		byKey[p.Namespace+"/"+p.Name] = p
	}
	for _, t := range r.TenantPolicies {
		if t.Held == nil {
			continue
		}
		// A held change: the pods due with the policy and not without it
		// (for a change of its rules: not by the pods' own annotations).
		// A held deletion (the policy is not used): those due without it
		// and not with it.
		other := *e
		list := slices.DeleteFunc(slices.Clone(e.Tenants.For(t.Namespace)), func(q *policy.TenantPolicy) bool { return q.Name == t.Name })
		if t.HeldDeletion {
			list = append(list, t.rules)
			slices.SortFunc(list, func(a, b *policy.TenantPolicy) int { return strings.Compare(a.Name, b.Name) })
		}
		other.Tenants = tenantcontroller.Overlay(t.Namespace, list, e.Tenants)
		if t.changed {
			// As the daemon holds it after a restart: its earlier rules
			// are not known, so a pod goes by its own annotations only.
			other.Policy, other.Tenants = nil, nil
		}
		for i := range r.Pods {
			entry := &r.Pods[i]
			if !entry.Overdue || entry.Held || entry.Namespace != t.Namespace {
				continue
			}
			if held, _ := wave.HeldBy(decideBy(&other, namespaces[entry.Namespace]), byKey[entry.Namespace+"/"+entry.Pod], now); !held {
				continue
			}
			entry.Held, entry.HeldChange = true, t.Held.Change
		}
	}
}

// listTenantPolicies reads the tenant policies of --namespace (else of
// every namespace) and converts them as the daemon does: the usable ones,
// and why each of the others is not used.
func listTenantPolicies(ctx context.Context, client versioned.Interface, scope scopeFlags, r policy.Restrictions) (policy.StaticTenants, []planTenant, error) {
	var used []*policy.TenantPolicy
	var all []planTenant
	list, err := client.PodjanitorV1alpha1().PodLifetimePolicies(scope.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("listing tenant policies (%s): %w", policy.TenantKind, err)
	}
	for i := range list.Items {
		p := &list.Items[i]
		entry := planTenant{Namespace: p.Namespace, Name: p.Name, Used: true}
		converted, err := tenantcontroller.Convert(p, r)
		if err == nil && p.DeletionTimestamp != nil {
			// Not used, as the daemon does not use it; its deletion may be held.
			entry.Used, entry.Reason = false, tenantcontroller.DeletingReason
			entry.Error = fmt.Sprintf("the policy is being deleted (since %s): its rules give no deadline", p.DeletionTimestamp.UTC().Format(time.RFC3339))
			if h, held := tenantcontroller.HeldInStatus(p); held && p.Annotations[wave.AnnotationApprove] != h.ID {
				entry.Held = &planHold{Change: h.ID, Pods: h.Pods, Approve: tenantcontroller.ApproveCommand(p.Namespace, p.Name, h.ID),
					Approved: p.Annotations[wave.AnnotationApprove]}
				entry.HeldDeletion, entry.rules = true, converted
			}
		} else if err != nil {
			entry.Used, entry.Error = false, err.Error()
			if te, ok := err.(*policy.TenantError); ok {
				entry.Reason = te.Reason
			}
		} else {
			used = append(used, converted)
			if h, held := tenantcontroller.HeldInStatus(p); held && p.Annotations[wave.AnnotationApprove] != h.ID {
				entry.Held = &planHold{Change: h.ID, Pods: h.Pods, Approve: tenantcontroller.ApproveCommand(p.Namespace, p.Name, h.ID),
					Approved: p.Annotations[wave.AnnotationApprove]}
				entry.changed = p.Generation > 1
			}
		}
		all = append(all, entry)
	}
	return policy.NewStaticTenants(used...), all, nil
}

// farFuture is where plan stops counting: a "never" placeholder such as
// expires-at 9999-12-31 lies past what a time.Duration holds (~292 years).
const farFuture = 100 * 365 * 24 * time.Hour

func relative(d time.Duration) string {
	switch {
	case d <= 0:
		return "overdue"
	case d >= farFuture:
		return "in over 100 years"
	}
	return "in " + policy.FormatDuration(d.Round(time.Second))
}

func printPlan(out io.Writer, r planReport) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	ranked := slices.ContainsFunc(r.Pods, func(e planEntry) bool { return e.Rank != nil })
	rankColumn := func(e planEntry) string {
		if !ranked {
			return ""
		}
		return "\t" + e.Rank.String()
	}
	fmt.Fprintln(w, "NAMESPACE\tPOD\tBY\tACTION\tDEADLINE\tWHEN"+map[bool]string{true: "\tRANK"}[ranked])
	for _, e := range r.Pods {
		when := e.In
		switch {
		case e.HeldChange != "":
			when = "HELD " + e.HeldChange
		case e.Held && r.Hold != nil:
			when = "HELD " + r.Hold.Change
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s%s\n", e.Namespace, e.Pod, e.Source, e.Action, e.Deadline.Format(time.RFC3339), when, rankColumn(e))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%d of %d pod(s) have a deadline.\n", len(r.Pods), r.Scanned)
	sources := make([]string, 0, len(r.Totals))
	for s := range r.Totals {
		sources = append(sources, s)
	}
	sort.Strings(sources)
	for _, s := range sources {
		fmt.Fprintf(out, "  %-40s %d\n", s, r.Totals[s])
	}
	if len(r.KeptForRank) > 0 {
		fmt.Fprintf(out, "\n%d pod(s) kept for their rank (no deadline while among the newest of their group):\n", len(r.KeptForRank))
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "  NAMESPACE\tPOD\tBY\tRANK")
		for _, e := range r.KeptForRank {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", e.Namespace, e.Pod, e.Source, e.Rank)
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if h := r.Hold; h != nil {
		held := 0
		for _, e := range r.Pods {
			if e.Held && e.HeldChange == "" {
				held++
			}
		}
		fmt.Fprintf(out, "\n%d pod(s) HELD: the policy's change %s made %d pod(s) due at once; podjanitor removes none of them until it is approved:\n  %s\nor the policy file is reverted.\n%s",
			held, h.Change, h.Pods, h.Approve, h.approvalLine(""))
	}
	for _, h := range r.NamespaceHolds {
		fmt.Fprintf(out, "\nHELD: namespace %s: its change %s of labels or keep annotation made %d pod(s) due at once; podjanitor removes none of them until it is approved:\n  %s\nor the change is reverted.\n%s",
			h.Namespace, h.Change, h.Pods, h.Approve, h.approvalLine(""))
	}
	if h := r.SpreadHold; h != nil {
		fmt.Fprintf(out, "\nHELD on the Lease: changes of many namespaces' tenant policies, labels or keep made together (%s) made %d pod(s) due at once; podjanitor removes none of them until it is approved:\n  %s\n%s",
			h.Namespaces, h.Pods, h.Approve, h.approvalLine(""))
	}
	var notUsed []planTenant
	for _, t := range r.TenantPolicies {
		if !t.Used {
			notUsed = append(notUsed, t)
		}
	}
	if len(r.TenantPolicies) > 0 {
		fmt.Fprintf(out, "\n%d tenant policy(ies) read, %d used.\n", len(r.TenantPolicies), len(r.TenantPolicies)-len(notUsed))
	}
	for _, t := range notUsed {
		fmt.Fprintf(out, "  not used: %s/%s (%s): %s\n", t.Namespace, t.Name, t.Reason, t.Error)
	}
	for _, t := range r.TenantPolicies {
		if h := t.Held; h != nil && t.HeldDeletion {
			fmt.Fprintf(out, "  held: %s/%s: its deletion (change %s) made %d pod(s) of its namespace due at once; none of them is removed, and the policy stays, until it is approved:\n    %s\n%s",
				t.Namespace, t.Name, h.Change, h.Pods, h.Approve, h.approvalLine("  "))
		} else if h != nil {
			fmt.Fprintf(out, "  held: %s/%s: its change %s made %d pod(s) of its namespace due at once; none of them is removed until it is approved:\n    %s\n  or the policy is reverted.\n%s",
				t.Namespace, t.Name, h.Change, h.Pods, h.Approve, h.approvalLine("  "))
		}
	}
	if len(r.Invalid) > 0 {
		fmt.Fprintf(out, "\n%d pod(s) have an annotation that does not parse or that podjanitor does not know; podjanitor leaves them alone:\n", len(r.Invalid))
		for _, i := range r.Invalid {
			fmt.Fprintf(out, "  %s/%s: %s\n", i.Namespace, i.Pod, i.Error)
		}
	}
	return nil
}

// decideBy decides pods by e with ns for their namespace: a baseline for
// wave.HeldBy.
func decideBy(e *policy.Evaluator, ns *policy.Namespace) wave.Decide {
	return func(pod *corev1.Pod, now time.Time) (policy.Decision, error) { return e.Decide(pod, ns, now) }
}
