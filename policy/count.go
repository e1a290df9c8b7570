package policy

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Retention by count: a rule with keepNewest keeps the newest pods of each
// group of the pods it decides, a rule with maxPods the newest of them in a
// namespace. A pod's place is counted among the pods the rule decides by
// its match and clock (the first rule that applies to it, tenant policies'
// first), whatever its own annotations say: a pod kept by its keep
// annotation still takes its place. Pods being deleted and mirror pods
// take none. Newest is by finish time for finished pods, by creation for
// the others; ties by creation, then name.

// How keepNewest groups a rule's pods (Rule.GroupBy).
const (
	// GroupByOwner groups pods by their controlling owner (a Job, a
	// ReplicaSet, a StatefulSet), by its UID: an owner deleted and created
	// again under the same name starts a group of its own. A namespace's
	// pods without one are one group.
	GroupByOwner = "owner"
	// GroupByLabelPrefix + a label key groups pods by that label's value;
	// a namespace's pods without the label are one group.
	GroupByLabelPrefix = "label:"
)

// The most keepNewest and maxPods may be.
const (
	MaxKeepNewest = 100000
	MaxMaxPods    = 1000000
)

// countFile is what a rule says about retention by count and notice, as
// written (the policy file's rules and a tenant's alike).
type countFile struct {
	KeepNewest    *int32  `json:"keepNewest"`
	GroupBy       *string `json:"groupBy"`
	MaxPods       *int32  `json:"maxPods"`
	RemovalNotice *string `json:"removalNotice"`
}

// setCount sets rule's count fields from what was written.
func setCount(rule *Rule, keepNewest *int32, groupBy *string, maxPods *int32, notice *string) error {
	if keepNewest != nil {
		if *keepNewest < 1 {
			return errors.New("keepNewest: at least 1 (leave it out to keep no pod by count)")
		}
		rule.KeepNewest = *keepNewest
	}
	if groupBy != nil {
		if rule.KeepNewest == 0 {
			return errors.New("groupBy: only with keepNewest")
		}
		rule.GroupBy = *groupBy
	}
	if maxPods != nil {
		if *maxPods < 1 {
			return errors.New("maxPods: at least 1 (leave it out to bound no namespace)")
		}
		rule.MaxPods = *maxPods
	}
	if notice != nil {
		d, err := ParseDuration(*notice)
		if err != nil {
			return fmt.Errorf("removalNotice: %w", err)
		}
		rule.RemovalNotice = d
	}
	return nil
}

// validateCount checks a rule's count and notice fields.
func validateCount(rule Rule) error {
	switch {
	case rule.KeepNewest < 0:
		return errors.New("keepNewest: at least 1 (leave it out to keep no pod by count)")
	case rule.KeepNewest > MaxKeepNewest:
		return fmt.Errorf("keepNewest: at most %d", MaxKeepNewest)
	case rule.MaxPods < 0:
		return errors.New("maxPods: at least 1 (leave it out to bound no namespace)")
	case rule.MaxPods > MaxMaxPods:
		return fmt.Errorf("maxPods: at most %d", MaxMaxPods)
	case rule.RemovalNotice < 0:
		return fmt.Errorf("removalNotice: %s is negative", rule.RemovalNotice)
	case rule.GroupBy == "" || rule.GroupBy == GroupByOwner:
		return nil
	case rule.KeepNewest == 0:
		return errors.New("groupBy: only with keepNewest")
	}
	if key, ok := strings.CutPrefix(rule.GroupBy, GroupByLabelPrefix); !ok || len(validation.IsQualifiedName(key)) > 0 {
		return fmt.Errorf(`groupBy: %q is not "owner" or "label:" and a label key (like "label:app.kubernetes.io/name")`, rule.GroupBy)
	}
	return nil
}

// counts reports whether the rule keeps a number of pods.
func (r *Rule) counts() bool { return r.KeepNewest > 0 || r.MaxPods > 0 }

// Controllers tells the controller of a pod's owner: a Job's CronJob. nil,
// or a nil answer: not known (the pod is grouped by its own owner).
type Controllers func(namespace string, owner *metav1.OwnerReference) *metav1.OwnerReference

// group is pod's group under the rule's GroupBy: its key (unique in the
// namespace) and how it is shown. A Job controlled by a CronJob groups its
// pods with the CronJob's other Jobs' (controllers says which).
func (r *Rule) group(pod *corev1.Pod, controllers Controllers) (key, shown string) {
	if label, ok := strings.CutPrefix(r.GroupBy, GroupByLabelPrefix); ok {
		if v, ok := pod.Labels[label]; ok {
			return "l=" + v, "label " + label + "=" + v
		}
		return "l", "label " + label + " absent"
	}
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil {
		return "o", "no owner"
	}
	if ref.Kind == "Job" && controllers != nil {
		if up := controllers(pod.Namespace, ref); up != nil && up.Kind == "CronJob" {
			ref = up
		}
	}
	return "o=" + string(ref.UID), "owner " + ref.Kind + "/" + ref.Name
}

// SortTime is when a pod counts as new: its finish for finished pods, its
// creation for the others.
func SortTime(pod *corev1.Pod) time.Time {
	if t, ok := FinishTime(pod); ok {
		return t
	}
	return pod.CreationTimestamp.Time
}

var policySeq atomic.Uint64

// nextSeq numbers Policies: a rule's groups are the groups of one Policy's
// rule (Rule.id), so a reload or a tenant policy's new generation counts
// afresh.
func nextSeq() uint64 { return policySeq.Add(1) }

// ruleID names rule i of p in the groups.
func (p *Policy) ruleID(i int) string {
	return strconv.FormatUint(p.seq, 10) + "/" + p.Rules[i].Name
}

// Member is a pod's place in one group: the group's ID (the rule's, the
// namespace's and the group's key) and the pod's order in it.
type Member struct {
	Group string
	Entry Entry
	// Limit is the rule's keepNewest or maxPods: a pod that moves across
	// it is decided again.
	Limit int
}

// Entry orders a group's pods: by Sort, then Created (Unix nanoseconds),
// then Key.
type Entry struct {
	Key           string
	Sort, Created int64
}

func (a Entry) compare(b Entry) int {
	if c := cmp.Compare(a.Sort, b.Sort); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Created, b.Created); c != 0 {
		return c
	}
	return strings.Compare(a.Key, b.Key)
}

// ruleRef is the rule that decides a pod by the rules: rule i of p, of
// tenant policy t (nil for the policy file's), whose clock started at start.
type ruleRef struct {
	t     *TenantPolicy
	p     *Policy
	i     int
	start time.Time
}

func (r ruleRef) rule() *Rule { return &r.p.Rules[r.i] }

// members are pod's places under ref's rule: in its group (keepNewest) and
// in its namespace (maxPods).
func (r ruleRef) members(pod *corev1.Pod, key string, controllers Controllers) (owner, namespace Member, shown string) {
	rule := r.rule()
	id := r.p.ruleID(r.i) + "\x00" + pod.Namespace + "\x00"
	e := Entry{Key: key, Sort: SortTime(pod).UnixNano(), Created: pod.CreationTimestamp.UnixNano()}
	if rule.KeepNewest > 0 {
		var g string
		g, shown = rule.group(pod, controllers)
		owner = Member{Group: id + g, Entry: e, Limit: int(rule.KeepNewest)}
	}
	if rule.MaxPods > 0 {
		namespace = Member{Group: id + "*", Entry: e, Limit: int(rule.MaxPods)}
	}
	return owner, namespace, shown
}

// Members are the groups pod takes a place in by e's rules (none when no
// rule that counts decides it); key is the pod's "namespace/name".
func (e *Evaluator) Members(pod *corev1.Pod, ns *Namespace, key string) []Member {
	if ns == nil || IsMirrorPod(pod) || pod.DeletionTimestamp != nil {
		return nil
	}
	ref, ok := e.ruleOf(pod, ns)
	if !ok || !ref.rule().counts() {
		return nil
	}
	owner, namespace, _ := ref.members(pod, key, e.Controllers)
	var out []Member
	for _, m := range []Member{owner, namespace} {
		if m.Group != "" {
			out = append(out, m)
		}
	}
	return out
}

// Counts reports whether any rule of e for namespace keeps a number of
// pods (nil namespace: the policy file's).
func (e *Evaluator) Counts(namespace string) bool {
	if e.Policy != nil && e.Policy.counts {
		return true
	}
	if e.Tenants == nil || namespace == "" {
		return false
	}
	for _, t := range e.Tenants.For(namespace) {
		if t != nil && t.Policy != nil && t.Policy.counts {
			return true
		}
	}
	return false
}

// Ranks says where pods stand in their groups.
type Ranks interface {
	// Place is m's place in its group, 0 the newest, and the group's
	// size; past m.Limit, displaced is when it fell past it (the order time
	// of the pod m.Limit places newer). ok is false when it is not known.
	Place(e *Evaluator, pod *corev1.Pod, ns *Namespace, m Member) (rank, size int, displaced time.Time, ok bool)
}

// count applies the count of d's rule to d: a pod among the newest
// keepNewest of its group has no deadline; one past them goes at its
// clock, not before it fell past; one past the namespace's maxPods goes
// at once (not before its clock started, nor before it fell past).
func (e *Evaluator) count(d *Decision, ref ruleRef, pod *corev1.Pod, ns *Namespace, key string) {
	rule := ref.rule()
	owner, namespace, shown := ref.members(pod, key, e.Controllers)
	place := &CountPlace{Group: shown, KeepNewest: rule.KeepNewest, MaxPods: rule.MaxPods, Known: e.Ranks != nil, Rank: -1, NamespaceRank: -1}
	d.Count = place
	kept := false
	if rule.KeepNewest > 0 {
		rank, size, displaced, ok := e.place(pod, ns, owner)
		place.Rank, place.Size, place.Known = rank, size, place.Known && ok
		switch {
		case !ok || rank < int(rule.KeepNewest):
			kept = true
		case displaced.After(d.Deadline):
			d.Deadline = displaced
		}
	}
	if rule.MaxPods > 0 {
		rank, _, displaced, ok := e.place(pod, ns, namespace)
		place.NamespaceRank, place.Known = rank, place.Known && ok
		if ok && rank >= int(rule.MaxPods) {
			over := latest(ref.start, displaced)
			if kept || over.Before(d.Deadline) {
				d.Deadline = over
			}
			kept = false
		}
	}
	if kept {
		d.Deadline = time.Time{}
	}
}

func (e *Evaluator) place(pod *corev1.Pod, ns *Namespace, m Member) (rank, size int, displaced time.Time, ok bool) {
	if e.Ranks == nil {
		return -1, 0, time.Time{}, false
	}
	return e.Ranks.Place(e, pod, ns, m)
}

// Groups keeps the groups of the pods decided by rules that count, in
// order, changed pod by pod: a pod that comes, goes or moves re-places only
// the pods of its groups. It is the running evaluator's Ranks.
type Groups struct {
	mu     sync.Mutex
	groups map[string]*group
	pods   map[string][]Member
	// versions count the changes by namespace (BatchRanks.Version).
	versions map[string]uint64
	n        atomic.Int64
}

// NewGroups makes an empty Groups.
func NewGroups() *Groups {
	return &Groups{groups: map[string]*group{}, pods: map[string][]Member{}, versions: map[string]uint64{}}
}

// Empty reports whether no pod has a place (the cost of a pod's sync
// without rules that count is this one load).
func (g *Groups) Empty() bool { return g.n.Load() == 0 }

// Set places the pod of key in members (none: it has no place) and returns
// the keys of the other pods that moved across their rule's limit (in or
// out of the newest): they are to be decided again.
func (g *Groups) Set(namespace, key string, members []Member) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.pods[key]
	if slices.Equal(old, members) {
		return nil
	}
	var moved []string
	for _, m := range old {
		moved = append(moved, g.remove(m)...)
	}
	if len(members) == 0 {
		delete(g.pods, key)
	} else {
		members = slices.Clone(members)
		for i := range members {
			moved = append(moved, g.insert(&members[i])...)
		}
		g.pods[key] = members
	}
	g.n.Store(int64(len(g.pods)))
	g.versions[namespace]++
	return slices.DeleteFunc(moved, func(k string) bool { return k == key })
}

// group is one group's pods, oldest first; name is its key in
// Groups.groups, which the places share.
type group struct {
	name    string
	entries []Entry
}

// insert places m (its Group becomes the group's shared name); a pod
// pushed out of the newest m.Limit is returned.
func (g *Groups) insert(m *Member) []string {
	gr := g.groups[m.Group]
	if gr == nil {
		gr = &group{name: m.Group}
		g.groups[m.Group] = gr
	}
	m.Group = gr.name
	i, _ := slices.BinarySearchFunc(gr.entries, m.Entry, Entry.compare)
	gr.entries = slices.Insert(gr.entries, i, m.Entry)
	list := gr.entries
	// The pod now m.Limit places newer than the newest... is pushed out:
	// the one at rank m.Limit, when the new pod is among the newest.
	rank := len(list) - 1 - i
	if out := len(list) - 1 - m.Limit; rank < m.Limit && out >= 0 {
		return []string{list[out].Key}
	}
	return nil
}

// remove takes m's place away; a pod that comes into the newest m.Limit
// is returned.
func (g *Groups) remove(m Member) []string {
	gr := g.groups[m.Group]
	if gr == nil {
		return nil
	}
	i, found := slices.BinarySearchFunc(gr.entries, m.Entry, Entry.compare)
	if !found {
		return nil
	}
	rank := len(gr.entries) - 1 - i
	gr.entries = slices.Delete(gr.entries, i, i+1)
	list := gr.entries
	if len(list) == 0 {
		delete(g.groups, m.Group)
		return nil
	}
	if in := len(list) - m.Limit; rank < m.Limit && in >= 0 {
		return []string{list[in].Key}
	}
	return nil
}

// Version counts the changes of namespace's places.
func (g *Groups) Version(namespace string) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.versions[namespace]
}

// Place is Ranks' Place: the pod's place as last Set.
func (g *Groups) Place(_ *Evaluator, _ *corev1.Pod, _ *Namespace, m Member) (rank, size int, displaced time.Time, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gr := g.groups[m.Group]
	if gr == nil {
		return -1, 0, time.Time{}, false
	}
	list := gr.entries
	i, found := slices.BinarySearchFunc(list, m.Entry, Entry.compare)
	if !found {
		return -1, len(list), time.Time{}, false
	}
	rank = len(list) - 1 - i
	if rank >= m.Limit {
		displaced = time.Unix(0, list[i+m.Limit].Sort).UTC()
	}
	return rank, len(list), displaced, true
}

// BatchRanks places pods by counting their namespace's pods when first
// asked (for the decisions a change is measured by, and plan's): the
// groups of one namespace under one evaluator's rules are counted once,
// and again when Version says the namespace's pods changed.
type BatchRanks struct {
	// Pods lists a namespace's pods.
	Pods func(namespace string) []*corev1.Pod
	// Version, when set, tells a namespace's pods changed since they were
	// counted.
	Version func(namespace string) uint64

	mu   sync.Mutex
	memo map[string]batch
}

// maxBatchMemo bounds what a BatchRanks remembers.
const maxBatchMemo = 4096

type batch struct {
	version uint64
	groups  *Groups
}

// Place is Ranks' Place, counted from the namespace's pods.
func (b *BatchRanks) Place(e *Evaluator, pod *corev1.Pod, ns *Namespace, m Member) (rank, size int, displaced time.Time, ok bool) {
	var version uint64
	if b.Version != nil {
		version = b.Version(pod.Namespace)
	}
	memoKey := pod.Namespace + "\x00" + e.rulesID(pod.Namespace)
	if ns != nil {
		memoKey += "\x00" + labels.Set(ns.Labels).String()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	got, ok := b.memo[memoKey]
	if !ok || got.version != version {
		if len(b.memo) >= maxBatchMemo {
			clear(b.memo) // rules and namespaces gone by
		}
		got = batch{version: version, groups: NewGroups()}
		for _, p := range b.Pods(pod.Namespace) {
			key := p.Namespace + "/" + p.Name
			got.groups.Set(p.Namespace, key, e.Members(p, ns, key))
		}
		if b.memo == nil {
			b.memo = map[string]batch{}
		}
		b.memo[memoKey] = got
	}
	return got.groups.Place(e, pod, ns, m)
}

// rulesID names the rules of e for namespace: the Policies', in order.
func (e *Evaluator) rulesID(namespace string) string {
	var b strings.Builder
	if e.Tenants != nil {
		for _, t := range e.Tenants.For(namespace) {
			if t != nil && t.Policy != nil {
				b.WriteString(strconv.FormatUint(t.Policy.seq, 10))
				if len(t.protected.namespaces)+len(t.protected.classes) > 0 {
					fmt.Fprint(&b, t.protected)
				}
				b.WriteByte(',')
			}
		}
	}
	if e.Policy != nil {
		b.WriteString(strconv.FormatUint(e.Policy.seq, 10))
	}
	return b.String()
}

// Counted places pods by Live for the Running evaluator (its places, set
// pod by pod as it decides them), and by counting their namespace (Batch)
// for every other evaluator: a change measured against the rules acted
// on, a namespace as it was.
type Counted struct {
	Live    *Groups
	Batch   *BatchRanks
	Running func() *Evaluator
}

// Place is Ranks' Place.
func (c Counted) Place(e *Evaluator, pod *corev1.Pod, ns *Namespace, m Member) (rank, size int, displaced time.Time, ok bool) {
	if e == c.Running() {
		return c.Live.Place(e, pod, ns, m)
	}
	return c.Batch.Place(e, pod, ns, m)
}
