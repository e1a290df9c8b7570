//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A pod that expires at 9999-12-31 (a common "never" placeholder) must not
// hold up anyone: it was parked with a wake-up time in Unix nanoseconds, which
// wrapped past 2262 to before 1970, so it sat at the top of the parking heap
// and every pod parked after it waited behind it for ever. The short ones go
// at their deadlines, the far one stays.
func TestFarFutureDeadlineDoesNotStallOtherPods(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	d := startDaemon(t, "--namespace", ns)

	far := createPod(t, ns, "far-future", annotate(prefix+"expires-at", "9999-12-31"))
	centuries := createPod(t, ns, "ttl-centuries", ttl(290*365*24*time.Hour)) // ~ the largest ttl
	// Both parked before the short ones arrive.
	d.waitLog(fmt.Sprintf(`"Pod is not due yet" pod="%s/%s"`, ns, far.Name), 30*time.Second)
	d.waitLog(fmt.Sprintf(`"Pod is not due yet" pod="%s/%s"`, ns, centuries.Name), 30*time.Second)

	type short struct {
		pod   *corev1.Pod
		after time.Duration
	}
	var shorts []short
	for i := range 5 {
		after := time.Duration(6+2*i) * time.Second
		shorts = append(shorts, short{createPod(t, ns, fmt.Sprintf("short-%d", i), ttl(after)), after})
	}
	for _, s := range shorts {
		r.checkOnTime(t, s.pod, created(s.pod).Add(s.after))
	}
	r.checkNotRemoved(t, far)
	r.checkNotRemoved(t, centuries)
}
