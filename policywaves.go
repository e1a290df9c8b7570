package main

// The held waves of the cluster's policy (--hold-waves): a reload of the
// policy file, or a start with a policy other than the one the last leader
// acted on, that makes too many pods due at once waits for a person's
// approval on the record Lease (internal/wave).

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/podcache"
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
	decider   func(e *policy.Evaluator) wave.Decide
	evaluator func() *policy.Evaluator
	now       func() time.Time
	clock     clock.WithTicker
	reporter  *events.Reporter
	// requeue decides a pod again: the held change was approved.
	requeue func(cache.ObjectName)
}

// newPolicyWaves guards the policy of e against large waves.
func newPolicyWaves(o *wave.Options, e *policy.Evaluator, w policyWaves, onHeld func(source string, n int)) *policyWaves {
	w.options = o
	w.guard = wave.NewGuard(o.Threshold, o.Window, policyJSON(e), w.decider(e), onHeld)
	return &w
}

// Held returns the held change, if any.
func (w *policyWaves) Held() (wave.Hold, bool) { return w.guard.Held() }

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
	if h, held := w.guard.Change(wave.SourceFile, policyJSON(e), w.decider(e), podcache.Pods(w.pods), w.now()); held {
		klog.Background().Info("Holding the removals of the reloaded policy: it makes too many pods due at once",
			"change", h.ID, "pods", h.Pods, "approve", w.options.Record.ApproveCommand(h.ID))
	}
}

// policyJSON is what names a policy in a change ID: its rules as JSON, so
// that a comment or a reformatting of the file is no change.
func policyJSON(e *policy.Evaluator) []byte {
	b, err := json.Marshal(e.Policy)
	if err != nil {
		return nil
	}
	return b
}

// run publishes held waves on the record Lease, reports each on it in a
// Warning Event, and takes their approvals, until ctx ends.
func (w *policyWaves) run(ctx context.Context) {
	w.options.Record.Keep(ctx, w.guard, w.clock, waveRecordInterval, func(h wave.Hold) {
		w.reporter.RemovalsHeld(w.options.Record.Ref(), waveChange(h.Source), h.Pods, w.options.Record.ApproveCommand(h.ID))
	}, func(_ wave.Hold, keys []string) {
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
		return "the start with a policy file other than the one recorded on this Lease (none recorded: a first install on a backlog)"
	}
	return "the reloaded policy file"
}

// readRecord reads the record Lease, retrying with backoff while ctx lasts.
// The start fails when it cannot be read, rather than act on a change it
// cannot measure.
func (w *policyWaves) readRecord(ctx context.Context) (*coordinationv1.Lease, error) {
	var lease *coordinationv1.Lease
	err := retry.OnError(retry.DefaultBackoff, func(error) bool { return ctx.Err() == nil }, func() error {
		var err error
		lease, err = w.options.Record.Read(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("--hold-waves: the policy the last leader acted on: %w", err)
	}
	return lease, nil
}

// start measures the start against the policy the last leader acted on, as
// the record Lease holds it, before any worker decides: the same policy
// holds nothing; another is a change like a reload, and its wave is held
// when too large; none recorded (a first install) is measured against no
// rules: the pods the policy's rules make due by now+window are the wave,
// the pods' own annotations are not. A policy recorded by its hash alone
// (too large to record) counts as none.
func (w *policyWaves) start(ctx context.Context, lease *coordinationv1.Lease) {
	hash, recorded := wave.BaselineOn(lease)
	e := w.evaluator()
	current := policyJSON(e)
	if hash != "" && hash == wave.BaselineHash(current) {
		return
	}
	var oldDecide wave.Decide
	if recorded != nil {
		var p policy.Policy
		if err := json.Unmarshal(recorded, &p); err == nil {
			if parsed, err := policy.NewPolicy(p.Rules...); err == nil {
				old := *e
				old.Policy = parsed
				oldDecide = w.decider(&old)
			}
		}
	}
	if oldDecide == nil {
		// None recorded: measured against no rules at all, so that the pods'
		// own deadlines (their annotations) are never in the wave.
		recorded, oldDecide = nil, w.decider(&policy.Evaluator{})
	}
	w.guard.Rebase(recorded, oldDecide)
	logger := klog.FromContext(ctx)
	if h, held := w.guard.Change(wave.SourceStartup, current, w.decider(e), podcache.Pods(w.pods), w.now()); held {
		logger.Info("Holding the removals of the start: its policy makes too many pods due at once against the one recorded on the Lease (none: a first install)",
			"change", h.ID, "pods", h.Pods, "firstInstall", recorded == nil, "approve", w.options.Record.ApproveCommand(h.ID))
	} else {
		logger.Info("Started with a policy other than the one recorded on the Lease; its wave is small enough", "firstInstall", recorded == nil)
	}
}

// waveRecordInterval is how often the record Lease is read for an approval.
const waveRecordInterval = 2 * time.Second
