package policy

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The policy file's apiVersion and kind.
const (
	PolicyAPIVersion = "podjanitor.io/v1alpha1"
	PolicyKind       = "PodJanitorPolicy"
)

// Clock is what a rule's deadline counts from.
type Clock string

const (
	// ClockFinished counts from the finish time of Succeeded and Failed pods (FinishTime).
	ClockFinished Clock = "finished"
	// ClockPending counts, for pods stuck Pending, from when they got stuck:
	// unschedulable or never scheduled, or scheduled but stuck on a waiting
	// reason the kubelet cannot get past (see pendingSince). A pod making
	// progress, gated, or waiting for its pod group is never stuck.
	ClockPending Clock = "pending"
	// ClockCrashLooping counts, for pods with a container or init container
	// waiting in CrashLoopBackOff, from the Ready=False transition, else from
	// creation, and never before the pod last restarted all its containers
	// (see crashLoopingSince).
	ClockCrashLooping Clock = "crashLooping"
	// ClockCreated counts from creation: a maximum age.
	ClockCreated Clock = "created"
)

var clockReasons = map[Clock]string{
	ClockFinished:     ReasonFinished,
	ClockPending:      ReasonPending,
	ClockCrashLooping: ReasonCrashLooping,
	ClockCreated:      ReasonCreated,
}

// Policy is a validated policy file: rules tried in order, the first whose
// match and clock apply to a pod decides. Build it with Parse, LoadFile or NewPolicy.
type Policy struct {
	Rules []Rule

	selectors   []labels.Selector // parsed Rules[i].Match.LabelSelector
	nsSelectors []labels.Selector // parsed Rules[i].Match.NamespaceSelector
	// seq numbers the Policy (nextSeq); counts: a rule keeps a number of
	// pods.
	seq    uint64
	counts bool
}

// Rule is one rule of a policy file.
type Rule struct {
	Name  string
	Match Match
	Clock Clock
	// After is how long after the clock's start the pod goes.
	After time.Duration
	// MinRestarts is, for the crashLooping clock, the restart count the
	// crash-looping container must have reached; 0 means any.
	MinRestarts int32
	// Action is how the pod is removed; "" means DefaultAction.
	Action Action
	// GracePeriodSeconds overrides the pod's termination grace period; nil
	// keeps the pod's own. At least 1: 0 would force-delete the pod.
	GracePeriodSeconds *int64
	// KeepNewest, when above 0, keeps the newest KeepNewest pods of each
	// group (GroupBy) of the pods the rule decides: they have no deadline
	// while they are among them; the others go at the rule's clock.
	KeepNewest int32
	// GroupBy groups pods for KeepNewest: GroupByOwner ("", the default)
	// or GroupByLabelPrefix and a label key.
	GroupBy string
	// MaxPods, when above 0, bounds the pods the rule decides in a
	// namespace: past the newest MaxPods, pods go at once.
	MaxPods int32
	// RemovalNotice, when above 0, is how long before its deadline a pod's
	// owner is told (Decision.RemovalNotice).
	RemovalNotice time.Duration
}

// Match selects the pods a rule applies to; an empty field matches every pod.
type Match struct {
	// Namespaces are exact names or path.Match globs ("ci-*"). kube-system
	// is never matched unless Include names it exactly.
	Namespaces IncludeExclude `json:"namespaces"`
	// NamespaceSelector selects by the labels of the pod's namespace, in the
	// same syntax as LabelSelector: "team=ci,env!=prod".
	NamespaceSelector string `json:"namespaceSelector"`
	// LabelSelector is in Kubernetes selector syntax: "app=web,tier!=db".
	LabelSelector string `json:"labelSelector"`
	// PriorityClassNames are exact names of the pod's spec.priorityClassName.
	// Pods of the CriticalPriorityClasses are never matched unless Include
	// names their class exactly.
	PriorityClassNames IncludeExclude `json:"priorityClassNames"`
	// OwnerKinds are kinds of the pod's ownerReferences ("Job", "ReplicaSet")
	// or NoOwner for bare pods. A pod with several owners is included if any
	// owner is included, and excluded if any owner is excluded.
	OwnerKinds IncludeExclude    `json:"ownerKinds"`
	Phases     []corev1.PodPhase `json:"phases"`
	// Reasons match the pod's status.reason ("Evicted") or the reason of any
	// (init) container's current state ("OOMKilled", "Error", "CrashLoopBackOff").
	Reasons []string `json:"reasons"`
}

// IncludeExclude selects names: those in Include (all when empty) but not in Exclude.
type IncludeExclude struct {
	Include []string `json:"include"`
	Exclude []string `json:"exclude"`
}
