package wave

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/policy"
)

// The annotations of the record Lease.
const (
	// AnnotationApprove is what a person sets to a held change's ID to
	// approve it: kubectl annotate lease -n NS NAME podjanitor.io/approve-wave=ID.
	AnnotationApprove = policy.ApproveWaveAnnotation
	// AnnotationHeld is the held change's ID, AnnotationHeldPods its wave's
	// size, AnnotationHeldSource what changed; podjanitor writes them.
	AnnotationHeld       = "podjanitor.io/held-wave"
	AnnotationHeldPods   = "podjanitor.io/held-wave-pods"
	AnnotationHeldSource = "podjanitor.io/held-wave-source"
	// AnnotationBaseline and AnnotationBaselineHash are where an earlier
	// podjanitor recorded the policy acted on, on the Lease (now
	// KeyPolicy and KeyPolicyHash in the record ConfigMap): read when the
	// ConfigMap has no policy yet, and taken off the Lease once it has.
	AnnotationBaseline     = "podjanitor.io/policy"
	AnnotationBaselineHash = "podjanitor.io/policy-sha256"
)

// The record ConfigMap's keys of the cluster's policy acted on (held or
// not): KeyPolicy its rules and scope as JSON, the next leader's start is
// measured against it, and podjanitor plan tells held pods from others by
// it; KeyPolicyHash its SHA-256 (hex), recorded even when the policy is too
// large to record, and empty when none was acted on yet.
const (
	KeyPolicy     = "policy.json"
	KeyPolicyHash = "policy.sha256"
)

// maxBaseline is the largest baseline recorded; with the held namespace
// changes (maxHeldScopes) and the namespaces acted on, it stays within the
// 1 MiB of data the API server stores per ConfigMap.
const maxBaseline = 128 << 10

// Record is where holds and approvals live. The held change of the
// cluster's policy and its approval are annotations of podjanitor's Lease
// (--leader-elect-resource-name) in its own namespace: a namespace owner
// cannot write there, so cannot approve a change of the cluster's rules;
// an approval there survives restarts and a new leader. What was acted on
// (the policy, the held namespace changes, the namespaces) is in the
// ConfigMap beside it (RecordName), written only when it changes: the
// Lease's renewals, every few seconds, carry none of it.
type Record struct {
	Client          kubernetes.Interface
	Namespace, Name string
}

// RecordName is the name of the record ConfigMap of the Lease lease.
func RecordName(lease string) string { return lease + recordSuffix }

const recordSuffix = "-namespaces"

// MaxLeaseName is the longest Lease name whose record's name is still a
// valid object name (253 characters).
const MaxLeaseName = 253 - len(recordSuffix)

// Stored is the record as one read found it: the Lease and the ConfigMap
// (nil: not there).
type Stored struct {
	Lease     *coordinationv1.Lease
	ConfigMap *corev1.ConfigMap
	// Forbidden is why the ConfigMap could not be read (RBAC of an earlier
	// release): what the Lease records (as earlier releases wrote it) is
	// all there is; nil when it was read.
	Forbidden error
}

// value is the ConfigMap's key, or, when it has none, the Lease's legacy
// annotation (written before the ConfigMap recorded it).
func (s Stored) value(key, legacy string) (string, bool) {
	if s.ConfigMap != nil {
		if v, ok := s.ConfigMap.Data[key]; ok {
			return v, true
		}
	}
	if s.Lease != nil && legacy != "" {
		v, ok := s.Lease.Annotations[legacy]
		return v, ok
	}
	return "", false
}

// annotation is one of the Lease's annotations.
func (s Stored) annotation(key string) string {
	if s.Lease == nil {
		return ""
	}
	return s.Lease.Annotations[key]
}

// Ref is the Lease, for the Events of held waves.
func (r Record) Ref() *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: "coordination.k8s.io/v1", Kind: "Lease", Namespace: r.Namespace, Name: r.Name}
}

// ApproveCommand is the one command that approves the change id.
func (r Record) ApproveCommand(id string) string {
	return fmt.Sprintf("kubectl annotate lease -n %s %s --overwrite %s=%s", r.Namespace, r.Name, AnnotationApprove, id)
}

// Approved returns the change ID a person approved ("" for none). A Lease
// that does not exist approves nothing.
func (r Record) Approved(ctx context.Context) (string, error) {
	l, err := r.ReadLease(ctx)
	if err != nil || l == nil {
		return "", err
	}
	return l.Annotations[AnnotationApprove], nil
}

// Publish writes the held change (nil: none) on the Lease, creating it if
// it does not exist (leader election off), and takes off an approval of
// used (a change carried out, reverted or held no more: an approval covers
// one occurrence of a change).
func (r Record) Publish(ctx context.Context, h *Hold, used ...string) error {
	if err := r.update(ctx, func(l *coordinationv1.Lease) bool { return setHeld(l, h, used) }); err != nil {
		return fmt.Errorf("recording the held wave on lease %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}

// PublishBaseline records the policy acted on, baseline (its JSON; nil:
// none acted on yet), in the record ConfigMap, and then takes the legacy
// annotations of an earlier podjanitor off the Lease.
func (r Record) PublishBaseline(ctx context.Context, baseline []byte) error {
	want := map[string]string{KeyPolicyHash: ""}
	if baseline != nil {
		want[KeyPolicyHash] = BaselineHash(baseline)
		if len(baseline) <= maxBaseline {
			want[KeyPolicy] = string(baseline)
		}
	}
	if err := r.updateData(ctx, want, KeyPolicy, KeyPolicyHash); err != nil {
		return fmt.Errorf("recording the policy acted on in configmap %s/%s: %w", r.Namespace, RecordName(r.Name), err)
	}
	return r.dropLegacy(ctx, AnnotationBaseline, AnnotationBaselineHash)
}

// dropLegacy takes the annotations keys, which the ConfigMap now records,
// off the Lease.
func (r Record) dropLegacy(ctx context.Context, keys ...string) error {
	err := r.update(ctx, func(l *coordinationv1.Lease) bool { return setAnnotations(l, nil, keys...) })
	if err != nil {
		return fmt.Errorf("taking the record of an earlier version off lease %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}

// updateData makes the record ConfigMap's keys what want says (absent from
// want: none), creating the ConfigMap when it is not there; the other keys
// (other parts of the record) are left as they are.
func (r Record) updateData(ctx context.Context, want map[string]string, keys ...string) error {
	return UpdateConfigMap(ctx, r.Client.CoreV1(), r.Namespace, RecordName(r.Name), func(cm *corev1.ConfigMap) {
		for _, k := range keys {
			if v, ok := want[k]; ok {
				if cm.Data == nil {
					cm.Data = map[string]string{}
				}
				cm.Data[k] = v
			} else {
				delete(cm.Data, k)
			}
		}
	})
}

// UpdateConfigMap applies set to the ConfigMap namespace/name, retrying
// conflicts, and writes it when that changed its data; one not there is
// created (labelled as podjanitor's).
func UpdateConfigMap(ctx context.Context, client corev1client.ConfigMapsGetter, namespace, name string, set func(*corev1.ConfigMap)) error {
	cms := client.ConfigMaps(namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "podjanitor"}}}
			set(cm)
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), name, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		before := cm.DeepCopy()
		set(cm)
		if equality.Semantic.DeepEqual(before.Data, cm.Data) && equality.Semantic.DeepEqual(before.BinaryData, cm.BinaryData) {
			return nil
		}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
}

// update applies set to the Lease, retrying conflicts, and writes it when
// set reports a change; a Lease not there is created, unless set changes
// nothing on an empty one.
func (r Record) update(ctx context.Context, set func(*coordinationv1.Lease) (changed bool)) error {
	leases := r.Client.CoordinationV1().Leases(r.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, r.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name}}
			if !set(l) {
				return nil
			}
			_, err = leases.Create(ctx, l, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(coordinationv1.Resource("leases"), r.Name, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if !set(l) {
			return nil
		}
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
}

// setHeld sets the Lease's hold annotations and takes off an approval of
// used; it reports whether they changed.
func setHeld(l *coordinationv1.Lease, h *Hold, used []string) bool {
	changed := false
	if a, ok := l.Annotations[AnnotationApprove]; ok && slices.Contains(used, a) {
		delete(l.Annotations, AnnotationApprove)
		changed = true
	}
	want := map[string]string{}
	if h != nil {
		want[AnnotationHeld] = h.ID
		want[AnnotationHeldPods] = strconv.Itoa(h.Pods)
		want[AnnotationHeldSource] = h.Source
	}
	return setAnnotations(l, want, AnnotationHeld, AnnotationHeldPods, AnnotationHeldSource) || changed
}

// setAnnotations makes the Lease's annotations keys what want says (absent
// from want: none) and reports whether that changed them.
func setAnnotations(l *coordinationv1.Lease, want map[string]string, keys ...string) bool {
	changed := false
	for _, k := range keys {
		v, ok := want[k]
		if old, had := l.Annotations[k]; had == ok && old == v {
			continue
		}
		changed = true
		if !ok {
			delete(l.Annotations, k)
			continue
		}
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[k] = v
	}
	return changed
}

// BaselineHash is the hash of a policy as AnnotationBaselineHash records it.
func BaselineHash(policy []byte) string {
	h := PolicyHash(policy)
	return hex.EncodeToString(h[:])
}

// ReadLease reads the Lease alone: nil when it is not there.
func (r Record) ReadLease(ctx context.Context) (*coordinationv1.Lease, error) {
	l, err := r.Client.CoordinationV1().Leases(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading lease %s/%s: %w", r.Namespace, r.Name, err)
	}
	return l, nil
}

// Read reads the record: the Lease and the ConfigMap, each nil when it is
// not there. A ConfigMap podjanitor may not read is noted in Forbidden;
// one it cannot read for another reason is an error, with the Lease read.
func (r Record) Read(ctx context.Context) (Stored, error) {
	l, err := r.ReadLease(ctx)
	if err != nil {
		return Stored{}, err
	}
	name := RecordName(r.Name)
	cm, err := r.Client.CoreV1().ConfigMaps(r.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return Stored{Lease: l}, nil
	}
	if apierrors.IsForbidden(err) {
		return Stored{Lease: l, Forbidden: fmt.Errorf("reading configmap %s/%s: %w", r.Namespace, name, err)}, nil
	}
	if err != nil {
		return Stored{Lease: l}, fmt.Errorf("reading configmap %s/%s: %w", r.Namespace, name, err)
	}
	return Stored{Lease: l, ConfigMap: cm}, nil
}

// Baseline is the policy the last leader acted on, as s records it: its
// hash ("" for none recorded: a first install) and its JSON (nil when it was
// too large to record, or does not match the hash).
func (s Stored) Baseline() (hash string, policy []byte) {
	hash, _ = s.value(KeyPolicyHash, AnnotationBaselineHash)
	if b, ok := s.value(KeyPolicy, AnnotationBaseline); ok && hash != "" && BaselineHash([]byte(b)) == hash {
		policy = []byte(b)
	}
	return hash, policy
}

// Held is the hold of the cluster's policy s records: the change's ID (""
// for none), and its wave's size.
func (s Stored) Held() (id string, pods int) {
	pods, _ = strconv.Atoi(s.annotation(AnnotationHeldPods))
	return s.annotation(AnnotationHeld), pods
}

// Approval is the change ID a person approved on the Lease ("" for none).
func (s Stored) Approval() string { return s.annotation(AnnotationApprove) }

// Options are a Guard's settings for the controller (--hold-waves and the
// --wave-* flags).
type Options struct {
	Threshold Threshold
	// Window: pods due within it count as due now.
	Window time.Duration
	// Record is where holds are published and approved.
	Record Record
	// Spread measures together the changes of namespaces (tenant policies,
	// labels or keep) that no namespace holds on its own; nil: none.
	Spread *Spread
	// StartReadFor is how long a start tries to read what the last leader
	// recorded before it fails (ReadAtStart); 0: DefaultStartReadFor.
	StartReadFor time.Duration
}

// Keep keeps the Record in step with g until ctx ends, looking every
// interval: the policy acted on (the baseline) is recorded for the next
// leader's start whenever it changes, a new hold is published (and held is told, for its Event), an
// end of it too, and the approval of the held change found on the Lease is
// taken (approved gets the keys of the pods it held, to decide again). An
// approval already on the Lease when a change is held is taken at once: it
// lives in the API server, so it outlasts a restart and a leader change.
// It is used once: taken off the Lease once its change is carried out,
// reverted or held no more (another change held instead), and one found
// there for a hold not yet published on the Lease (a change made while this
// leader runs, or a start's that the last leader did not record) is an
// earlier occurrence's and comes off unused, so that the same change made
// again later is held again and needs an approval of its own.
//
// recorded is the hold the last leader published on the Lease, as the start
// read it ("" for none): an approval on the Lease of it is a person's answer
// to it, which a start that holds the same change takes.
func (r Record) Keep(ctx context.Context, g *Guard, recorded string, clk clock.WithTicker, interval time.Duration, held func(Hold), approved func(Hold, []string)) {
	logger := klog.FromContext(ctx).WithValues("lease", klog.KRef(r.Namespace, r.Name))
	var published *Hold
	var publishedBaseline *string // its hash; nil: not written yet
	// used are changes whose approval, if any, comes off the Lease.
	var used []string
	ticker := clk.NewTicker(interval)
	defer ticker.Stop()
	for {
		h, holding := g.Held()
		if holding && !sameHold(&h, published) && (h.Source != SourceStartup || h.ID != recorded) {
			// A hold not published yet: an approval of it on the Lease
			// already is one of an earlier occurrence, left there; it
			// comes off as the hold is published.
			used = append(used, h.ID)
		} else if holding {
			id, err := r.Approved(ctx)
			if err != nil {
				logger.Error(err, "Cannot read approvals of the held wave", "change", h.ID)
			} else if id == h.ID {
				if keys, ok := g.Approve(id); ok {
					logger.Info("Wave approved, removing its pods at the removal rate", "change", id, "pods", len(keys))
					approved(h, keys)
					holding, used = false, append(used, id)
				}
			}
		}
		var want *Hold
		if holding {
			want = &h
		}
		if published != nil && !sameHold(want, published) {
			used = append(used, published.ID)
		}
		if !sameHold(want, published) || len(used) > 0 {
			if err := r.Publish(ctx, want, used...); err != nil {
				logger.Error(err, "Cannot record the held wave")
			} else {
				if want != nil && !sameHold(want, published) {
					held(h)
				}
				published, used = want, nil
			}
		}
		baseline := g.BaselinePolicy()
		var baselineHash string
		if baseline != nil {
			baselineHash = BaselineHash(baseline)
		}
		if publishedBaseline == nil || baselineHash != *publishedBaseline {
			err := r.PublishBaseline(ctx, baseline)
			switch {
			case apierrors.IsForbidden(err):
				// Tried again when it changes, not at every look.
				logger.Error(err, "Cannot record the policy acted on (RBAC: get, update and create the ConfigMap by name in podjanitor's namespace); the next leader's start is measured as a first install's")
				publishedBaseline = &baselineHash
			case err != nil:
				logger.Error(err, "Cannot record the policy acted on")
			default:
				publishedBaseline = &baselineHash
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
	}
}

func sameHold(a, b *Hold) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.ID == b.ID
}
