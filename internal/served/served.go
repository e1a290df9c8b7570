// Package served waits for the API server to serve a resource it may not
// serve yet: a CustomResourceDefinition installed after podjanitor started
// (a `helm upgrade` from a chart without it, a `kubectl apply` later). The
// caller probes with one cheap request (a list of one item); Await sorts its
// answers and asks again on a clock, at a fixed interval, until the resource
// is served.
package served

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
)

// Absent says whether a probe's error means that the API server does not
// serve the resource (404: no such resource, its CRD not installed or not
// established yet). Any other error says nothing either way.
func Absent(err error) bool {
	return apierrors.IsNotFound(err)
}

// Await probes every interval on clk, the first time one interval from now,
// until a probe succeeds (true) or ctx ends (false). A probe that fails
// otherwise than Absent is passed to failed (for a log line) and the probing
// goes on: a 403 or an outage may end too.
func Await(ctx context.Context, clk clock.WithTicker, interval time.Duration, probe func(context.Context) error, failed func(error)) bool {
	ticker := clk.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-ticker.C():
		}
		err := probe(ctx)
		switch {
		case err == nil:
			return true
		case ctx.Err() != nil:
			return false
		case !Absent(err):
			failed(err)
		}
	}
}
