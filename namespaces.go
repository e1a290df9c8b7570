package main

// The namespaces as the controller reads them: what the namespace cache
// knows of one (namespaceInfo), a fresh read before a removal
// (namespaceReader), one warning per invalid keep value (namespaceWarnings),
// the hold of a change of its labels or keep annotation (namespaceWave),
// and the health of the namespace watch (watchHealth).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// namespaceWave measures a change of a namespace's labels or keep
// annotation against the namespace's pods before its pods are decided again,
// and holds it when its wave is too large (a Warning Event on the Namespace
// says how to approve it); and it takes the approval of the namespace's
// held change: podjanitor.io/approve-wave=<change-id> on the Namespace,
// which only those who may update Namespaces (cluster admins, not a
// namespace's owners) can set.
func (c *Controller) namespaceWave(old, cur metav1.Object) {
	if c.namespaceWaves == nil {
		return
	}
	name := cur.GetName()
	object := "namespace/" + name
	if before, after := namespaceJSON(old), namespaceJSON(cur); string(before) != string(after) {
		defer c.namespaceHoldsMayHaveChanged() // held, or a revert that ends a hold
		if h, held := c.namespaceWaves.Change(name, object, before, c.namespaceDecider(old), after, c.namespaceDecider(cur), c.namespacePods(name), c.now()); held {
			command := namespaceApproveCommand(name, h.ID)
			klog.Background().Info("Holding the removals of a namespace's change: its labels or keep annotation make too many of its pods due at once",
				"namespace", name, "change", h.ID, "pods", h.Pods, "approve", command)
			if c.running.Load() { // the leader's Event, not every replica's
				c.reporter.RemovalsHeld(&corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: name, UID: cur.GetUID()},
					"this change of the namespace's labels or keep annotation", h.Pods, command)
			}
		}
	}
	if id := cur.GetAnnotations()[podcache.ApproveWaveAnnotation]; id != "" {
		if keys, ok := c.namespaceWaves.Approve(name, object, id); ok {
			c.namespaceHoldsMayHaveChanged()
			klog.Background().Info("Namespace's wave approved, removing its pods at the removal rate", "namespace", name, "change", id, "pods", len(keys))
			for _, k := range keys {
				if key, err := cache.ParseObjectName(k); err == nil {
					c.feed.Add(key)
				}
			}
		}
	}
}

// namespaceApproveCommand is the one command that approves the held change
// id of a namespace.
func namespaceApproveCommand(namespace, id string) string {
	return fmt.Sprintf("kubectl annotate namespace %s --overwrite %s=%s", namespace, wave.AnnotationApprove, id)
}

// namespaceJSON names what decisions read of a namespace in a change ID: its
// labels and the annotations the cache keeps, but the approval.
func namespaceJSON(m metav1.Object) []byte {
	annotations := maps.Clone(m.GetAnnotations())
	delete(annotations, podcache.ApproveWaveAnnotation)
	if len(annotations) == 0 {
		annotations = nil // none and an empty map are the same
	}
	labels := m.GetLabels()
	if len(labels) == 0 {
		labels = nil
	}
	b, err := json.Marshal(map[string]any{"namespace": m.GetName(), "labels": labels, "annotations": annotations})
	if err != nil {
		return []byte(m.GetName())
	}
	return b
}

// namespaceFromJSON is the namespace name as namespaceJSON wrote it: its
// labels and the annotations the cache keeps.
func namespaceFromJSON(name string, b []byte) (*metav1.ObjectMeta, error) {
	var m struct {
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return &metav1.ObjectMeta{Name: name, Labels: m.Labels, Annotations: m.Annotations}, nil
}

// namespaceDecider decides pods as the running evaluator does, with m for
// their namespace, for a wave.
func (c *Controller) namespaceDecider(m metav1.Object) wave.Decide {
	ns := &policy.Namespace{Labels: m.GetLabels(), Annotations: m.GetAnnotations()}
	return func(pod *corev1.Pod, now time.Time) (policy.Decision, error) {
		return c.evaluator.Load().Decide(pod, ns, now)
	}
}

// namespaceInfo is what the namespace cache knows of a namespace; nil when
// the namespace is not in it (not yet seen, or deleted), which policy.Decide
// takes as "not known" and leaves the namespace's pods alone.
func namespaceInfo(namespaces cache.Indexer, name string) *policy.Namespace {
	obj, exists, err := namespaces.GetByKey(name)
	if err != nil || !exists {
		return nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil
	}
	return &policy.Namespace{Labels: m.GetLabels(), Annotations: m.GetAnnotations()}
}

// namespaceTerminating reports whether the cached namespace has a deletion
// timestamp.
func namespaceTerminating(namespaces cache.Indexer, name string) bool {
	obj, exists, err := namespaces.GetByKey(name)
	if err != nil || !exists {
		return false
	}
	m, err := meta.Accessor(obj)
	return err == nil && m.GetDeletionTimestamp() != nil
}

// namespaceWarnings remembers the invalid keep value each namespace was warned
// about, so that a value that does not parse costs one Warning on the
// Namespace, not one per pod it holds back. An entry lasts until the
// namespace's annotations change or it is deleted.
type namespaceWarnings struct {
	mu     sync.Mutex
	warned map[string]string // namespace → the value warned about
}

// warnOnce says whether the namespace is to be warned about value: the first
// time since its annotations last changed, or a new value.
func (w *namespaceWarnings) warnOnce(namespace, value string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if v, ok := w.warned[namespace]; ok && v == value {
		return false
	}
	if w.warned == nil {
		w.warned = map[string]string{}
	}
	w.warned[namespace] = value
	return true
}

// forget drops what the namespace was warned about (nil m: nothing).
func (w *namespaceWarnings) forget(m metav1.Object) {
	if m == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.warned, m.GetName())
}

// namespaceFreshness is how old a read of a namespace may be for the last
// check before a removal (namespaceReader).
const namespaceFreshness = time.Second

// namespaceReader reads namespaces from the API server for the last check
// before a removal. The namespace cache is only as current as its watch,
// which may be failing (a 403 after an RBAC change, an API server refusing
// it, the reflector backing off) or slow without any error, which no error
// handler sees; a pod's own resourceVersion precondition does not cover its
// namespace's keep annotation. A read is shared by every removal of its
// namespace that begins within namespaceFreshness of it, failures included,
// so a drain costs at most one GET a second per namespace, not one per pod.
//
// A removal that finds its namespace's read more than half
// namespaceFreshness old goes by it and reads the namespace again
// meanwhile, for the removals after it (refresh): a namespace whose pods
// go one after another does not make one of them wait for a GET every
// second. A removal still starts at most one GET, so that one a second per
// namespace becomes at most two.
type namespaceReader struct {
	get   func(ctx context.Context, name string) (*policy.Namespace, error)
	clock clock.PassiveClock

	mu    sync.Mutex
	reads map[string]*namespaceRead
	// refreshes are the reads under way, or failed, behind a successful
	// read in reads; a failed one holds back the next for as long as a
	// refresh is not due.
	refreshes map[string]*namespaceRead
}

// namespaceRead is one read of a namespace, shared by those who wait on done.
type namespaceRead struct {
	sent time.Time
	done chan struct{}
	ns   *policy.Namespace
	err  error
}

// succeeded reports whether the read is over and found the namespace.
func (rd *namespaceRead) succeeded() bool {
	select {
	case <-rd.done:
		return rd.err == nil
	default:
		return false
	}
}

// newNamespaceReader reads namespaces with client, each GET bounded by timeout.
func newNamespaceReader(client kubernetes.Interface, clk clock.PassiveClock, timeout time.Duration) *namespaceReader {
	return &namespaceReader{clock: clk, reads: map[string]*namespaceRead{}, refreshes: map[string]*namespaceRead{},
		get: func(ctx context.Context, name string) (*policy.Namespace, error) {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			// A 404 is an error too, retried: a namespace goes only after its
			// pods, so a pod in the cache whose namespace is not found is a
			// stale cache or a proxy's answer, not a reason to decide the pod.
			ns, err := client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return &policy.Namespace{Labels: ns.Labels, Annotations: ns.Annotations}, nil
		}}
}

// fresh reports whether a read sent at sent may still be gone by at now.
func fresh(sent, now time.Time) bool {
	return now.Sub(sent) < namespaceFreshness && !now.Before(sent)
}

// halfStale reports whether a read sent at sent is due a refresh at now:
// half namespaceFreshness old or more (or sent after now, by a clock that
// went back).
func halfStale(sent, now time.Time) bool {
	return now.Sub(sent) >= namespaceFreshness/2 || now.Before(sent)
}

// read returns the namespace as read at most namespaceFreshness ago.
func (r *namespaceReader) read(ctx context.Context, name string) (*policy.Namespace, error) {
	r.mu.Lock()
	now := r.clock.Now()
	rd := r.reads[name]
	if rd == nil || !fresh(rd.sent, now) {
		// A refresh under way (or failed) is newer than the read it was to
		// replace: shared as that read would be.
		if next := r.refreshes[name]; next != nil && fresh(next.sent, now) {
			rd = next
		}
	}
	if rd != nil && fresh(rd.sent, now) {
		if halfStale(rd.sent, now) && rd.succeeded() {
			if next := r.refreshes[name]; next == nil || halfStale(next.sent, now) {
				next = &namespaceRead{sent: now, done: make(chan struct{})}
				r.refreshes[name] = next
				go r.refresh(ctx, name, next)
			}
		}
		r.mu.Unlock()
		select {
		case <-rd.done:
			return rd.ns, rd.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	for n, old := range r.reads { // of namespaces gone too
		if !fresh(old.sent, now) {
			delete(r.reads, n)
		}
	}
	for n, old := range r.refreshes {
		if !fresh(old.sent, now) {
			delete(r.refreshes, n)
		}
	}
	rd = &namespaceRead{sent: now, done: make(chan struct{})}
	r.reads[name] = rd
	r.mu.Unlock()
	rd.ns, rd.err = r.get(ctx, name)
	close(rd.done)
	return rd.ns, rd.err
}

// refresh reads the namespace for the removals after the one that found
// its read half stale: a success takes the place of that read; a failure
// does not, and the read it was to replace stands until it is stale.
func (r *namespaceReader) refresh(ctx context.Context, name string, next *namespaceRead) {
	ns, err := r.get(ctx, name)
	r.mu.Lock()
	defer r.mu.Unlock()
	next.ns, next.err = ns, err
	close(next.done)
	if err != nil {
		return
	}
	if r.refreshes[name] == next {
		delete(r.refreshes, name)
	}
	if cur := r.reads[name]; cur == nil || cur.sent.Before(next.sent) {
		r.reads[name] = next
	}
}

// watchHealth follows the list and watch requests of the namespace informer:
// failing from a request that fails until one succeeds. A watch that is slow
// without failing is not seen; removals do not depend on it (decideFresh).
// Its methods are safe on a nil *watchHealth, which follows nothing.
type watchHealth struct {
	clock  clock.PassiveClock
	logger klog.Logger
	// onChange is called with the new state on every change (the metric).
	onChange func(healthy bool)

	mu      sync.Mutex
	failing bool
	since   time.Time
	err     error
}

func newWatchHealth(logger klog.Logger, clk clock.PassiveClock, onChange func(healthy bool)) *watchHealth {
	onChange(true)
	return &watchHealth{clock: clk, logger: logger, onChange: onChange}
}

// observe records the outcome of a list or watch request.
func (h *watchHealth) observe(err error) {
	if h == nil || errors.Is(err, context.Canceled) {
		return // shutting down
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err != nil && !h.failing:
		h.failing, h.since, h.err = true, h.clock.Now(), err
		h.logger.Info("Namespace watch failing: removals read their namespace from the API server, and wait while it cannot be read", "err", err)
		h.onChange(false)
	case err != nil:
		h.err = err
	case h.failing:
		h.failing = false
		h.logger.Info("Namespace watch recovered", "failedFor", h.clock.Since(h.since).Round(time.Millisecond))
		h.onChange(true)
	}
}

// check returns nil while the namespace informer's requests succeed, else why not.
func (h *watchHealth) check() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failing {
		return nil
	}
	return fmt.Errorf("namespace watch failing since %s: %v", h.since.UTC().Format(time.RFC3339), h.err)
}

// resumeNamespaceHolds holds again, at the start, the namespace changes the
// last leader held (recorded on the record Lease: runNamespaceHoldRecord):
// each namespace whose labels or keep annotation are still not the ones
// acted on before its change is measured from those, as the change was
// then (namespaceWave), so that a restart or a new leader does not act on a
// change nobody approved. A namespace put back meanwhile, or deleted, is
// held no more; one approved meanwhile (its annotation names the change)
// goes by the approval. A record that does not parse fails the start, as a
// Lease that cannot be read does (startWave, which read lease).
func (c *Controller) resumeNamespaceHolds(ctx context.Context, lease *coordinationv1.Lease) error {
	r := c.opts.Waves.Record
	recorded, err := wave.HeldScopesOn(lease)
	if err != nil {
		return fmt.Errorf("--hold-waves: the namespace changes the last leader held: %w", err)
	}
	c.publishedNamespaceHolds = recorded
	logger := klog.FromContext(ctx)
	for name, rec := range recorded {
		obj, exists, err := c.namespaces.GetByKey(name)
		if err != nil || !exists {
			continue
		}
		cur, err := meta.Accessor(obj)
		if err != nil {
			continue
		}
		old, err := namespaceFromJSON(name, rec.Before)
		if err != nil {
			return fmt.Errorf("--hold-waves: the held change of namespace %s recorded on lease %s/%s: %w", name, r.Namespace, r.Name, err)
		}
		old.UID = cur.GetUID()
		logger.Info("Measuring again a namespace change the last leader held", "namespace", name, "change", rec.Change, "pods", rec.Pods)
		c.namespaceWave(old, cur)
	}
	return nil
}

// runNamespaceHoldRecord keeps the record Lease's list of held namespace
// changes (wave.AnnotationHeldNamespaces) the same as the leader's holds
// until ctx ends: written as soon as they change (a hold is on the Lease one
// write after it starts, and gone one write after its approval, revert or
// the namespace's deletion), and looked at again every waveRecordInterval,
// so that a write that failed is made again.
func (c *Controller) runNamespaceHoldRecord(ctx context.Context) {
	t := c.clock.NewTicker(waveRecordInterval)
	defer t.Stop()
	for {
		c.publishNamespaceHolds(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-c.namespaceHoldsChanged:
		}
	}
}

// namespaceHoldsMayHaveChanged wakes runNamespaceHoldRecord.
func (c *Controller) namespaceHoldsMayHaveChanged() {
	select {
	case c.namespaceHoldsChanged <- struct{}{}:
	default:
	}
}

// namespaceRecordRate and namespaceRecordBurst bound the writes of the held
// namespace changes to the Lease: a namespace whose labels flap between a
// change that is held and its revert makes a write per flap, at most
// namespaceRecordBurst at once and namespaceRecordRate a second; a change
// over the bound is written at a later look (every waveRecordInterval).
const (
	namespaceRecordRate  = 1
	namespaceRecordBurst = 5
)

// publishNamespaceHolds writes the held namespace changes to the record
// Lease when they differ from what it holds, within namespaceRecordRate.
func (c *Controller) publishNamespaceHolds(ctx context.Context) {
	held := c.namespaceWaves.Snapshot()
	if maps.EqualFunc(held, c.publishedNamespaceHolds, func(a, b wave.ScopeHold) bool {
		return a.Change == b.Change && a.Pods == b.Pods && string(a.Before) == string(b.Before)
	}) || !c.namespaceRecordWrites.AllowN(c.clock.Now(), 1) {
		return
	}
	logger := klog.FromContext(ctx)
	left, err := c.opts.Waves.Record.PublishScopes(ctx, held)
	if err != nil {
		logger.Error(err, "Cannot record the held namespace changes; a restart would not hold them again", "namespaces", len(held))
		return
	}
	if len(left) > 0 {
		logger.Info("Warning: too many held namespace changes to record on the Lease; a restart does not hold these again",
			"count", len(left), "first", left[:min(len(left), 10)])
	}
	c.publishedNamespaceHolds = held
}
