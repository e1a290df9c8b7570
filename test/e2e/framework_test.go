//go:build e2e

// Package e2e drives the real podjanitor binary against a real API server (the
// local cluster of hack/local-cluster.sh, or any cluster with a kwok node).
// Run through `make test` or hack/e2e.sh, which set E2E_KUBECONFIG and
// PODJANITOR_BIN.
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podjanitor/podjanitor/test/framework"
)

const (
	nodeName   = "kwok-node-0"
	fateLabel  = "e2e.podjanitor.io/fate"
	fateAfter  = "e2e.podjanitor.io/fate-after"
	prefix     = "podjanitor.io/"
	latenessOK = 5 * time.Second // generous bound for "removed promptly"
)

var (
	kubeconfig string
	binary     string
	client     kubernetes.Interface
)

func TestMain(m *testing.M) {
	kubeconfig, binary = os.Getenv("E2E_KUBECONFIG"), os.Getenv("PODJANITOR_BIN")
	if kubeconfig == "" || binary == "" {
		fmt.Fprintln(os.Stderr, "e2e: set E2E_KUBECONFIG and PODJANITOR_BIN (make test does)")
		os.Exit(1)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	cfg.QPS, cfg.Burst = 200, 400
	client = kubernetes.NewForConfigOrDie(cfg)
	os.Exit(m.Run())
}

func ctxFor(t *testing.T) context.Context { return framework.Ctx(t, 5*time.Minute) }

// newNamespace creates a namespace for one test and waits for its default
// ServiceAccount, which pod admission needs.
func newNamespace(t *testing.T) string {
	t.Helper()
	return framework.NewNamespace(t, client, "e2e")
}

// podOpt shapes a test pod.
type podOpt func(*corev1.Pod)

func annotate(kv ...string) podOpt {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Annotations[kv[i]] = kv[i+1]
		}
	}
}

func label(kv ...string) podOpt {
	return func(p *corev1.Pod) {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Labels[kv[i]] = kv[i+1]
		}
	}
}

// onNode binds the pod to the kwok node, so kwok runs it (and plays its fate).
func onNode(p *corev1.Pod) { p.Spec.NodeName = nodeName }

// fate makes kwok finish the pod ("complete", "fail", "evict", "crashloop") after a delay.
func fate(f string, after time.Duration) podOpt {
	return func(p *corev1.Pod) {
		onNode(p)
		label(fateLabel, f)(p)
		annotate(fateAfter, after.String())(p)
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
	}
}

func createPod(t *testing.T, ns, name string, opts ...podOpt) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "fake-image"}}},
	}
	for _, o := range opts {
		o(pod)
	}
	created, err := client.CoreV1().Pods(ns).Create(ctxFor(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", ns, name, err)
	}
	return created
}

// removals records, per pod UID, when the pod was first seen being removed
// (a deletionTimestamp or a DELETED event), and every version of it seen. Its
// checks are test/framework's, shared with test/kind.
type removals struct {
	mu      sync.Mutex
	at      map[types.UID]time.Time
	history map[types.UID][]*corev1.Pod
}

// watchers holds the running watches by namespace, for waitPod.
var (
	watchersMu sync.Mutex
	watchers   = map[string]*removals{}
)

// watchRemovals starts watching the namespace; start it before the pods exist.
func watchRemovals(t *testing.T, ns string) *removals {
	t.Helper()
	r := &removals{at: map[types.UID]time.Time{}, history: map[types.UID][]*corev1.Pod{}}
	watchersMu.Lock()
	watchers[ns] = r
	watchersMu.Unlock()
	framework.WatchPods(t, client, ns, func(ev watch.EventType, pod *corev1.Pod, now time.Time) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.history[pod.UID] = append(r.history[pod.UID], pod)
		if _, seen := r.at[pod.UID]; !seen && framework.Removal(ev, pod) {
			r.at[pod.UID] = now
		}
	})
	return r
}

func (r *removals) get(uid types.UID) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[uid]
	return at, ok
}

// waitRemoved waits until the pod is removed and returns when that was seen.
func (r *removals) waitRemoved(t *testing.T, pod *corev1.Pod, timeout time.Duration) time.Time {
	t.Helper()
	return framework.WaitRemoved(t, r.get, pod, timeout)
}

// checkOnTime asserts the pod was removed at or after its deadline and promptly.
func (r *removals) checkOnTime(t *testing.T, pod *corev1.Pod, deadline time.Time) {
	t.Helper()
	framework.CheckRemoved(t, r.get, pod, deadline, latenessOK)
}

// checkNotRemoved asserts the pod is still there and was never marked for removal.
func (r *removals) checkNotRemoved(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	framework.CheckNotRemoved(t, client, r.get, pod)
}

// seen returns the first version of the pod that the namespace's watch saw
// satisfying cond, even when the pod has been removed since.
func seen(pod *corev1.Pod, cond func(*corev1.Pod) bool) *corev1.Pod {
	watchersMu.Lock()
	r := watchers[pod.Namespace]
	watchersMu.Unlock()
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.history[pod.UID] {
		if cond(p) {
			return p
		}
	}
	return nil
}

// waitPod waits until a version of the pod satisfies cond and returns it.
func waitPod(t *testing.T, pod *corev1.Pod, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	return framework.WaitPod(t, client, seen, pod, what, 30*time.Second, cond)
}

// waitEvent waits for an event with reason on the pod and returns it.
func waitEvent(t *testing.T, pod *corev1.Pod, reason string, timeout time.Duration) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	err := wait.PollUntilContextTimeout(ctxFor(t), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.Regarding.Name == pod.Name && e.Regarding.UID == pod.UID {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event on pod %s/%s within %v", reason, pod.Namespace, pod.Name, timeout)
	}
	return found
}

// countEvents counts events with reason on the pod.
func countEvents(t *testing.T, pod *corev1.Pod, reason string) int {
	t.Helper()
	list, err := client.EventsV1().Events(pod.Namespace).List(ctxFor(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.Reason == reason && e.Regarding.Name == pod.Name {
			n += max(1, int(e.DeprecatedCount))
			if e.Series != nil {
				n += int(e.Series.Count) - 1
			}
		}
	}
	return n
}

// daemon is a podjanitor process.
type daemon struct {
	t       *testing.T
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	err     error
}

// startDaemon runs podjanitor with args and waits until its workers run (or,
// with waitFor, until its log shows that line).
func startDaemon(t *testing.T, args ...string) *daemon {
	t.Helper()
	return startDaemonWaiting(t, "Started workers", args...)
}

func startDaemonWaiting(t *testing.T, waitFor string, args ...string) *daemon {
	t.Helper()
	return startDaemonEnv(t, nil, waitFor, args...)
}

// startDaemonEnv is startDaemonWaiting with extra environment variables (NAME=value).
func startDaemonEnv(t *testing.T, env []string, waitFor string, args ...string) *daemon {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), fmt.Sprintf("podjanitor-%d.log", time.Now().UnixNano()))
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	all := append([]string{"--kubeconfig", kubeconfig, "--metrics-bind-address=0", "--health-probe-bind-address=0", "-v=4"}, ownLease(args, env)...)
	cmd := exec.Command(binary, all...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		logFile.Close()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.kill()
		if t.Failed() {
			d.dumpLog()
		}
	})
	if waitFor != "" {
		d.waitLog(waitFor, 60*time.Second)
	}
	return d
}

// ownLease gives a daemon watching one namespace (--namespace) its Lease
// there unless args name one or env sets POD_NAMESPACE (a daemon run as an
// installation runs, whose Lease is in its own namespace): the Lease records
// the policy the daemon acts on (--hold-waves), and the tests' daemons, each
// with its own policy, must not measure their starts against each other's in
// kube-system.
func ownLease(args, env []string) []string {
	for _, e := range env {
		if strings.HasPrefix(e, "POD_NAMESPACE=") {
			return args
		}
	}
	namespace := ""
	for i, a := range args {
		if strings.HasPrefix(a, "--leader-elect-resource-namespace") {
			return args
		}
		if a == "--namespace" && i+1 < len(args) {
			namespace = args[i+1]
		} else if v, ok := strings.CutPrefix(a, "--namespace="); ok {
			namespace = v
		}
	}
	if namespace == "" {
		return args
	}
	return append(slices.Clone(args), "--leader-elect-resource-namespace", namespace)
}

// waitLog waits for a line containing s in the daemon's log.
func (d *daemon) waitLog(s string, timeout time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if d.logContains(s) {
			return
		}
		select {
		case <-d.exited:
			d.dumpLog()
			d.t.Fatalf("podjanitor exited (%v) before logging %q", d.err, s)
		case <-time.After(50 * time.Millisecond):
		}
	}
	d.dumpLog()
	d.t.Fatalf("podjanitor did not log %q within %v", s, timeout)
}

func (d *daemon) logContains(s string) bool { return strings.Contains(d.log(), s) }

func (d *daemon) log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

func (d *daemon) dumpLog() {
	f, err := os.Open(d.logPath)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	d.t.Logf("podjanitor log (%s, last %d lines):\n%s", d.logPath, len(lines), strings.Join(lines, "\n"))
}

// kill SIGKILLs the daemon and waits for it.
func (d *daemon) kill() {
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
}

// stop sends SIGTERM and returns the exit code.
func (d *daemon) stop(timeout time.Duration) int {
	d.t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(timeout):
		d.t.Errorf("podjanitor did not exit within %v of SIGTERM", timeout)
		d.kill()
	}
	return d.cmd.ProcessState.ExitCode()
}

func ttl(d time.Duration) podOpt { return annotate(prefix+"ttl", d.String()) }

// created returns the server's creation time of the pod.
func created(p *corev1.Pod) time.Time { return p.CreationTimestamp.Time }

func condition(p *corev1.Pod, typ corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == typ {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
