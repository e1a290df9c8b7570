//go:build e2e

package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The fault tests that stop or restart kube-apiserver are not parallel: Go
// runs every test that is not parallel first, one at a time, so nothing else
// uses the cluster meanwhile.

// TestFaultAPIServerOutage stops kube-apiserver for 60 s while pods come due.
// Two podjanitors watch a namespace each: one alone, one with --leader-elect
// (a lease it cannot renew ends the process, so a supervisor starts it again,
// as a Deployment would). Asserted, never before a pod's deadline: every pod
// the running podjanitor had cached and that came due during the outage is
// removed within 30 s of the API server's return (podjanitor's own retries
// back off 10 s at most). What needs the informer to list or watch again — a
// pod created just after the return, and everything for the process that was
// restarted during the outage — within 120 s: client-go's reflector retries
// its list and watch with a backoff that doubles from 0.8 s to 30 s with up to
// 100 % jitter, so it may take up to 60 s after the return to try again
// (shared informers do not let a program change that backoff). Kept, far and
// unwatched pods stay; one removal event per pod.
func TestFaultAPIServerOutage(t *testing.T) {
	needLocalCluster(t)
	const (
		outage   = 60 * time.Second
		recovery = 30 * time.Second  // cached due pods go within this of the API server's return
		relist   = 120 * time.Second // pods that need the informer to list or watch again
	)
	plainNS, electedNS, outsideNS := newNamespace(t), newNamespace(t), newNamespace(t)
	plain := startDaemon(t, "--namespace", plainNS)
	elected := supervise(t, "--namespace", electedNS, "--leader-elect", "--leader-elect-resource-namespace", electedNS)
	elected.first().waitLog("Started workers", 60*time.Second)

	type group struct {
		ns                string
		w                 *durableWatch
		logs              func() string
		due, later, stays []*corev1.Pod
	}
	groups := []*group{{ns: plainNS, logs: plain.log}, {ns: electedNS, logs: elected.log}}
	deadline := map[*corev1.Pod]time.Time{}
	with := func(p *corev1.Pod, at time.Time) *corev1.Pod { deadline[p] = at; return p }
	t0 := time.Now()
	firstDue := t0.Add(15 * time.Second)
	for _, g := range groups {
		g.w = watchRemovalsDurably(t, g.ns)
		for i := range 10 { // due every 4 s during the outage
			at := firstDue.Add(time.Duration(i) * 4 * time.Second)
			g.due = append(g.due, with(createPod(t, g.ns, fmt.Sprintf("due-%d", i), unscheduled, expiresAt(at)), at))
		}
		at := t0.Add(outage + 40*time.Second)
		g.later = append(g.later, with(createPod(t, g.ns, "due-after-outage", unscheduled, expiresAt(at)), at))
		g.stays = append(g.stays,
			createPod(t, g.ns, "kept", unscheduled, keep, expiresAt(firstDue)),
			createPod(t, g.ns, "far", unscheduled, expiresAt(t0.Add(time.Hour))))
	}
	outsideW := watchRemovalsDurably(t, outsideNS)
	outside := createPod(t, outsideNS, "unwatched", unscheduled, expiresAt(firstDue))
	for _, g := range groups {
		waitCached(t, g.logs, append(append(g.due, g.later...), g.stays...))
	}

	stopped := stopAPIServer(t)
	if !stopped.Before(firstDue) {
		t.Fatalf("kube-apiserver took until %s to stop; the first pod was due at %s", stamp(stopped), stamp(firstDue))
	}
	time.Sleep(time.Until(stopped.Add(outage)))
	restart := time.Now()
	ready := startAPIServer(t)
	t.Logf("kube-apiserver down from %s, started again at %s, ready at %s", stamp(stopped), stamp(restart), stamp(ready))
	for _, g := range groups {
		if last := deadline[g.due[len(g.due)-1]]; !last.Before(restart) {
			t.Fatalf("pod %s was due at %s, after the outage", g.due[len(g.due)-1].Name, stamp(last))
		}
	}
	for _, g := range groups {
		at := time.Now().Add(5 * time.Second)
		g.later = append(g.later, with(createPod(t, g.ns, "created-after-outage", unscheduled, expiresAt(at)), at))
	}

	for i, g := range groups {
		bound := ready.Add(recovery)
		if i == 1 { // restarted during the outage: its cache must be listed again
			bound = ready.Add(relist)
		}
		for _, p := range g.due {
			g.w.checkRemovedInTime(t, p, deadline[p], bound)
		}
	}
	for i, g := range groups {
		g.w.checkRemovedInTime(t, g.later[1], deadline[g.later[1]], ready.Add(relist))
		onTime := deadline[g.later[0]].Add(latenessOK)
		if i == 1 {
			onTime = later(onTime, ready.Add(relist))
		}
		g.w.checkRemovedInTime(t, g.later[0], deadline[g.later[0]], onTime)
	}
	for _, g := range groups {
		for _, p := range g.stays {
			g.w.checkNotRemoved(t, p)
		}
		checkOneRemovalEventEach(t, g.ns, append(g.due, g.later...), g.stays)
	}
	outsideW.checkNotRemoved(t, outside)
	t.Logf("the --leader-elect podjanitor was started %d time(s)", elected.starts())
}

// waitCached waits until podjanitor's log names every pod: it has them in
// its cache and has decided them.
func waitCached(t *testing.T, logs func() string, pods []*corev1.Pod) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range pods {
		key := fmt.Sprintf(`pod="%s/%s"`, p.Namespace, p.Name)
		for !strings.Contains(logs(), key) {
			if time.Now().After(deadline) {
				t.Fatalf("podjanitor never logged a decision on %s/%s", p.Namespace, p.Name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestFaultWatchExpiry pauses podjanitor's watch at the proxy while pods are
// deleted and created again under the same names, compacts etcd, then cuts
// the watch (a clean end, as at a watch's timeout). kube-apiserver runs with
// --watch-cache=false for the test, so that its watches read etcd:
// podjanitor's watch, resumed from a compacted resourceVersion, expires (410)
// and podjanitor lists again. Until then its
// cache is stale: the old pods come due, and removing them must fail on the
// UID precondition instead of removing their namesakes. Asserted: the kept
// and not-yet-due namesakes stay; the due namesake and a new due pod go
// within 15 s of the cut, not before their deadlines; a pod that did not
// change goes on time while the watch is paused; one removal event each.
func TestFaultWatchExpiry(t *testing.T) {
	needLocalCluster(t)
	const afterCut = 15 * time.Second
	restartAPIServer(t, "--watch-cache=false")
	t.Cleanup(func() { restartAPIServer(t) })

	ns := newNamespace(t)
	w := watchRemovalsDurably(t, ns)
	proxy := newFaultProxy(t)
	d := startDaemon(t, "--namespace", ns, "--kubeconfig", proxy.kubeconfig(t))

	t0 := time.Now()
	oldDue := t0.Add(12 * time.Second)
	names := []string{"namesake-kept", "namesake-later", "namesake-due", "deleted"}
	var old []*corev1.Pod
	for _, n := range names {
		old = append(old, createPod(t, ns, n, unscheduled, expiresAt(oldDue)))
	}
	unchanged := createPod(t, ns, "unchanged", unscheduled, expiresAt(t0.Add(20*time.Second)))
	waitCached(t, d.log, append(old, unchanged))

	proxy.pauseWatches()
	for _, p := range old {
		if err := client.CoreV1().Pods(ns).Delete(ctxFor(t), p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range old {
		waitGone(t, p)
	}
	newDue := t0.Add(16 * time.Second)
	kept := createPod(t, ns, "namesake-kept", unscheduled, keep, expiresAt(oldDue))
	later := createPod(t, ns, "namesake-later", unscheduled, expiresAt(t0.Add(time.Hour)))
	due := createPod(t, ns, "namesake-due", unscheduled, expiresAt(newDue))
	fresh := createPod(t, ns, "fresh-due", unscheduled, expiresAt(newDue))
	compacted := compactEtcd(t)
	t.Logf("etcd compacted at revision %d", compacted)

	// The old pods come due in podjanitor's stale cache; the unchanged one goes.
	w.checkRemovedInTime(t, unchanged, t0.Add(20*time.Second), t0.Add(20*time.Second+latenessOK))
	time.Sleep(time.Until(t0.Add(24 * time.Second)))
	for _, p := range old[:3] {
		if !answered(proxy.served(ns), "DELETE", p.Name, http.StatusConflict) {
			t.Errorf("podjanitor never tried to remove the old %s from its stale cache (or got no 409): the test did not test the race", p.Name)
		}
	}

	cut := time.Now()
	proxy.endWatches()
	w.checkRemovedInTime(t, due, newDue, cut.Add(afterCut))
	w.checkRemovedInTime(t, fresh, newDue, cut.Add(afterCut))
	var after []string
	relisted := false
	for _, r := range proxy.served(ns) {
		if r.Method == http.MethodGet && r.Pod == "" && r.At.After(cut) {
			after = append(after, fmt.Sprintf("%d %s", r.Status, r.Query.Encode()))
			relisted = relisted || (r.isList() && r.Status == http.StatusOK)
		}
	}
	t.Logf("podjanitor's requests for the pods after the watch ended: %q", after)
	if !relisted {
		t.Error("podjanitor did not list the pods again after its watch expired")
	}
	time.Sleep(time.Until(cut.Add(afterCut)))
	for _, p := range []*corev1.Pod{kept, later} {
		w.checkNotRemoved(t, p)
	}
	checkOneRemovalEventEach(t, ns, []*corev1.Pod{unchanged, due, fresh}, []*corev1.Pod{kept, later})
}

// answered says whether the proxy answered a method on the pod with the status.
func answered(reqs []proxiedRequest, method, pod string, status int) bool {
	for _, r := range reqs {
		if r.Method == method && r.Pod == pod && r.Status == status {
			return true
		}
	}
	return false
}

// compactEtcd compacts etcd's history up to its current revision, through
// etcd's JSON gateway, and returns that revision.
func compactEtcd(t *testing.T) int64 {
	t.Helper()
	env, err := os.ReadFile(filepath.Join(clusterDir, "cluster.env"))
	if err != nil {
		t.Fatal(err)
	}
	port := ""
	for _, line := range strings.Split(string(env), "\n") {
		if v, ok := strings.CutPrefix(line, "ETCD_PORT="); ok {
			port = strings.TrimSpace(v)
		}
	}
	if port == "" {
		t.Fatalf("no ETCD_PORT in %s/cluster.env", clusterDir)
	}
	call := func(path string, req any, resp any) {
		t.Helper()
		body, _ := json.Marshal(req)
		r, err := http.Post("http://127.0.0.1:"+port+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("etcd %s: %v", path, err)
		}
		defer r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Fatalf("etcd %s: HTTP %d", path, r.StatusCode)
		}
		if err := json.NewDecoder(r.Body).Decode(resp); err != nil {
			t.Fatalf("etcd %s: %v", path, err)
		}
	}
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	call("/v3/kv/range", map[string]any{"key": base64.StdEncoding.EncodeToString([]byte("/registry/"))}, &rng)
	rev, err := strconv.ParseInt(rng.Header.Revision, 10, 64)
	if err != nil {
		t.Fatalf("etcd revision %q: %v", rng.Header.Revision, err)
	}
	call("/v3/kv/compaction", map[string]any{"revision": rev, "physical": true}, &struct{}{})
	return rev
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
