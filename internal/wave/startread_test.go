package wave

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestReadAtStart: failures that may pass are tried again until the read
// answers, or for within, each call within a quarter of it; one another try
// cannot mend ends the tries at once.
func TestReadAtStart(t *testing.T) {
	unavailable := apierrors.NewInternalError(errors.New("etcd leader changed"))
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "leases"}, "podjanitor", nil)
	mendable := func(err error) bool { return !apierrors.IsForbidden(err) }
	for _, tc := range []struct {
		name      string
		within    time.Duration
		failures  int
		err       error
		wantCalls int
		wantErr   error
	}{
		{"answers at once", time.Second, 0, nil, 1, nil},
		{"6 failures then an answer", 5 * time.Second, 6, unavailable, 7, nil},
		{"failing throughout", 400 * time.Millisecond, 1 << 30, unavailable, -1, unavailable},
		{"forbidden", time.Second, 1 << 30, forbidden, 1, forbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			within := tc.within
			calls := 0
			start := time.Now()
			err := ReadAtStart(context.Background(), within, mendable, func(ctx context.Context) error {
				calls++
				if d, ok := ctx.Deadline(); !ok || time.Until(d) > within/4 {
					t.Errorf("call %d may take %v, want at most %v", calls, time.Until(d), within/4)
				}
				if calls <= tc.failures {
					return tc.err
				}
				return nil
			})
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("ReadAtStart = %v, want %v", err, tc.wantErr)
			}
			if tc.wantCalls >= 0 && calls != tc.wantCalls {
				t.Errorf("%d calls, want %d", calls, tc.wantCalls)
			}
			if tc.wantCalls < 0 && (calls < 3 || time.Since(start) < within) {
				t.Errorf("gave up after %d calls in %v, want tries for %v", calls, time.Since(start), within)
			}
		})
	}
}
