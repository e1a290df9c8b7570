package tenant

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Freshness is how old a read of a tenant policy may be for the last check
// before a removal it decided (Reader).
const Freshness = time.Second

// Identity is a policy as read from the API server: which object, which
// generation of its rules, and whether it is being deleted. A zero UID:
// not found.
type Identity struct {
	UID        types.UID
	Generation int64
	Deleting   bool
}

// Reader reads tenant policies from the API server for the last check
// before a removal. One read of a policy is shared by every removal that
// begins while it is in flight or within Freshness of its start, failures
// included, so a drain of a policy's pods costs at most one GET a second per
// policy, however many workers, and a failing API server is not asked once
// per pod. Each GET is bounded by the reader's timeout.
type Reader struct {
	get   func(ctx context.Context, namespace, name string) (Identity, error)
	clock clock.PassiveClock

	mu    sync.Mutex
	reads map[string]*read
}

// read is one read of a policy, shared by those who wait on done.
type read struct {
	sent time.Time
	done chan struct{}
	id   Identity
	err  error
}

// NewReader reads with get (a 404 is Identity{}, not an error), each call
// bounded by timeout.
func NewReader(clk clock.PassiveClock, timeout time.Duration, get func(ctx context.Context, namespace, name string) (Identity, error)) *Reader {
	return &Reader{clock: clk, reads: map[string]*read{},
		get: func(ctx context.Context, namespace, name string) (Identity, error) {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return get(ctx, namespace, name)
		}}
}

// Read returns the policy of namespace and name as read at most Freshness ago.
func (r *Reader) Read(ctx context.Context, namespace, name string) (Identity, error) {
	key := namespace + "/" + name
	r.mu.Lock()
	now := r.clock.Now()
	rd := r.reads[key]
	if rd != nil && now.Sub(rd.sent) < Freshness && !now.Before(rd.sent) {
		r.mu.Unlock()
		select {
		case <-rd.done:
			return rd.id, rd.err
		case <-ctx.Done():
			return Identity{}, ctx.Err()
		}
	}
	for k, old := range r.reads { // of policies gone too
		if now.Sub(old.sent) >= Freshness {
			delete(r.reads, k)
		}
	}
	rd = &read{sent: now, done: make(chan struct{})}
	r.reads[key] = rd
	r.mu.Unlock()
	rd.id, rd.err = r.get(ctx, namespace, name)
	close(rd.done)
	return rd.id, rd.err
}

// Forget drops the last read of a policy: it changed or is gone, and the
// next removal reads it again. A read in flight is still shared by those
// waiting on it.
func (r *Reader) Forget(namespace, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.reads, namespace+"/"+name)
}
