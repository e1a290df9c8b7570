// Package namespacecontroller is podjanitor's controller of namespaces: what
// decisions read of a namespace (its labels and keep annotation) as its
// change was measured (Info), the re-decision of a namespace's pods when
// that changes, the hold of a change that makes too many of them due at once
// (--hold-waves) with its approval (used once) and its record (wave.Record),
// the record of what was acted on of each namespace for the next start
// (Record, a ConfigMap), a fresh read
// before a removal (Reader), one warning per invalid keep value (Warnings),
// and the health of the namespace watch (WatchHealth).
//
// The pod controller sees it through Info, WarnOnce, Check and Forget; the
// controller reaches back only through the callbacks of its Config.
package namespacecontroller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/podcache"
	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// Config is what the controller is given. Every func is required.
type Config struct {
	// Pods is the pod cache with its namespace index: a change of a
	// namespace is measured against its pods.
	Pods cache.Indexer
	// Decide decides pods as the running evaluator does, with ns for their
	// namespace.
	Decide func(ns *policy.Namespace) wave.Decide
	// Now is the API server's time as the process estimates it.
	Now   func() time.Time
	Clock clock.WithTicker
	// Reporter records the Warning of a held change.
	Reporter *events.Reporter
	// Waves holds a change whose wave is too large; nil holds nothing
	// (--hold-waves=false). OnHeld counts the pods held (the metric).
	Waves  *wave.Options
	OnHeld func(source string, n int)
	// Redecide decides a namespace's pods again (coalesced by the caller).
	Redecide func(namespace string)
	// Requeue decides a pod again now: a held change was approved.
	Requeue func(key cache.ObjectName)
	// Terminating is told of a namespace whose deletion began.
	Terminating func(namespace string)
	// ConfigMaps keeps, with Waves, what the leader acted on of each
	// namespace in the record ConfigMap beside the Lease (Record), for the
	// next start to measure the changes made while no podjanitor ran; nil:
	// none kept.
	ConfigMaps corev1client.ConfigMapsGetter
}

// Controller follows the namespaces of the namespace informer. A change of a
// namespace's labels or keep annotation decides its pods again; with holds,
// it is first measured against its pods and held when it makes too many of
// them due at once (a Warning Event on the Namespace says how to approve it:
// podjanitor.io/approve-wave=<change-id> on the Namespace, which only those
// who may update Namespaces can set). The leader records the held changes on
// the record, so that a restart or a new leader measures them again
// (Resume) rather than act on a change nobody approved.
type Controller struct {
	cfg        Config
	namespaces cache.Indexer
	synced     cache.InformerSynced
	warnings   Warnings
	// queue has the names of the namespaces the informer heard of a
	// change of; sync takes each.
	queue workqueue.TypedRateLimitingInterface[string]
	// measured is, by name, each namespace as sync last took it, after
	// measuring its change (*taken): what pods are decided by (Info), and
	// what its next change is measured from. The cache has a change a
	// moment before sync measures it; a pod decided in that moment goes by
	// what was measured.
	measured sync.Map

	// holds are the held changes by namespace; nil without Config.Waves.
	holds *wave.Holds
	// published is what the record holds of them, as the start read
	// it and runRecord wrote it since; changed wakes runRecord.
	published map[string]wave.ScopeHold
	changed   chan struct{}
	// recordWrites bounds the record's writes (recordRate).
	recordWrites *rate.Limiter
	// leading: this replica leads (Lead); it reports holds in Events,
	// which every replica's informers hear of.
	leading atomic.Bool

	// used is, by namespace, the last approval taken of it: a change's ID
	// is salted with it (stateJSON), so that an approval is used once.
	// record keeps what was acted on of each namespace (nil: not kept);
	// acted is each namespace as its handler last took it (once measured),
	// dirty says the record may differ from it, and recordWrite bounds its
	// writes (actedInterval). actedMu guards them.
	actedMu     sync.Mutex
	used        map[string]string
	record      *Record
	acted       map[string]*metav1.ObjectMeta
	dirty       bool
	recordWrite *rate.Limiter
	recordErr   string
	written     []byte // the record as last written
}

// New follows the namespaces of informer (podcache.NamespaceTransform's
// metadata). It starts nothing: Run takes the changes it hears of.
func New(ctx context.Context, informer cache.SharedIndexInformer, cfg Config) (*Controller, error) {
	logger := klog.FromContext(ctx)
	c := &Controller{
		cfg:        cfg,
		namespaces: informer.GetIndexer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "namespaces"}),
		used:         map[string]string{},
		changed:      make(chan struct{}, 1),
		recordWrites: rate.NewLimiter(recordRate, RecordBurst),
	}
	if w := cfg.Waves; w != nil {
		c.holds = wave.NewHolds(wave.SourceNamespace, w.Threshold, w.Window, cfg.OnHeld)
		if w.Spread != nil {
			c.holds.SetSpread(w.Spread)
		}
		if cfg.ConfigMaps != nil {
			c.record = &Record{Client: cfg.ConfigMaps, Namespace: w.Record.Namespace, Name: wave.RecordName(w.Record.Name)}
			c.acted = map[string]*metav1.ObjectMeta{}
			c.recordWrite = rate.NewLimiter(rate.Every(actedInterval), actedBurst)
		}
	}
	handler, err := informer.AddEventHandlerWithOptions(c.eventHandler(), cache.HandlerOptions{Logger: &logger})
	if err != nil {
		return nil, fmt.Errorf("adding namespace event handler: %w", err)
	}
	c.synced = handler.HasSynced
	return c, nil
}

// HasSynced reports whether the handler has taken the informer's initial list.
func (c *Controller) HasSynced() bool { return c.synced() }

// taken is a namespace as sync took it: its metadata (name, UID, labels,
// annotations, deletion) and what decisions read of it.
type taken struct {
	meta *metav1.ObjectMeta
	info *policy.Namespace
}

// Info is what decisions read of a namespace: its labels and keep as sync
// last took them, once their change was measured (nil: not known).
func (c *Controller) Info(name string) *policy.Namespace {
	if t, ok := c.lastTaken(name); ok {
		return t.info
	}
	return nil
}

func (c *Controller) lastTaken(name string) (*taken, bool) {
	t, ok := c.measured.Load(name)
	if !ok {
		return nil, false
	}
	return t.(*taken), true
}

// take makes m what decisions read of its namespace, and notes it acted on.
func (c *Controller) take(m metav1.Object) {
	c.measured.Store(m.GetName(), &taken{
		meta: &metav1.ObjectMeta{Name: m.GetName(), UID: m.GetUID(), Labels: m.GetLabels(), Annotations: m.GetAnnotations(), DeletionTimestamp: m.GetDeletionTimestamp()},
		info: &policy.Namespace{Labels: m.GetLabels(), Annotations: m.GetAnnotations()},
	})
	c.took(m)
}

// WarnOnce says whether the namespace is to be warned about its invalid
// keep value (Warnings).
func (c *Controller) WarnOnce(namespace, value string) bool {
	return c.warnings.WarnOnce(namespace, value)
}

// Lead marks this replica the leader: its holds are reported in Events.
func (c *Controller) Lead() { c.leading.Store(true) }

// Holds are the held changes by namespace; nil without Config.Waves.
func (c *Controller) Holds() *wave.Holds { return c.holds }

// eventHandler takes the informer's initial list at once (what decisions
// read from the start; a start's measure against the record is Resume's),
// and queues the name of every namespace it hears of after that: added,
// changed or deleted. sync takes them in turn, so that changes that come
// together are measured together, from what was measured last.
func (c *Controller) eventHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, isInInitialList bool) {
			if m, err := meta.Accessor(obj); err == nil && isInInitialList {
				c.take(m)
				return
			}
			c.enqueue(obj)
		},
		UpdateFunc: func(_, cur interface{}) { c.enqueue(cur) },
		DeleteFunc: c.enqueue,
	}
}

func (c *Controller) enqueue(obj interface{}) {
	name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	c.queue.Add(name)
}

// Run takes the queued namespaces until ctx ends, one at a time (a
// namespace's change is measured against its pods in the pod cache).
func (c *Controller) Run(ctx context.Context) {
	defer utilruntime.HandleCrashWithContext(ctx)
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for c.processNext() {
	}
}

func (c *Controller) processNext() bool {
	name, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(name)
	c.sync(name)
	c.queue.Forget(name)
	return true
}

// sync takes the namespace name as the cache has it now, against what was
// taken of it last: a change of its labels or keep annotation is measured
// (Measure: held when its wave is too large), an approval on it taken, and
// its pods decided again by it; one not taken before is new, its pods
// decided as they are. One the cache no longer has, or has under another
// UID (deleted and made again), takes its held change and its record with
// it: a namespace made again under its name starts with nothing held.
func (c *Controller) sync(name string) {
	prev, known := c.lastTaken(name)
	cur, exists := c.cached(name)
	if known && (!exists || cur.GetUID() != prev.meta.UID) {
		c.measured.Delete(name)
		c.warnings.Forget(prev.meta)
		c.forgetActed(name)
		if c.holds != nil && c.holds.End(name, "namespace/"+name) {
			c.mayHaveChanged()
		}
		known = false
	}
	if !exists {
		return
	}
	if !known {
		c.take(cur)
		c.cfg.Redecide(name)
		return
	}
	c.Measure(prev.meta, cur)
	annotationsChanged := !maps.Equal(prev.meta.Annotations, cur.GetAnnotations())
	redecide := annotationsChanged || !maps.Equal(prev.meta.Labels, cur.GetLabels())
	c.take(cur)
	if annotationsChanged {
		c.warnings.Forget(cur)
	}
	if prev.meta.DeletionTimestamp == nil && cur.GetDeletionTimestamp() != nil {
		c.cfg.Terminating(name)
	}
	if redecide {
		c.cfg.Redecide(name)
	}
}

// Measure measures a change (the informer's update calls it) of a namespace's labels or keep annotation
// against the namespace's pods before its pods are decided again, and
// holds it when its wave is too large; and it takes the approval of the
// namespace's held change.
func (c *Controller) Measure(old, cur metav1.Object) {
	if c.holds == nil {
		return
	}
	name := cur.GetName()
	object := "namespace/" + name
	if before, after := c.stateJSON(old), c.stateJSON(cur); string(before) != string(after) {
		defer c.mayHaveChanged() // held, or a revert that ends a hold
		if h, held := c.holds.Change(name, object, before, c.decider(old), after, c.decider(cur), podcache.PodsOf(c.cfg.Pods, name), c.cfg.Now()); held {
			command := ApproveCommand(name, h.ID)
			klog.Background().Info("Holding the removals of a namespace's change: its labels or keep annotation make too many of its pods due at once",
				"namespace", name, "change", h.ID, "pods", h.Pods, "approve", command)
			if c.leading.Load() { // the leader's Event, not every replica's
				c.cfg.Reporter.RemovalsHeld(&corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: name, UID: cur.GetUID()},
					"this change of the namespace's labels or keep annotation", h.Pods, command)
			}
		}
	}
	if id := cur.GetAnnotations()[podcache.ApproveWaveAnnotation]; id != "" {
		if keys, ok := c.holds.Approve(name, object, id); ok {
			c.setUsed(name, id)
			c.mayHaveChanged()
			klog.Background().Info("Namespace's wave approved, removing its pods at the removal rate", "namespace", name, "change", id, "pods", len(keys))
			if c.leading.Load() {
				c.cfg.Reporter.RemovalsApproved(&corev1.ObjectReference{APIVersion: "v1", Kind: "Namespace", Name: name, UID: cur.GetUID()}, id, len(keys))
			}
			for _, k := range keys {
				if key, err := cache.ParseObjectName(k); err == nil {
					c.cfg.Requeue(key)
				}
			}
		}
	}
}

// ApproveCommand is the one command that approves the held change id of a
// namespace.
func ApproveCommand(namespace, id string) string {
	return fmt.Sprintf("kubectl annotate namespace %s --overwrite %s=%s", namespace, wave.AnnotationApprove, id)
}

// stateJSON is namespaceJSON of m with the last approval taken of it.
func (c *Controller) stateJSON(m metav1.Object) []byte {
	c.actedMu.Lock()
	used := c.used[m.GetName()]
	c.actedMu.Unlock()
	return namespaceJSON(m, used)
}

// setUsed records id as the last approval taken of the namespace: the
// next change's ID differs from it, whatever the change (the same change
// reverted and made again included), so that the approval, left on the
// Namespace (podjanitor cannot write Namespaces), approves it no more.
func (c *Controller) setUsed(namespace, id string) {
	c.actedMu.Lock()
	defer c.actedMu.Unlock()
	if c.used[namespace] != id {
		c.used[namespace] = id
		c.dirty = true
	}
}

// namespaceJSON names what decisions read of a namespace in a change ID: its
// labels and the annotations the cache keeps, but the approval; and used,
// the last approval taken of it ("" for none), which tells one occurrence
// of a change from the next.
func namespaceJSON(m metav1.Object, used string) []byte {
	annotations := maps.Clone(m.GetAnnotations())
	delete(annotations, podcache.ApproveWaveAnnotation)
	if len(annotations) == 0 {
		annotations = nil // none and an empty map are the same
	}
	labels := m.GetLabels()
	if len(labels) == 0 {
		labels = nil
	}
	state := map[string]any{"namespace": m.GetName(), "labels": labels, "annotations": annotations}
	if used != "" {
		state["approvalUsed"] = used
	}
	b, err := json.Marshal(state)
	if err != nil {
		return []byte(m.GetName())
	}
	return b
}

// NamespaceFromJSON is the namespace name as namespaceJSON wrote it: its
// labels and the annotations the cache keeps.
func NamespaceFromJSON(name string, b []byte) (*metav1.ObjectMeta, error) {
	m, err := stateFromJSON(b)
	if err != nil {
		return nil, err
	}
	return &metav1.ObjectMeta{Name: name, Labels: m.Labels, Annotations: m.Annotations}, nil
}

type state struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
	ApprovalUsed string            `json:"approvalUsed"`
}

func stateFromJSON(b []byte) (state, error) {
	var m state
	err := json.Unmarshal(b, &m)
	return m, err
}

// decider decides pods as the running evaluator does, with m for their
// namespace, for a wave.
func (c *Controller) decider(m metav1.Object) wave.Decide {
	return c.cfg.Decide(&policy.Namespace{Labels: m.GetLabels(), Annotations: m.GetAnnotations()})
}

// Resume measures, at the start, the namespaces against what the last
// leader acted on, so that a restart or a new leader does not act on a
// change nobody approved:
//   - the namespace changes it held (recorded in the record:
//     runRecord) are held again: each namespace whose labels or keep
//     annotation are still not the ones acted on before its change is
//     measured from those, as the change was then; one put back meanwhile,
//     or deleted, is held no more; one approved meanwhile (its annotation
//     names the change) goes by the approval;
//   - every other namespace that differs from what the record ConfigMap
//     (Record) says was acted on of it, changed while no podjanitor ran, is
//     measured from that, as a change made while one ran is. A namespace
//     not in it, or made again under its name (another UID), is new: its
//     pods are decided as they are, as a namespace's arrival is.
//
// A record that does not parse is an error wrapping wave.ErrBadRecord (the
// start is then measured as a first install's, and the record written anew);
// a record podjanitor may not read (RBAC) or that was too large to write
// measures nothing and says so.
func (c *Controller) Resume(ctx context.Context, stored wave.Stored) error {
	r := c.cfg.Waves.Record
	recorded, err := stored.HeldScopes()
	if err != nil {
		// Written anew at the first look, whatever is held then.
		c.published = map[string]wave.ScopeHold{"": {}}
		return fmt.Errorf("--hold-waves: the namespace changes the last leader held: %w", err)
	}
	c.published = recorded
	logger := klog.FromContext(ctx)
	var changed []*metav1.ObjectMeta
	if c.record != nil {
		acted, err := ActedIn(stored.ConfigMap)
		switch {
		case errors.Is(err, ErrRecordTooLarge):
			logger.Info("Warning: the last leader could not record the namespaces it acted on; changes of their labels or keep annotation made while no podjanitor ran are not measured", "err", err.Error())
		case stored.Forbidden != nil:
			logger.Error(stored.Forbidden, "Cannot read the namespaces the last leader acted on (RBAC: get configmaps by name in podjanitor's namespace); changes of their labels or keep annotation made while no podjanitor ran are not measured")
		case err != nil:
			return fmt.Errorf("--hold-waves: the namespaces the last leader acted on: %w", err)
		}
		if changed, err = c.takeRecord(acted, recorded); err != nil {
			return err
		}
	}
	for name, rec := range recorded {
		cur, ok := c.cached(name)
		if !ok {
			continue
		}
		old, err := NamespaceFromJSON(name, rec.Before)
		if err != nil {
			return fmt.Errorf("--hold-waves: configmap %s/%s: %s: the held change of namespace %s: %w: %w", r.Namespace, wave.RecordName(r.Name), wave.KeyHeldNamespaces, name, wave.ErrBadRecord, err)
		}
		old.UID = cur.GetUID()
		logger.Info("Measuring again a namespace change the last leader held", "namespace", name, "change", rec.Change, "pods", rec.Pods)
		c.Measure(old, cur)
		c.take(cur) // measured: a change of it queued meanwhile is measured from here
	}
	for _, old := range changed {
		if cur, ok := c.cached(old.Name); ok && cur.GetUID() == old.UID {
			logger.V(2).Info("Measuring a namespace change made while no podjanitor ran", "namespace", old.Name)
			c.Measure(old, cur)
			c.take(cur)
		}
	}
	if len(changed) > 0 {
		logger.Info("Measured the namespace changes made while no podjanitor ran", "namespaces", len(changed))
	}
	return nil
}

// takeRecord reads what the record says was acted on of each namespace
// still there under the same UID: the last approval taken of it, unless
// one was taken since (a standby's handler takes approvals too); and,
// unless held is the namespace's record of a held change, the namespace as
// it was acted on when it differs from the cache now (changed while no
// podjanitor ran), by name.
func (c *Controller) takeRecord(acted map[string]Acted, held map[string]wave.ScopeHold) ([]*metav1.ObjectMeta, error) {
	var changed []*metav1.ObjectMeta
	for _, name := range slices.Sorted(maps.Keys(acted)) {
		a := acted[name]
		cur, ok := c.cached(name)
		if !ok || cur.GetUID() != a.UID {
			continue
		}
		st, err := stateFromJSON(a.State)
		if err != nil {
			return nil, fmt.Errorf("--hold-waves: configmap %s/%s: namespace %s: %w: %w", c.record.Namespace, c.record.Name, name, wave.ErrBadRecord, err)
		}
		c.actedMu.Lock()
		if _, taken := c.used[name]; !taken && st.ApprovalUsed != "" {
			c.used[name] = st.ApprovalUsed
		}
		c.actedMu.Unlock()
		if _, isHeld := held[name]; !isHeld && string(a.State) != string(c.stateJSON(cur)) {
			changed = append(changed, &metav1.ObjectMeta{Name: name, UID: a.UID, Labels: st.Labels, Annotations: st.Annotations})
		}
	}
	return changed, nil
}

// cached is the namespace name as the namespace cache has it.
func (c *Controller) cached(name string) (metav1.Object, bool) {
	obj, exists, err := c.namespaces.GetByKey(name)
	if err != nil || !exists {
		return nil, false
	}
	m, err := meta.Accessor(obj)
	return m, err == nil
}

// took notes the namespace m as its handler took it: acted on, unless a
// change of it waits (Holds.Before, at the record's write).
func (c *Controller) took(m metav1.Object) {
	if c.record == nil {
		return
	}
	c.actedMu.Lock()
	defer c.actedMu.Unlock()
	if old, ok := c.acted[m.GetName()]; !ok || old.UID != m.GetUID() || !maps.Equal(old.Labels, m.GetLabels()) || !maps.Equal(old.Annotations, m.GetAnnotations()) {
		c.acted[m.GetName()] = &metav1.ObjectMeta{Name: m.GetName(), UID: m.GetUID(), Labels: m.GetLabels(), Annotations: m.GetAnnotations()}
		c.dirty = true
	}
}

// forgetActed drops a deleted namespace from the record.
func (c *Controller) forgetActed(name string) {
	c.actedMu.Lock()
	defer c.actedMu.Unlock()
	delete(c.used, name)
	if _, ok := c.acted[name]; ok {
		delete(c.acted, name)
		c.dirty = true
	}
}

// actedInterval and actedBurst bound the writes of the record ConfigMap: a
// namespace's change is written at the record's next look (RecordInterval,
// or at once when a hold starts or ends), at most actedBurst writes in a
// row and then one an actedInterval. A change acted on and not yet written
// is measured again at a start, from what was written before: held again
// only when it was held (and then approved, which the record of the approval
// taken still says) or is large; a namespace made and not yet written is
// new to a start, its changes not measured.
const (
	actedInterval = 10 * time.Second
	actedBurst    = 5
)

// writeRecord writes the record ConfigMap when what was acted on may have
// changed since the last write, within actedInterval and actedBurst. A namespace
// with a change that waits (held, or pending in the Spread) is recorded as
// it was before the change: a start measures the change again; and the
// record is written again at the next look, for the wait may end without
// an event of the namespace.
func (c *Controller) writeRecord(ctx context.Context) {
	c.actedMu.Lock()
	if !c.dirty || !c.recordWrite.AllowN(c.cfg.Clock.Now(), 1) {
		c.actedMu.Unlock()
		return
	}
	now := c.cfg.Now()
	entries := make(map[string]Acted, len(c.acted))
	waiting := false
	for name, m := range c.acted {
		a := Acted{UID: m.UID, State: namespaceJSON(m, c.used[name])}
		if before, ok := c.holds.Before(name, now); ok && json.Valid(before) {
			a.State, waiting = before, true
		}
		entries[name] = a
	}
	c.dirty = waiting
	c.actedMu.Unlock()

	logger := klog.FromContext(ctx)
	encoded, err := encodeRecord(entries)
	if err == nil && bytes.Equal(encoded, c.written) {
		return
	}
	if err == nil {
		err = c.record.Write(ctx, encoded, len(entries))
	}
	if err != nil {
		if !errors.Is(err, ErrRecordTooLarge) {
			c.actedMu.Lock()
			c.dirty = true // try again at the next look
			c.actedMu.Unlock()
		}
		if err.Error() != c.recordErr {
			logger.Error(err, "Cannot record the namespaces acted on; a change of a namespace's labels or keep annotation made while no podjanitor runs will not be measured at the next start")
		}
		c.recordErr = err.Error()
		return
	}
	if c.recordErr != "" {
		logger.Info("Recorded the namespaces acted on again", "namespaces", len(entries))
	}
	c.recordErr, c.written = "", encoded
}

// RecordInterval is how often the record is looked at again.
const RecordInterval = 2 * time.Second

// RunRecord keeps the record's held namespace changes (wave.KeyHeldNamespaces)
// the same as the leader's holds, and the namespaces acted on, until ctx
// ends: written as soon as they change (a hold is recorded one write
// after it starts, and gone one write after its approval, revert or the
// namespace's deletion), and looked at again every RecordInterval, so that
// a write that failed is made again.
func (c *Controller) RunRecord(ctx context.Context) {
	t := c.cfg.Clock.NewTicker(RecordInterval)
	defer t.Stop()
	for {
		c.Publish(ctx)
		if c.record != nil {
			c.writeRecord(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-c.changed:
		}
	}
}

// mayHaveChanged wakes RunRecord.
func (c *Controller) mayHaveChanged() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// recordRate and RecordBurst bound the writes of the held namespace changes
// to the Lease: a namespace whose labels flap between a change that is held
// and its revert makes a write per flap, at most RecordBurst at once and
// recordRate a second; a change over the bound is written at a later look
// (every RecordInterval).
const (
	recordRate  = 1
	RecordBurst = 5
)

// Publish writes the held namespace changes to the record when they
// differ from what it holds, within recordRate.
func (c *Controller) Publish(ctx context.Context) {
	held := c.holds.Snapshot()
	if maps.EqualFunc(held, c.published, func(a, b wave.ScopeHold) bool {
		return a.Change == b.Change && a.Pods == b.Pods && string(a.Before) == string(b.Before)
	}) || !c.recordWrites.AllowN(c.cfg.Clock.Now(), 1) {
		return
	}
	logger := klog.FromContext(ctx)
	left, err := c.cfg.Waves.Record.PublishScopes(ctx, held)
	if apierrors.IsForbidden(err) {
		// Tried again when they change, not at every look.
		logger.Error(err, "Cannot record the held namespace changes (RBAC: get, update and create the ConfigMap by name in podjanitor's namespace); a restart would not hold them again", "namespaces", len(held))
		c.published = held
		return
	}
	if err != nil {
		logger.Error(err, "Cannot record the held namespace changes; a restart would not hold them again", "namespaces", len(held))
		return
	}
	if len(left) > 0 {
		logger.Info("Warning: too many held namespace changes to record; a restart does not hold these again",
			"count", len(left), "first", left[:min(len(left), 10)])
	}
	c.published = held
}
