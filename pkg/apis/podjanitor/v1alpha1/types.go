package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// PodLifetimePolicy holds lifetime rules for the pods of its own namespace,
// written by the namespace's owners: the rule language of the cluster policy
// file without namespace matchers (the resource's namespace is its scope).
// The API server refuses what podjanitor's loader refuses (policy.ParseRules);
// status reports whether podjanitor uses the rules.
type PodLifetimePolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PodLifetimePolicySpec `json:"spec"`
	// +optional
	Status PodLifetimePolicyStatus `json:"status,omitempty"`
}

// PodLifetimePolicySpec is the rules of a PodLifetimePolicy.
type PodLifetimePolicySpec struct {
	// Rules are tried in order; the first whose match and clock apply to a
	// pod gives its deadline. At least one; names are unique.
	Rules []PodLifetimeRule `json:"rules"`
}

// PodLifetimeRule is one rule: which pods (match), from when (clock), how
// long (after) and how they go (action, gracePeriodSeconds).
type PodLifetimeRule struct {
	// Name names the rule in events, logs and plan: letters, digits, '-',
	// '_' and '.', starting and ending with a letter or digit.
	Name string `json:"name"`
	// Match selects the pods of the namespace the rule applies to; empty
	// matches every pod.
	// +optional
	Match PodLifetimeMatch `json:"match,omitempty"`
	// Clock is what the deadline counts from: finished (Succeeded or Failed
	// pods, from their finish), pending (pods stuck Pending, from when they
	// got stuck), crashLooping (pods with a container in CrashLoopBackOff)
	// or created (every pod, from its creation: a maximum age).
	Clock string `json:"clock"`
	// After is how long after the clock's start the pod goes: "90m",
	// "1h30m", "2d", "1w"; "0s" removes at once.
	After string `json:"after"`
	// MinRestarts is, for the crashLooping clock only, the restart count the
	// crash-looping container must have reached.
	// +optional
	MinRestarts *int32 `json:"minRestarts,omitempty"`
	// Action is delete or evict (the Eviction API, so PodDisruptionBudgets
	// hold); empty means evict for Running pods and delete otherwise.
	// +optional
	Action string `json:"action,omitempty"`
	// GracePeriodSeconds overrides the pod's termination grace period; at
	// least 1 (0 would force-delete the pod).
	// +optional
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
	// KeepNewest keeps the newest pods of each group (groupBy) of the pods
	// the rule decides: they have no deadline while they are among the
	// newest; the others go at the rule's clock. Newest is by finish time
	// for finished pods, by creation for the others.
	// +optional
	KeepNewest *int32 `json:"keepNewest,omitempty"`
	// GroupBy groups pods for keepNewest: "owner" (the default: the
	// controlling owner, a Job, a ReplicaSet, a StatefulSet) or
	// "label:<key>" (a label's value).
	// +optional
	GroupBy *string `json:"groupBy,omitempty"`
	// MaxPods bounds the pods the rule decides in the namespace: past the
	// newest maxPods, pods go at once.
	// +optional
	MaxPods *int32 `json:"maxPods,omitempty"`
	// RemovalNotice is how long before its deadline a pod's owner is told
	// with a RemovalScheduled Event: "10m", "1h".
	// +optional
	RemovalNotice *string `json:"removalNotice,omitempty"`
}

// PodLifetimeMatch selects pods; an empty field matches every pod.
type PodLifetimeMatch struct {
	// LabelSelector is in Kubernetes selector syntax: "app=web,tier!=db".
	// +optional
	LabelSelector string `json:"labelSelector,omitempty"`
	// OwnerKinds are kinds of the pod's ownerReferences ("Job",
	// "ReplicaSet") or "<none>" for bare pods. A pod with several owners is
	// included if any owner is included, and excluded if any is excluded.
	// +optional
	OwnerKinds IncludeExclude `json:"ownerKinds,omitempty"`
	// PriorityClassNames are exact names of the pod's priority class. The
	// critical classes (system-cluster-critical, system-node-critical) are
	// never matched unless include names them, and the cluster admin's
	// protections may still refuse them.
	// +optional
	PriorityClassNames IncludeExclude `json:"priorityClassNames,omitempty"`
	// Phases are pod phases: Pending, Running, Succeeded, Failed, Unknown.
	// +optional
	Phases []corev1.PodPhase `json:"phases,omitempty"`
	// Reasons match the pod's status.reason ("Evicted") or the reason of any
	// (init) container's current state ("OOMKilled", "Error").
	// +optional
	Reasons []string `json:"reasons,omitempty"`
}

// IncludeExclude selects names: those in include (all when empty) but not
// in exclude.
type IncludeExclude struct {
	// +optional
	Include []string `json:"include,omitempty"`
	// +optional
	Exclude []string `json:"exclude,omitempty"`
}

// PodLifetimePolicyStatus is what podjanitor last made of the policy.
type PodLifetimePolicyStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready is True when podjanitor uses the rules, False with
	// the reason when it does not (rules it cannot use, a restriction of
	// the cluster admin, tenant policies turned off).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// PodsWithDeadline is how many pods of the namespace the policy
	// currently gives a deadline.
	// +optional
	PodsWithDeadline int32 `json:"podsWithDeadline,omitempty"`
	// NextDeadline is the earliest of those deadlines.
	// +optional
	NextDeadline *metav1.Time `json:"nextDeadline,omitempty"`
	// HeldChange is the held change of the namespace's policies that this
	// policy (its creation, its change or its deletion, at
	// observedGeneration) is part of: podjanitor removes none of the pods
	// it makes due until it is approved or reverted.
	// +optional
	HeldChange *HeldChange `json:"heldChange,omitempty"`
}

// HeldChange is a held change of a namespace's PodLifetimePolicies.
type HeldChange struct {
	// ID names the change: the podjanitor.io/approve-wave annotation with
	// this value, on any policy of the change, approves it.
	ID string `json:"id"`
	// Pods is how many pod removals it held when it came.
	Pods int32 `json:"pods"`
	// Since is when podjanitor first held it (to the second).
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
	// Approve is the command that approves it on this policy.
	Approve string `json:"approve"`
}

// ConditionReady is the type of the condition that says whether podjanitor
// uses the policy's rules.
const ConditionReady = "Ready"

// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object

// PodLifetimePolicyList is a list of PodLifetimePolicy.
type PodLifetimePolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []PodLifetimePolicy `json:"items"`
}
