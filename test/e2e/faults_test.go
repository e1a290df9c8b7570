//go:build e2e

package e2e

// Helpers of the fault tests (fault_*_test.go): control of the local
// cluster's processes, a watcher that survives API server restarts, bulk pod
// creation, metrics and event counts.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// clusterDir is the local cluster's state directory (hack/local-cluster.sh's
// CLUSTER_DIR); hack/e2e.sh sets it. The process faults need it.
var clusterDir = os.Getenv("E2E_CLUSTER_DIR")

func needLocalCluster(t *testing.T) {
	t.Helper()
	if clusterDir == "" {
		t.Skip("needs the local cluster's processes: set E2E_CLUSTER_DIR (hack/e2e.sh does)")
	}
}

// localCluster runs hack/local-cluster.sh with args against the e2e cluster.
func localCluster(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("../../hack/local-cluster.sh", args...)
	cmd.Env = append(os.Environ(), "CLUSTER_DIR="+clusterDir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/local-cluster.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// outages are the times kube-apiserver was down, from the moment it was told
// to stop (it takes no new request after that) to the moment it was started
// again: nothing can be removed in between.
var outages struct {
	sync.Mutex
	list [][2]time.Time // the end is zero while it is down
}

// afterOutage returns t, or the end of the outage t falls in.
func afterOutage(t time.Time) time.Time {
	outages.Lock()
	defer outages.Unlock()
	for _, o := range outages.list {
		if !t.Before(o[0]) && (o[1].IsZero() || t.Before(o[1])) {
			return o[1]
		}
	}
	return t
}

// stopAPIServer stops kube-apiserver and returns when it has exited. The
// cleanup starts it again (with its usual flags) if the test did not.
func stopAPIServer(t *testing.T) time.Time {
	t.Helper()
	outages.Lock()
	outages.list = append(outages.list, [2]time.Time{time.Now()})
	outages.Unlock()
	localCluster(t, "stop-apiserver")
	stopped := time.Now()
	t.Cleanup(func() {
		if !apiServerRunning() {
			startAPIServer(t)
		}
	})
	return stopped
}

// startAPIServer starts kube-apiserver again, with its usual flags plus
// flags, and returns when it is ready.
func startAPIServer(t *testing.T, flags ...string) time.Time {
	t.Helper()
	outages.Lock()
	if n := len(outages.list); n > 0 && outages.list[n-1][1].IsZero() {
		outages.list[n-1][1] = time.Now()
	}
	outages.Unlock()
	localCluster(t, append([]string{"start-apiserver"}, flags...)...)
	return time.Now()
}

// restartAPIServer stops kube-apiserver and starts it again with flags (none:
// its usual ones).
func restartAPIServer(t *testing.T, flags ...string) {
	t.Helper()
	stopAPIServer(t)
	startAPIServer(t, flags...)
}

func apiServerRunning() bool {
	b, err := os.ReadFile(filepath.Join(clusterDir, "pids", "kube-apiserver.pid"))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return err == nil && exec.Command("kill", "-0", strconv.Itoa(pid)).Run() == nil
}

// ------------------------------------------------------------------ watcher

// count is how many pods were seen removed.
func (r *removals) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.at)
}

// durableWatch records pod removals in a namespace as watchRemovals does, and
// keeps recording them across API server restarts: it watches again from the
// last resourceVersion, and lists again when that has expired. A removal it
// only learns from such a list happened after it lost sight of the namespace
// (blind) and before the list.
type durableWatch struct {
	*removals
	blind   map[types.UID]time.Time // guarded by removals.mu
	present map[types.UID]bool
	relists atomic.Int32
}

func watchRemovalsDurably(t *testing.T, ns string) *durableWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &durableWatch{
		removals: &removals{at: map[types.UID]time.Time{}, history: map[types.UID][]*corev1.Pod{}},
		blind:    map[types.UID]time.Time{}, present: map[types.UID]bool{},
	}
	watchersMu.Lock()
	watchers[ns] = w.removals
	watchersMu.Unlock()
	rv, err := w.list(ctx, ns, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	go w.run(ctx, ns, rv)
	return w
}

func (w *durableWatch) run(ctx context.Context, ns, rv string) {
	var lost time.Time
	for ctx.Err() == nil {
		if rv == "" {
			var err error
			if rv, err = w.list(ctx, ns, lost); err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			w.relists.Add(1)
		}
		wi, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				rv = ""
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for ev := range wi.ResultChan() {
			if ev.Type == watch.Error {
				if err := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					rv = ""
				}
				break
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			rv = pod.ResourceVersion
			if ev.Type != watch.Bookmark {
				w.observe(pod, ev.Type == watch.Deleted, time.Now())
			}
		}
		wi.Stop()
		lost = time.Now()
	}
}

// list records the namespace's pods; a pod seen before and missing now was
// removed between since and now.
func (w *durableWatch) list(ctx context.Context, ns string, since time.Time) (string, error) {
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	now := time.Now()
	listed := map[types.UID]bool{}
	for i := range list.Items {
		listed[list.Items[i].UID] = true
		w.observe(&list.Items[i], false, now)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for uid := range w.present {
		if listed[uid] {
			continue
		}
		delete(w.present, uid)
		if _, seen := w.at[uid]; !seen {
			w.at[uid], w.blind[uid] = now, since
		}
	}
	return list.ResourceVersion, nil
}

func (w *durableWatch) observe(pod *corev1.Pod, deleted bool, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.history[pod.UID] = append(w.history[pod.UID], pod)
	if deleted {
		delete(w.present, pod.UID)
	} else {
		w.present[pod.UID] = true
	}
	if deleted || pod.DeletionTimestamp != nil {
		if _, seen := w.at[pod.UID]; !seen {
			w.at[pod.UID] = now
		}
	}
}

// removedBetween says when the pod was removed: between from and at (the
// same time when the watch saw it happen).
func (w *durableWatch) removedBetween(uid types.UID) (from, at time.Time, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok = w.at[uid]
	from = at
	if b, blind := w.blind[uid]; blind {
		from = afterOutage(b)
	}
	return from, at, ok
}

// checkRemovedInTime asserts that the pod was removed at or after its
// deadline and by the latest time, waiting until then.
func (w *durableWatch) checkRemovedInTime(t *testing.T, pod *corev1.Pod, deadline, latest time.Time) {
	t.Helper()
	for time.Now().Before(latest.Add(time.Second)) { // the watch may lag a little behind
		if _, ok := w.get(pod.UID); ok {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	from, at, ok := w.removedBetween(pod.UID)
	switch {
	case !ok:
		t.Errorf("pod %s/%s (deadline %s) was not removed by %s", pod.Namespace, pod.Name, stamp(deadline), stamp(latest))
	case from.Before(deadline):
		t.Errorf("pod %s/%s removed between %s and %s, before its deadline %s", pod.Namespace, pod.Name, stamp(from), stamp(at), stamp(deadline))
	case at.After(latest):
		t.Errorf("pod %s/%s removed at %s (%v after its deadline), want by %s", pod.Namespace, pod.Name, stamp(at), at.Sub(deadline).Round(time.Millisecond), stamp(latest))
	default:
		t.Logf("pod %s: deadline %s, removed %s (%v late)", pod.Name, stamp(deadline), stamp(at), at.Sub(deadline).Round(time.Millisecond))
	}
}

func stamp(t time.Time) string { return t.Format("15:04:05.000") }

// --------------------------------------------------------------------- pods

// inParallel runs fn(0) ... fn(n-1) on 32 goroutines, retrying each a few
// times, and fails the test with the first error that remains.
func inParallel(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				var err error
				for attempt := 0; attempt < 5; attempt++ {
					if err = fn(i); err == nil {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		t.Fatal(err)
	}
}

// createPods creates the n pods that mk returns, in parallel, and returns
// them as created, by index.
func createPods(t *testing.T, n int, mk func(i int) *corev1.Pod) []*corev1.Pod {
	t.Helper()
	out := make([]*corev1.Pod, n)
	start := time.Now()
	inParallel(t, n, func(i int) error {
		p := mk(i)
		if p.Spec.Containers == nil {
			p.Spec.Containers = []corev1.Container{{Name: "main", Image: "fake-image"}}
		}
		created, err := client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		if err == nil {
			out[i] = created
			return nil
		}
		out[i], err = client.CoreV1().Pods(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
		return err
	})
	el := time.Since(start)
	t.Logf("created %d pods in %v (%.0f/s)", n, el.Round(time.Millisecond), float64(n)/el.Seconds())
	return out
}

// pod returns a bare pod to create, unscheduled unless opts bind it.
func pod(ns, name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	for _, o := range append([]podOpt{unscheduled}, opts...) {
		o(p)
	}
	return p
}

// unscheduled names a scheduler that does not run, so that the cluster's
// kube-scheduler (with the real node) leaves the pod alone: it stays Pending
// and bound to no node, as the fault tests' bulk pods must be (a delete
// removes it at once). onNode still binds it.
func unscheduled(p *corev1.Pod) { p.Spec.SchedulerName = "podjanitor-e2e-unscheduled" }

func expiresAt(at time.Time) podOpt {
	return annotate(prefix+"expires-at", at.UTC().Format(time.RFC3339Nano))
}

func keep(p *corev1.Pod) { annotate(prefix+"keep", "true")(p) }

// ------------------------------------------------------------------ metrics

// scrape reads the daemon's /metrics; start it with
// "--metrics-bind-address", "127.0.0.1:0".
func (d *daemon) scrape(t *testing.T) promSeries {
	t.Helper()
	addr := d.endpoints()["metrics"]
	if addr == "" {
		t.Fatal("the daemon logged no metrics endpoint; start it with --metrics-bind-address 127.0.0.1:0")
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping %s: %v", addr, err)
	}
	defer resp.Body.Close()
	m := promSeries{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		k := strings.LastIndexByte(line, ' ')
		if line == "" || line[0] == '#' || k < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[k+1:], 64); err == nil {
			m[line[:k]] = v
		}
	}
	return m
}

// promSeries maps each series of a scrape (name and labels as exposed) to its value.
type promSeries map[string]float64

// sum adds the series of name whose labels contain every filter (`method="DELETE"`).
func (m promSeries) sum(name string, filters ...string) float64 {
	var total float64
	for k, v := range m {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, f := range filters {
			ok = ok && strings.Contains(k, f)
		}
		if ok {
			total += v
		}
	}
	return total
}

// ------------------------------------------------------------------- events

// removalReason is the reason of the events that report removals: on the pod,
// or, above podjanitor's event budget, in a summary on the pod's owner or
// namespace ("Deleted 120 pods at ...").
const removalReason = "LifetimeExpired"

var summaryNote = regexp.MustCompile(`^(?:Deleted|Evicted) (\d+) pods? `)

// eventsByPod counts the events with one of reasons on the pods of ns, by pod
// UID; an event series counts as its count.
func eventsByPod(t *testing.T, ns string, reasons ...string) map[types.UID]int {
	t.Helper()
	list, err := client.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[types.UID]int{}
	for _, e := range list.Items {
		for _, r := range reasons {
			if e.Reason != r {
				continue
			}
			n := max(1, int(e.DeprecatedCount))
			if e.Series != nil {
				n = int(e.Series.Count)
			}
			out[e.Regarding.UID] += n
		}
	}
	return out
}

// checkOneRemovalEventEach asserts that each removed pod has exactly one
// removal event and each kept pod none, waiting up to 15 s for the events,
// which are written after the removals.
func checkOneRemovalEventEach(t *testing.T, ns string, removed, kept []*corev1.Pod) {
	t.Helper()
	var got map[types.UID]int
	deadline := time.Now().Add(15 * time.Second)
	for {
		got = eventsByPod(t, ns, removalReason)
		missing := 0
		for _, p := range removed {
			if got[p.UID] == 0 {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	bad := 0
	for _, p := range removed {
		if n := got[p.UID]; n != 1 && bad < 20 {
			bad++
			t.Errorf("pod %s/%s has %d removal events, want exactly 1", p.Namespace, p.Name, n)
		}
	}
	for _, p := range kept {
		if n := got[p.UID]; n != 0 {
			t.Errorf("kept pod %s/%s has %d removal events, want none", p.Namespace, p.Name, n)
		}
	}
}

// checkRemovalsReportedOnce asserts that every removed pod is reported once,
// by an event of its own or counted in one summary, and no kept pod by an
// event of its own; it waits up to 30 s for the events (summaries are written
// every 10 s).
func checkRemovalsReportedOnce(t *testing.T, ns string, removed, kept []*corev1.Pod) {
	t.Helper()
	var own map[types.UID]int
	summarized := 0
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		list, err := client.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		own, summarized = map[types.UID]int{}, 0
		total := 0
		for _, e := range list.Items {
			if e.Reason != removalReason {
				continue
			}
			if e.Regarding.Kind == "Pod" {
				own[e.Regarding.UID]++
				total++
			} else if m := summaryNote.FindStringSubmatch(e.Note); m != nil {
				n, _ := strconv.Atoi(m[1])
				summarized += n
				total += n
			}
		}
		if total >= len(removed) || time.Now().After(deadline) {
			t.Logf("%d removals reported by their own event, %d in summaries", total-summarized, summarized)
			if total != len(removed) {
				t.Errorf("%d removals reported, want %d", total, len(removed))
			}
			break
		}
	}
	bad := 0
	for _, p := range removed {
		if n := own[p.UID]; n > 1 && bad < 20 {
			bad++
			t.Errorf("pod %s/%s has %d removal events of its own, want at most 1", p.Namespace, p.Name, n)
		}
	}
	for _, p := range kept {
		if n := own[p.UID]; n != 0 {
			t.Errorf("kept pod %s/%s has %d removal events, want none", p.Namespace, p.Name, n)
		}
	}
}

// ------------------------------------------------------------- supervision

// supervised runs podjanitor again whenever it exits, as a Deployment's
// kubelet would (after a second), until the test ends.
type supervised struct {
	mu      sync.Mutex
	runs    []*daemon
	stopped bool
	done    chan struct{}
}

func supervise(t *testing.T, args ...string) *supervised {
	t.Helper()
	s := &supervised{done: make(chan struct{})}
	t.Cleanup(func() {
		s.mu.Lock()
		s.stopped = true
		cur := s.runs[len(s.runs)-1]
		s.mu.Unlock()
		cur.kill()
		<-s.done
	})
	s.runs = append(s.runs, startDaemonWaiting(t, "", args...))
	go func() {
		defer close(s.done)
		for {
			s.mu.Lock()
			cur := s.runs[len(s.runs)-1]
			s.mu.Unlock()
			<-cur.exited
			time.Sleep(time.Second)
			s.mu.Lock()
			if s.stopped {
				s.mu.Unlock()
				return
			}
			s.runs = append(s.runs, startDaemonWaiting(t, "", args...))
			s.mu.Unlock()
		}
	}()
	return s
}

// first is the first run.
func (s *supervised) first() *daemon {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[0]
}

// starts is how many times podjanitor was started.
func (s *supervised) starts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

// log is the logs of every run, in order.
func (s *supervised) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, d := range s.runs {
		b.WriteString(d.log())
	}
	return b.String()
}
