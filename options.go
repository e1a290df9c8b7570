package main

// What the pod controller is given (Options) and what a sync of a key
// returns (Result and the errors that choose a retry).

import (
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/internal/metrics"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// Options configure a Controller. The zero value of a field means its default.
type Options struct {
	// Evaluator decides each pod's deadline. Required.
	Evaluator *policy.Evaluator
	// DryRun decides and reports but changes nothing.
	DryRun bool
	// FreshPods reads a pod afresh before its eviction (freshDecision); nil:
	// the client's CoreV1. The daemon passes the pod informer's lean client
	// (podcache.LeanDecoding): the transform keeps nothing more of a pod
	// decoded whole, so the read need not decode its spec.
	FreshPods corev1client.PodsGetter
	// NoRemovalEvents leaves out the LifetimeExpired events of removals.
	// Warnings, removal notices and dry-run events are recorded regardless.
	NoRemovalEvents bool
	// RemovalNotice is how long before its deadline a pod is told, once per
	// deadline, that it goes then (a Normal RemovalScheduled event), unless
	// the deciding rule sets its own (policy.Decision.RemovalNotice); 0: no
	// notice. A notice never delays a removal.
	RemovalNotice time.Duration
	// Jobs, when set, is a Job metadata informer (newJobInformer): the
	// rules that keep the newest pods of each owner group a CronJob's pods
	// through its Jobs. Not started by the controller.
	Jobs cache.SharedIndexInformer
	// MaxRemovalsPerSecond caps removals cluster-wide; 0 means no limit.
	MaxRemovalsPerSecond float64
	// RemovalBurst is the token bucket size; defaults to 1 when a limit is set.
	RemovalBurst int
	// ShutdownTimeout bounds how long Run waits for in-flight removals; default 30s.
	ShutdownTimeout time.Duration
	// WriteTimeout bounds each removal call, retries inside client-go included;
	// default 15s.
	WriteTimeout time.Duration
	// ClockOffset returns how far the API server's clock is ahead of this
	// process's clock; deadlines are compared in the API server's time. nil
	// means no offset.
	ClockOffset func() time.Duration
	// SleepFine sleeps the last FineLead of a parked key's wait, which the
	// clock's timers would end up to a millisecond late (apiclock.SleepFine
	// on the process's clock); nil: timers alone (a fake clock's tests).
	SleepFine func(time.Duration)
	// Metrics receives the controller's measurements; nil records nothing.
	Metrics *metrics.Metrics
	// PodSelector is the pod informer's label selector (--label-selector):
	// a pod read afresh that no longer matches it is not removed. nil
	// matches every pod.
	PodSelector labels.Selector
	// RedecisionInterval is the least time between two re-decisions of one
	// namespace's pods after its tenant policies or labels change; changes
	// in between coalesce into the next. 0: no wait.
	RedecisionInterval time.Duration
	// Waves holds a policy reload whose wave is too large for a person to
	// approve (internal/wave); nil holds nothing (--hold-waves=false).
	Waves *wave.Options
	// Scope is what, besides the rules, decides the pods removed: recorded
	// with them on the Lease for the next start's measure (Waves). Its
	// DryRun and AnnotationPrefix come from DryRun and Evaluator.
	Scope decisionScope
	// MayRemove says, before each removal call, whether one may start now
	// and how long it may take, or else how long until one may (0: not
	// known); with leader election: while the Lease is renewed
	// (removalGate). nil: always, for WriteTimeout.
	MayRemove func() (d time.Duration, ok bool)
}

// Result tells processNextWorkItem what to do with a key, as controller-runtime's
// reconcile.Result does: RequeueAfter parks the key until then, Requeue retries it
// with backoff, the zero value forgets it.
type Result struct {
	Requeue      bool
	RequeueAfter time.Duration

	// parking says why a RequeueAfter parks the key: until the pod's
	// deadline, or (the zero value) for a removal token or a refusal's
	// backoff; podjanitor_pods_scheduled counts the former.
	parking parking
	// queued says that the pod waits in the backlog for a removal slot
	// (podStates.reserve): the slot hands the key back.
	queued bool
}

// retryAfterError is a failed removal to try again after a wait of its own
// rather than the workqueue's backoff: refusals that retrying soon cannot fix.
type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// terminalError marks an error that retrying cannot fix (invalid user input).
type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

// TerminalError wraps err so that the key is forgotten instead of retried.
func TerminalError(err error) error { return &terminalError{err: err} }

func isTerminal(err error) bool {
	var t *terminalError
	return errors.As(err, &t)
}

// scope is the scope of the options' process: Scope with its DryRun and
// annotation prefix.
func (o Options) scope() decisionScope {
	prefix := ""
	if o.Evaluator != nil {
		prefix = o.Evaluator.Prefix
	}
	return newDecisionScope(o.Scope.Namespace, o.Scope.LabelSelector, o.Scope.TenantPolicies, o.Scope.Tenant, o.DryRun, prefix)
}
