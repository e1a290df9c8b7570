package wave

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// DefaultStartReadFor is Options.StartReadFor's default: the default of
// --leader-elect-renew-deadline.
const DefaultStartReadFor = 10 * time.Second

// ReadAtStart calls read until it succeeds, fails with an error another try
// cannot mend (mendable false), or has failed for within (0:
// DefaultStartReadFor) or ctx ends: a hiccup of the API server as a leader
// starts (an etcd leader change, an API server restarting) is waited out
// for as long as the leader's renewals of its Lease would be, before the
// start fails. Each call may take a quarter of within; the tries back off
// from 10 ms to 1 s. It returns the last call's error.
func ReadAtStart(ctx context.Context, within time.Duration, mendable func(error) bool, read func(context.Context) error) error {
	if within <= 0 {
		within = DefaultStartReadFor
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	backoff := wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: time.Second}
	for {
		callCtx, cancelCall := context.WithTimeout(ctx, within/4)
		err := read(callCtx)
		cancelCall()
		if err == nil || !mendable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff.Step()):
		}
	}
}
