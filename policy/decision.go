package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DefaultAnnotationPrefix is the annotation prefix when Evaluator.Prefix is empty.
const DefaultAnnotationPrefix = "podjanitor.io"

// ApproveWaveAnnotation approves a held change, on the object a person
// approves it on (podjanitor's Lease, a Namespace, a PodLifetimePolicy),
// whatever the prefix; a value longer than MaxApproveWave is no change ID,
// and the caches do not keep it.
const (
	ApproveWaveAnnotation = "podjanitor.io/approve-wave"
	MaxApproveWave        = 64
)

// Annotation names, under the prefix: "podjanitor.io/ttl".
const (
	AnnotationTTL              = "ttl"
	AnnotationExpiresAt        = "expires-at"
	AnnotationTTLAfterFinished = "ttl-after-finished"
	AnnotationKeep             = "keep"
)

// AnnotationNames are the only names under the prefix: every annotation
// under it is podjanitor's, and a pod with any other (a typo such as "keeps"
// or "Keep") is invalid, as a value that does not parse is. A tool that wants
// annotations of its own uses a prefix of its own.
var AnnotationNames = []string{AnnotationKeep, AnnotationTTL, AnnotationExpiresAt, AnnotationTTLAfterFinished}

// Action is how a pod is removed.
type Action string

const (
	// ActionDelete deletes the pod.
	ActionDelete Action = "delete"
	// ActionEvict evicts the pod through the Eviction API, so PodDisruptionBudgets hold.
	ActionEvict Action = "evict"
)

// Reasons say why a pod has a deadline: a small closed set, fit for metric
// labels and events.
const (
	ReasonTTL              = "ttl"
	ReasonExpiresAt        = "expires-at"
	ReasonTTLAfterFinished = "ttl-after-finished"
	ReasonFinished         = "finished"
	ReasonPending          = "pending"
	ReasonCrashLooping     = "crashLooping"
	ReasonCreated          = "created"
)

// Why Decide left a pod out of scope (Decision.Skipped).
const (
	SkippedMirrorPod   = "mirror pod"
	SkippedTerminating = "terminating"
	// SkippedNamespaceUnknown: the pod's namespace is not known (yet), so
	// neither its keep annotation nor its labels can be read. The namespace
	// must exist for the pod to exist; the pod is decided once it is known.
	SkippedNamespaceUnknown = "namespace not known"
)

// Namespace is what Decide knows about a pod's namespace.
type Namespace struct {
	// Labels are matched by a rule's match.namespaceSelector.
	Labels map[string]string
	// Annotations need only hold the keep annotation ("podjanitor.io/keep").
	Annotations map[string]string
}

// Decision is what Decide concluded for one pod.
type Decision struct {
	// Deadline is when the pod must go; zero means never (nothing to do).
	Deadline time.Time
	Action   Action
	// Source is what set the deadline: the full annotation key
	// ("podjanitor.io/ttl"), "rule/<name>" for the policy file's rules, or
	// "podlifetimepolicy/<policy>/rule/<name>" for a tenant policy's.
	Source string
	// Reason is one of the Reason* constants.
	Reason string
	// Rule is the deciding rule's name, "" for annotations.
	Rule string
	// Policy is "<namespace>/<name>" of the tenant policy whose rule decided,
	// "" for annotations and the policy file's rules.
	Policy string
	// PolicyUID and PolicyGeneration are the UID and generation of the
	// tenant policy as it was when it decided (TenantPolicy.UID,
	// Generation): a removal checks them against a fresh read.
	PolicyUID        types.UID
	PolicyGeneration int64
	// GracePeriodSeconds is the rule's grace period for the removal; nil means the pod's own.
	GracePeriodSeconds *int64
	// Kept is set when the keep annotation of the pod or of its namespace
	// vetoed everything.
	Kept bool
	// Skipped says why the pod is out of scope (SkippedMirrorPod, SkippedTerminating,
	// SkippedNamespaceUnknown).
	Skipped string
	// ClockSkew is set when a finish or transition time lay in the future and
	// was treated as now.
	ClockSkew bool
	// RemovalNotice is how long before Deadline the pod's owner is told
	// (a RemovalScheduled Event) by the deciding rule's own removalNotice;
	// 0: the --removal-notice default.
	RemovalNotice time.Duration
	// Count is the pod's place in its group when the deciding rule keeps
	// a number of pods (keepNewest, maxPods); nil otherwise.
	Count *CountPlace
}

// HasDeadline reports whether the pod must go at some point.
func (d Decision) HasDeadline() bool { return !d.Deadline.IsZero() }

// AnnotationError is an annotation value that does not parse, or an annotation
// under the prefix that podjanitor does not know (Err says which). It is terminal:
// retrying cannot help until the pod changes.
type AnnotationError struct {
	Key, Value string
	Err        error
	// Namespace is set when the annotation is on the pod's namespace, not on the pod.
	Namespace string
}

func (e *AnnotationError) Error() string {
	if e.Namespace != "" {
		return fmt.Sprintf("namespace %s: annotation %s=%q: %v", e.Namespace, e.Key, e.Value, e.Err)
	}
	return fmt.Sprintf("annotation %s=%q: %v", e.Key, e.Value, e.Err)
}

func (e *AnnotationError) Unwrap() error { return e.Err }

// Evaluator decides pods' deadlines from their annotations and a policy.
type Evaluator struct {
	// Prefix is the annotation prefix without the trailing slash; "" means DefaultAnnotationPrefix.
	Prefix string
	// Policy holds the cluster's rules for pods without deadline
	// annotations; nil means annotations only.
	Policy *Policy
	// Tenants holds the namespaces' own rules (tenant policies), tried
	// before Policy's; nil means none.
	Tenants Tenants
	// Ranks places pods in the groups of the rules that keep a number of
	// pods (keepNewest, maxPods); nil: no place is known, and such a rule
	// keeps its pods. Controllers tells a Job's CronJob, for groupBy owner.
	Ranks       Ranks
	Controllers Controllers
}

// AnnotationKey is the full key of an annotation name: "podjanitor.io/ttl".
func (e *Evaluator) AnnotationKey(name string) string {
	prefix := e.Prefix
	if prefix == "" {
		prefix = DefaultAnnotationPrefix
	}
	return prefix + "/" + name
}

// Decide says whether and when pod must go; ns is what is known of the pod's
// namespace, nil when it is not known. It never returns a deadline for mirror
// pods, pods with a deletionTimestamp, pods whose namespace is not known, or
// pods whose namespace carries the keep annotation. An annotation that does
// not parse, or a key under the prefix that is not one of AnnotationNames,
// returns an *AnnotationError and no deadline.
func (e *Evaluator) Decide(pod *corev1.Pod, ns *Namespace, now time.Time) (Decision, error) {
	if IsMirrorPod(pod) {
		return Decision{Skipped: SkippedMirrorPod}, nil
	}
	if pod.DeletionTimestamp != nil {
		return Decision{Skipped: SkippedTerminating}, nil
	}
	if err := e.unknownAnnotation(pod.Annotations); err != nil {
		return Decision{}, err
	}
	keep, err := e.keep(pod.Annotations)
	if err != nil {
		return Decision{}, err
	}
	if keep {
		return Decision{Kept: true}, nil
	}
	if ns == nil {
		return Decision{Skipped: SkippedNamespaceUnknown}, nil
	}
	decision, annotated, err := e.decideByAnnotations(pod, now)
	if err != nil {
		return decision, err
	}
	if !annotated {
		decision = e.decideByRules(pod, ns, now)
	}
	if !decision.HasDeadline() {
		return decision, nil
	}
	// Read only for pods with a deadline: a keep value that does not parse
	// is reported on the pods it holds back, not on every pod of the namespace.
	keep, err = e.keep(ns.Annotations)
	if err != nil {
		var invalid *AnnotationError
		if errors.As(err, &invalid) {
			invalid.Namespace = pod.Namespace
		}
		return Decision{}, err
	}
	if keep {
		return Decision{Kept: true}, nil
	}
	return decision, nil
}

// unknownAnnotation returns an *AnnotationError for the first key, in byte
// order, under the prefix whose name is not one of AnnotationNames. It is read
// before keep: a pod whose owner wrote "Keep" or "keeps" meant to keep it, and
// is left alone with a warning that says so, never removed by its ttl.
func (e *Evaluator) unknownAnnotation(annotations map[string]string) error {
	prefix := e.AnnotationKey("")
	first := ""
	for key := range annotations {
		name, ok := strings.CutPrefix(key, prefix)
		if ok && !slices.Contains(AnnotationNames, name) && (first == "" || key < first) {
			first = key
		}
	}
	if first == "" {
		return nil
	}
	return &AnnotationError{Key: first, Value: annotations[first], Err: e.unknownNameError(first[len(prefix):])}
}

// unknownNameError suggests the name meant when name differs from it only in
// case, '-', '_' and '.', or a trailing 's' ("Keep", "keeps",
// "ttl_after_finished", "expiresAt"). The admission policy
// (charts/podjanitor/templates/admission-policy.yaml) says the same.
func (e *Evaluator) unknownNameError(name string) error {
	folded := asciiLower(strings.NewReplacer("-", "", "_", "", ".", "").Replace(name))
	for _, known := range AnnotationNames {
		if k := strings.ReplaceAll(known, "-", ""); folded == k || folded == k+"s" {
			return fmt.Errorf("unknown annotation: did you mean %s?", e.AnnotationKey(known))
		}
	}
	return fmt.Errorf("unknown annotation: podjanitor reads %s, %s, %s and %s under %s",
		AnnotationKeep, AnnotationTTL, AnnotationExpiresAt, AnnotationTTLAfterFinished, e.AnnotationKey(""))
}

// asciiLower lowers ASCII letters only, as CEL's lowerAscii does.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// keep reads the keep annotation: "true" keeps, "false" or absent does not.
func (e *Evaluator) keep(annotations map[string]string) (bool, error) {
	key := e.AnnotationKey(AnnotationKeep)
	value, ok := annotations[key]
	if !ok {
		return false, nil
	}
	switch value {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, &AnnotationError{Key: key, Value: value, Err: fmt.Errorf(`want "true" or "false"`)}
}

// decideByAnnotations returns the earliest deadline the pod's annotations set.
// annotated is true when the pod carries any deadline annotation, even one that
// gives no deadline yet (ttl-after-finished on a running pod): the policy's
// rules are then not consulted.
//
// Deadlines are combined with a flag of their own, not by reading a zero
// Deadline as "none": no deadline ever cancels another. (None is zero anyway:
// ParseExpiresAt refuses instants before 1970, and a pod without a
// creationTimestamp gets no ttl deadline.)
func (e *Evaluator) decideByAnnotations(pod *corev1.Pod, now time.Time) (decision Decision, annotated bool, err error) {
	found := false
	consider := func(deadline time.Time, key, reason string) {
		if found && !deadline.Before(decision.Deadline) {
			return
		}
		found = true
		decision.Deadline, decision.Source, decision.Reason = deadline, key, reason
	}

	if key, value, ok := e.annotation(pod, AnnotationTTL); ok {
		annotated = true
		ttl, err := ParseDuration(value)
		if err != nil {
			return Decision{}, true, &AnnotationError{Key: key, Value: value, Err: err}
		}
		if created, ok := createdAt(pod); ok {
			consider(created.Add(ttl), key, ReasonTTL)
		}
	}
	if key, value, ok := e.annotation(pod, AnnotationExpiresAt); ok {
		annotated = true
		expiresAt, err := ParseExpiresAt(value)
		if err != nil {
			return Decision{}, true, &AnnotationError{Key: key, Value: value, Err: err}
		}
		consider(expiresAt, key, ReasonExpiresAt)
	}
	if key, value, ok := e.annotation(pod, AnnotationTTLAfterFinished); ok {
		annotated = true
		ttl, err := ParseDuration(value)
		if err != nil {
			return Decision{}, true, &AnnotationError{Key: key, Value: value, Err: err}
		}
		if finished, ok := FinishTime(pod); ok {
			var skewed bool
			finished, skewed = fromNode(pod, finished, now)
			consider(finished.Add(ttl), key, ReasonTTLAfterFinished)
			decision.ClockSkew = skewed && decision.Source == key
		}
	}
	if found {
		decision.Action = DefaultAction(pod)
	}
	return decision, annotated, nil
}

func (e *Evaluator) annotation(pod *corev1.Pod, name string) (key, value string, ok bool) {
	key = e.AnnotationKey(name)
	value, ok = pod.Annotations[key]
	return key, value, ok
}

// notAfter returns t, or now when t lies in the future (clock skew between
// the node that reported t and this process); skewed says which.
func notAfter(t, now time.Time) (_ time.Time, skewed bool) {
	if t.After(now) {
		return now, true
	}
	return t, false
}

// CountPlace is where a pod stands among the pods a rule that keeps a
// number of them decides (Rule.KeepNewest, Rule.MaxPods).
type CountPlace struct {
	// Group names the pod's group ("owner Job/build-7", "label app=web").
	Group string
	// Rank is the pod's place in Group, 0 the newest; Size the group's pods.
	Rank, Size int
	// KeepNewest is the rule's: the group's newest KeepNewest pods stay.
	KeepNewest int32
	// NamespaceRank is the pod's place among the rule's pods of its
	// namespace, 0 the newest; MaxPods the rule's bound on them.
	NamespaceRank int
	MaxPods       int32
	// Known is false when the pod's place is not known (not counted yet):
	// it is kept by its rank, and MaxPods does not apply.
	Known bool
}
