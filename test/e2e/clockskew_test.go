//go:build e2e

package e2e

import (
	"testing"
	"time"
)

// Deadlines hold in the API server's time, whatever podjanitor's clock says:
// with its clock 45 s ahead nothing goes early, with it 45 s behind nothing
// goes late. (The test and the API server share this machine's real clock;
// podjanitor reads a clock shifted by PODJANITOR_TESTING_CLOCK_OFFSET.)
func TestDeadlinesHoldInTheAPIServersTime(t *testing.T) {
	t.Parallel()
	for name, offset := range map[string]string{"ahead": "45s", "behind": "-45s"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ns := newNamespace(t)
			r := watchRemovals(t, ns)
			d := startDaemonEnv(t, []string{"PODJANITOR_TESTING_CLOCK_OFFSET=" + offset}, "Started workers", "--namespace", ns)
			d.waitLog("clock differs from the API server's", 30*time.Second)

			// Pods created now, due in 8 s and 12 s of the API server's time;
			// one due in an hour must stay.
			short := createPod(t, ns, "ttl-8s", ttl(8*time.Second))
			running := createPod(t, ns, "running-ttl-12s", onNode, ttl(12*time.Second))
			long := createPod(t, ns, "ttl-1h", ttl(time.Hour))
			r.checkOnTime(t, short, created(short).Add(8*time.Second))
			r.checkOnTime(t, running, created(running).Add(12*time.Second))
			r.checkNotRemoved(t, long)
		})
	}
}
