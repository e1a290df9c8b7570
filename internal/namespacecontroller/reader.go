package namespacecontroller

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/policy"
)

// Freshness is how old a read of a namespace may be for the last
// check before a removal (Reader).
const Freshness = time.Second

// Reader reads namespaces from the API server for the last check
// before a removal. The namespace cache is only as current as its watch,
// which may be failing (a 403 after an RBAC change, an API server refusing
// it, the reflector backing off) or slow without any error, which no error
// handler sees; a pod's own resourceVersion precondition does not cover its
// namespace's keep annotation. A read is shared by every removal of its
// namespace that begins within Freshness of it, failures included,
// so a drain costs at most one GET a second per namespace, not one per pod.
//
// A removal that finds its namespace's read more than half
// Freshness old goes by it and reads the namespace again
// meanwhile, for the removals after it (refresh): a namespace whose pods
// go one after another does not make one of them wait for a GET every
// second. A removal still starts at most one GET, so that one a second per
// namespace becomes at most two.
type Reader struct {
	get   func(ctx context.Context, name string) (*policy.Namespace, error)
	clock clock.PassiveClock

	mu    sync.Mutex
	reads map[string]*read
	// refreshes are the reads under way, or failed, behind a successful
	// read in reads; a failed one holds back the next for as long as a
	// refresh is not due.
	refreshes map[string]*read
}

// read is one read of a namespace, shared by those who wait on done.
type read struct {
	sent time.Time
	done chan struct{}
	ns   *policy.Namespace
	err  error
}

// succeeded reports whether the read is over and found the namespace.
func (rd *read) succeeded() bool {
	select {
	case <-rd.done:
		return rd.err == nil
	default:
		return false
	}
}

// NewReader reads namespaces with client, each GET bounded by timeout.
func NewReader(client kubernetes.Interface, clk clock.PassiveClock, timeout time.Duration) *Reader {
	return &Reader{clock: clk, reads: map[string]*read{}, refreshes: map[string]*read{},
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

// isFresh reports whether a read sent at sent may still be gone by at now.
func isFresh(sent, now time.Time) bool {
	return now.Sub(sent) < Freshness && !now.Before(sent)
}

// halfStale reports whether a read sent at sent is due a refresh at now:
// half Freshness old or more (or sent after now, by a clock that
// went back).
func halfStale(sent, now time.Time) bool {
	return now.Sub(sent) >= Freshness/2 || now.Before(sent)
}

// Read returns the namespace as read at most Freshness ago.
func (r *Reader) Read(ctx context.Context, name string) (*policy.Namespace, error) {
	r.mu.Lock()
	now := r.clock.Now()
	rd := r.reads[name]
	if rd == nil || !isFresh(rd.sent, now) {
		// A refresh under way (or failed) is newer than the read it was to
		// replace: shared as that read would be.
		if next := r.refreshes[name]; next != nil && isFresh(next.sent, now) {
			rd = next
		}
	}
	if rd != nil && isFresh(rd.sent, now) {
		if halfStale(rd.sent, now) && rd.succeeded() {
			if next := r.refreshes[name]; next == nil || halfStale(next.sent, now) {
				next = &read{sent: now, done: make(chan struct{})}
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
		if !isFresh(old.sent, now) {
			delete(r.reads, n)
		}
	}
	for n, old := range r.refreshes {
		if !isFresh(old.sent, now) {
			delete(r.refreshes, n)
		}
	}
	rd = &read{sent: now, done: make(chan struct{})}
	r.reads[name] = rd
	r.mu.Unlock()
	rd.ns, rd.err = r.get(ctx, name)
	close(rd.done)
	return rd.ns, rd.err
}

// refresh reads the namespace for the removals after the one that found
// its read half stale: a success takes the place of that read; a failure
// does not, and the read it was to replace stands until it is stale.
func (r *Reader) refresh(ctx context.Context, name string, next *read) {
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
