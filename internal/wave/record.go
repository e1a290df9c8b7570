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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// The annotations of the record Lease.
const (
	// AnnotationApprove is what a person sets to a held change's ID to
	// approve it: kubectl annotate lease -n NS NAME podjanitor.io/approve-wave=ID.
	AnnotationApprove = "podjanitor.io/approve-wave"
	// AnnotationHeld is the held change's ID, AnnotationHeldPods its wave's
	// size, AnnotationHeldSource what changed; podjanitor writes them.
	AnnotationHeld       = "podjanitor.io/held-wave"
	AnnotationHeldPods   = "podjanitor.io/held-wave-pods"
	AnnotationHeldSource = "podjanitor.io/held-wave-source"
	// AnnotationBaseline is the policy the leader acts on (its rules as
	// JSON), held or not: the next leader's start is measured against it,
	// and podjanitor plan tells held pods from others by it.
	// AnnotationBaselineHash is its SHA-256 (hex), recorded even when the
	// policy is too large to record.
	AnnotationBaseline     = "podjanitor.io/policy"
	AnnotationBaselineHash = "podjanitor.io/policy-sha256"
)

// maxBaseline is the largest baseline written to the Lease; the API server
// stores 256 KiB of annotations per object.
const maxBaseline = 128 << 10

// Record is where holds and approvals of the cluster's policy live: the
// annotations of podjanitor's Lease (--leader-elect-resource-name) in its own
// namespace. A namespace owner cannot write there, so cannot approve a
// change of the cluster's rules; an approval there survives restarts and a
// new leader.
type Record struct {
	Client          coordinationclient.LeasesGetter
	Namespace, Name string
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
	l, err := r.Read(ctx)
	if err != nil || l == nil {
		return "", err
	}
	return l.Annotations[AnnotationApprove], nil
}

// Publish writes the held change (nil: none) and the baseline's JSON (nil:
// none acted on yet) on the Lease, creating it if it does not exist (leader
// election off), and takes off an approval of used (a change carried out,
// reverted or held no more: an approval covers one occurrence of a change).
func (r Record) Publish(ctx context.Context, h *Hold, baseline []byte, used ...string) error {
	if err := r.update(ctx, func(l *coordinationv1.Lease) bool { return setHeld(l, h, baseline, used) }); err != nil {
		return fmt.Errorf("recording the held wave on lease %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}

// update applies set to the Lease, retrying conflicts, and writes it when
// set reports a change; a Lease not there is created, unless set changes
// nothing on an empty one.
func (r Record) update(ctx context.Context, set func(*coordinationv1.Lease) (changed bool)) error {
	leases := r.Client.Leases(r.Namespace)
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
func setHeld(l *coordinationv1.Lease, h *Hold, baseline []byte, used []string) bool {
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
	if baseline != nil {
		want[AnnotationBaselineHash] = BaselineHash(baseline)
		if len(baseline) <= maxBaseline {
			want[AnnotationBaseline] = string(baseline)
		}
	}
	return setAnnotations(l, want, AnnotationHeld, AnnotationHeldPods, AnnotationHeldSource, AnnotationBaseline, AnnotationBaselineHash) || changed
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

// Read reads the Lease: nil when it is not there.
func (r Record) Read(ctx context.Context) (*coordinationv1.Lease, error) {
	l, err := r.Client.Leases(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading lease %s/%s: %w", r.Namespace, r.Name, err)
	}
	return l, nil
}

// BaselineOn is the policy the last leader acted on, as the Lease l (nil:
// none) records it: its hash ("" for none recorded: a first install, or no
// Lease) and its JSON (nil when it was too large to record, or does not
// match the hash).
func BaselineOn(l *coordinationv1.Lease) (hash string, policy []byte) {
	if l == nil {
		return "", nil
	}
	hash = l.Annotations[AnnotationBaselineHash]
	if b, ok := l.Annotations[AnnotationBaseline]; ok && hash != "" && BaselineHash([]byte(b)) == hash {
		policy = []byte(b)
	}
	return hash, policy
}

// Held reads the hold the Lease records: the change's ID ("" for none or no
// Lease), its wave's size, and the baseline's JSON.
func (r Record) Held(ctx context.Context) (id string, pods int, baseline []byte, err error) {
	l, err := r.Read(ctx)
	if err != nil {
		return "", 0, nil, err
	}
	id, pods, baseline = HeldOn(l)
	return id, pods, baseline, nil
}

// HeldOn reads the hold a Lease (nil: none) records: the change's ID ("" for
// none), its wave's size, and the baseline's JSON (nil when it was too large
// to record).
func HeldOn(l *coordinationv1.Lease) (id string, pods int, baseline []byte) {
	if l == nil {
		return "", 0, nil
	}
	id = l.Annotations[AnnotationHeld]
	pods, _ = strconv.Atoi(l.Annotations[AnnotationHeldPods])
	if b, ok := l.Annotations[AnnotationBaseline]; ok {
		baseline = []byte(b)
	}
	return id, pods, baseline
}

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
	var publishedBaseline string
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
		baseline := g.BaselinePolicy()
		var baselineHash string
		if baseline != nil {
			baselineHash = BaselineHash(baseline)
		}
		if !sameHold(want, published) || baselineHash != publishedBaseline || len(used) > 0 {
			if err := r.Publish(ctx, want, baseline, used...); err != nil {
				logger.Error(err, "Cannot record the held wave and the policy acted on")
			} else {
				if want != nil && !sameHold(want, published) {
					held(h)
				}
				published, publishedBaseline, used = want, baselineHash, nil
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
