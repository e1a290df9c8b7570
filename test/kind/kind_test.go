//go:build kind

// Package kind tests podjanitor on a kind cluster (build tag kind; `make
// test-kind`, hack/kind/test.sh, creates the cluster and runs them): the
// shipped artifacts/deploy with the image of `make image-archive` loaded by
// `kind load image-archive`, on the node image of hack/kind/build.sh (or the
// stock one), and `make bench-kind` at a small size.
//
// The pods whose removal is checked are plain pods of the pause image that
// the kubelet of the kind node runs: real containers, scheduled by the
// cluster's scheduler, removed by the podjanitor of the Deployment.
package kind

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podjanitor/podjanitor/test/framework"
)

const (
	prefix = "podjanitor.io/"
	// pauseImage is in every kind node: it is the pod sandbox's image (the
	// offline image's name; the stock image has it too under its own tag,
	// KIND_PAUSE_IMAGE).
	defaultPauseImage = "registry.k8s.io/pause:3.10.2"
	// latenessOK is a generous bound for "removed promptly" on a busy machine.
	latenessOK = 10 * time.Second
)

var (
	root       string // the repository
	cluster    string // the kind cluster's name
	nodeName   string // its node (and the node's container)
	image      string // podjanitor's image as loaded
	pauseImage string
	client     kubernetes.Interface
)

func TestMain(m *testing.M) {
	cluster, image = os.Getenv("KIND_CLUSTER"), os.Getenv("KIND_IMAGE")
	kubeconfig := os.Getenv("KIND_KUBECONFIG")
	if cluster == "" || image == "" || kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "kind tests: set KIND_CLUSTER, KIND_KUBECONFIG and KIND_IMAGE (hack/kind/test.sh does)")
		os.Exit(1)
	}
	if pauseImage = os.Getenv("KIND_PAUSE_IMAGE"); pauseImage == "" {
		pauseImage = defaultPauseImage
	}
	nodeName = cluster + "-control-plane"
	var err error
	if root, err = filepath.Abs("../.."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kind tests:", err)
		os.Exit(1)
	}
	client = kubernetes.NewForConfigOrDie(cfg)
	os.Exit(m.Run())
}

func ctxFor(t *testing.T) context.Context { return framework.Ctx(t, 10*time.Minute) }

// run runs a command in the repository and returns its combined output.
func run(t *testing.T, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// onNode runs a command in the kind node's container.
func onNode(t *testing.T, args ...string) string {
	t.Helper()
	return strings.TrimSpace(run(t, time.Minute, "docker", append([]string{"exec", nodeName}, args...)...))
}

func newNamespace(t *testing.T) string {
	t.Helper()
	return framework.NewNamespace(t, client, "kind")
}

// createPod creates a pause pod that the kind node's kubelet runs, with the
// annotations given as key, value pairs (podjanitor.io/ is prepended).
func createPod(t *testing.T, ns, name string, kv ...string) *corev1.Pod {
	t.Helper()
	zero := int64(0)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "pause", Image: pauseImage, ImagePullPolicy: corev1.PullIfNotPresent,
			}},
			TerminationGracePeriodSeconds: &zero,
		},
	}
	for i := 0; i+1 < len(kv); i += 2 {
		pod.Annotations[prefix+kv[i]] = kv[i+1]
	}
	created, err := client.CoreV1().Pods(ns).Create(ctxFor(t), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", ns, name, err)
	}
	return created
}

func ttl(d time.Duration) []string { return []string{"ttl", d.String()} }

// removals records, per pod UID, when the pod was first seen being removed
// (a deletionTimestamp or a DELETED event), and the pods seen Running. Its
// checks are test/framework's, shared with test/e2e.
type removals struct {
	mu      sync.Mutex
	at      map[types.UID]time.Time
	running map[types.UID]bool
}

func watchRemovals(t *testing.T, ns string) *removals {
	t.Helper()
	r := &removals{at: map[types.UID]time.Time{}, running: map[types.UID]bool{}}
	framework.WatchPods(t, client, ns, func(ev watch.EventType, pod *corev1.Pod, now time.Time) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if pod.Status.Phase == corev1.PodRunning {
			r.running[pod.UID] = true
		}
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

func (r *removals) wasRunning(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running[uid]
}

func (r *removals) waitRemoved(t *testing.T, pod *corev1.Pod, timeout time.Duration) time.Time {
	t.Helper()
	return framework.WaitRemoved(t, r.get, pod, timeout)
}

// checkRemoved asserts the pod was removed at or after its deadline, and
// within late of it.
func (r *removals) checkRemoved(t *testing.T, pod *corev1.Pod, deadline time.Time, late time.Duration) {
	t.Helper()
	framework.CheckRemoved(t, r.get, pod, deadline, late)
}

// checkNotRemoved asserts the pod is still there and was never marked for removal.
func (r *removals) checkNotRemoved(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	framework.CheckNotRemoved(t, client, r.get, pod)
}

// deadline is the pod's creation (the API server's clock, which is this
// machine's: the kind node shares its kernel) plus its ttl annotation.
func deadline(t *testing.T, pod *corev1.Pod) time.Time {
	t.Helper()
	d, err := time.ParseDuration(pod.Annotations[prefix+"ttl"])
	if err != nil {
		t.Fatal(err)
	}
	return pod.CreationTimestamp.Time.Add(d)
}

// waitRunning waits until the kubelet runs the pod.
func (r *removals) waitRunning(t *testing.T, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		err := wait.PollUntilContextTimeout(ctxFor(t), 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			return r.wasRunning(p.UID), nil
		})
		if err != nil {
			t.Fatalf("pod %s/%s never ran on the kind node", p.Namespace, p.Name)
		}
	}
}

// podjanitorPod returns the Deployment's one pod.
func podjanitorPod(t *testing.T) *corev1.Pod {
	t.Helper()
	list, err := client.CoreV1().Pods("podjanitor").List(ctxFor(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=podjanitor"})
	if err != nil {
		t.Fatal(err)
	}
	var live []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	if len(live) != 1 {
		t.Fatalf("%d podjanitor pods, want 1", len(live))
	}
	return &live[0]
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitPodjanitor waits until the Deployment's pod satisfies cond.
func waitPodjanitor(t *testing.T, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctxFor(t), 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods("podjanitor").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=podjanitor"})
		if err != nil || len(list.Items) != 1 {
			return false, nil
		}
		last = &list.Items[0]
		return cond(last), nil
	})
	if err != nil {
		t.Fatalf("podjanitor's pod: %s: %v (last seen: %+v)", what, err, last)
	}
	return last
}

// podEvents are the pod's events, one a line (a failed probe says why the
// kubelet restarted a container).
func podEvents(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	list, err := client.CoreV1().Events(pod.Namespace).List(ctxFor(t), metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(pod.UID)})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range list.Items {
		fmt.Fprintf(&b, "%s %s (x%d): %s\n", e.LastTimestamp.UTC().Format(time.RFC3339), e.Reason, e.Count, e.Message)
	}
	return b.String()
}

// TestDeployment applies the shipped artifacts/deploy, with the loaded image
// and nothing else changed (hack/kind/up.sh deploy), and checks it works on
// kind: Ready, removes pods at their deadlines and none that it must not, and
// carries on after its container is killed.
func TestDeployment(t *testing.T) {
	out := run(t, 5*time.Minute, "hack/kind/up.sh", "deploy", cluster, image)
	t.Logf("hack/kind/up.sh deploy:\n%s", out)
	t.Cleanup(func() {
		_ = exec.Command(filepath.Join(root, "_output/bin/kubectl"), "--kubeconfig", os.Getenv("KIND_KUBECONFIG"), "delete", "-k", filepath.Join(root, "_output/kind/deploy"), "--ignore-not-found").Run()
	})

	var pod *corev1.Pod
	t.Run("Ready", func(t *testing.T) {
		dep, err := client.AppsV1().Deployments("podjanitor").Get(ctxFor(t), "podjanitor", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if dep.Status.ReadyReplicas != 1 || dep.Status.AvailableReplicas != 1 {
			t.Errorf("deployment status %+v, want 1 ready and available replica", dep.Status)
		}
		pod = waitPodjanitor(t, "Ready", ready)
		if pod.Spec.NodeName != nodeName {
			t.Errorf("podjanitor runs on %q, want the kind node %q", pod.Spec.NodeName, nodeName)
		}
		if got := pod.Spec.Containers[0].Image; got != image {
			t.Errorf("podjanitor's image is %q, want the loaded %q", got, image)
		}
		if s := pod.Status.ContainerStatuses; len(s) != 1 || s[0].RestartCount != 0 {
			t.Errorf("container statuses %+v, want one container never restarted; the pod's events:\n%s", s, podEvents(t, pod))
		}
	})
	if pod == nil {
		t.FailNow()
	}

	t.Run("RemovesAtDeadlines", func(t *testing.T) {
		ns := newNamespace(t)
		r := watchRemovals(t, ns)
		var due []*corev1.Pod
		for i, d := range []time.Duration{15 * time.Second, 25 * time.Second, 35 * time.Second} {
			due = append(due, createPod(t, ns, fmt.Sprintf("due-%d", i), ttl(d)...))
		}
		kept := createPod(t, ns, "kept", append(ttl(5*time.Second), "keep", "true")...)
		never := createPod(t, ns, "no-annotation")
		far := createPod(t, ns, "far", ttl(time.Hour)...)
		r.waitRunning(t, append(due, kept, never, far)...)
		for _, p := range due {
			r.checkRemoved(t, p, deadline(t, p), latenessOK)
		}
		time.Sleep(5 * time.Second)
		for _, p := range []*corev1.Pod{kept, never, far} {
			r.checkNotRemoved(t, p)
		}
	})

	t.Run("SurvivesContainerKill", func(t *testing.T) {
		before := podjanitorPod(t)
		if len(before.Status.ContainerStatuses) != 1 {
			t.Fatalf("container statuses %+v", before.Status.ContainerStatuses)
		}
		id := before.Status.ContainerStatuses[0].ContainerID
		restarts := before.Status.ContainerStatuses[0].RestartCount
		ns := newNamespace(t)
		r := watchRemovals(t, ns)
		// Before the kill: one pod due while podjanitor is down (the killed one
		// does not release its Lease: the restarted one takes it when it
		// expires), one due well after it is back, and pods it must not remove.
		during := createPod(t, ns, "due-while-down", ttl(10*time.Second)...)
		after := createPod(t, ns, "due-after-restart", ttl(90*time.Second)...)
		kept := createPod(t, ns, "kept", append(ttl(5*time.Second), "keep", "true")...)
		far := createPod(t, ns, "far", ttl(time.Hour)...)
		r.waitRunning(t, during, after, kept, far)

		cid := strings.TrimPrefix(id, "containerd://")
		pid := onNode(t, "crictl", "inspect", "--output", "go-template", "--template", "{{.info.pid}}", cid)
		t.Logf("killing podjanitor's container %s (pid %s on the node) with SIGKILL", cid[:12], pid)
		onNode(t, "kill", "-KILL", pid)
		killed := time.Now()

		p := waitPodjanitor(t, "restarted and Ready", func(p *corev1.Pod) bool {
			s := p.Status.ContainerStatuses
			return len(s) == 1 && s[0].RestartCount == restarts+1 && s[0].ContainerID != id && ready(p)
		})
		c := p.Status.ContainerStatuses[0]
		if c.LastTerminationState.Terminated == nil || c.LastTerminationState.Terminated.ExitCode != 137 {
			t.Errorf("last termination %+v, want exit code 137 (SIGKILL)", c.LastTerminationState.Terminated)
		}
		if p.UID != before.UID {
			t.Errorf("the pod was replaced (%s, was %s); want its container restarted", p.UID, before.UID)
		}
		t.Logf("the kubelet restarted the container; Ready again %v after the kill", time.Since(killed).Round(time.Second))

		// Due while podjanitor was down: removed once the restarted one leads,
		// never before its deadline.
		dl := deadline(t, during)
		at := r.waitRemoved(t, during, 2*time.Minute)
		t.Logf("pod %s: deadline %s, removed %v after it", during.Name, dl.Format(time.RFC3339), at.Sub(dl).Round(time.Millisecond))
		if at.Before(dl) {
			t.Errorf("pod %s removed %v before its deadline", during.Name, dl.Sub(at))
		}
		// Due after the restart: on time, as before the kill.
		r.checkRemoved(t, after, deadline(t, after), latenessOK)
		for _, p := range []*corev1.Pod{kept, far} {
			r.checkNotRemoved(t, p)
		}
	})
}

// TestChart installs the chart (charts/podjanitor) with the loaded image and
// nothing else set (hack/kind/up.sh deploy-chart): Ready on the kind node, and
// it removes a pod at its deadline and leaves a kept one.
func TestChart(t *testing.T) {
	out := run(t, 5*time.Minute, "hack/kind/up.sh", "deploy-chart", cluster, image)
	t.Logf("hack/kind/up.sh deploy-chart:\n%s", lastLines(out, 8))
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(root, "_output/bin/helm"), "uninstall", "podjanitor", "--namespace", "podjanitor-chart", "--wait")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+os.Getenv("KIND_KUBECONFIG"))
		_ = cmd.Run()
		_ = client.CoreV1().Namespaces().Delete(context.Background(), "podjanitor-chart", metav1.DeleteOptions{})
	})
	list, err := client.CoreV1().Pods("podjanitor-chart").List(ctxFor(t), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=podjanitor"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || !ready(&list.Items[0]) || list.Items[0].Spec.NodeName != nodeName ||
		list.Items[0].Spec.Containers[0].Image != image {
		t.Fatalf("the chart's pods %+v: want one, Ready on %s, image %s", list.Items, nodeName, image)
	}
	ns := newNamespace(t)
	r := watchRemovals(t, ns)
	due := createPod(t, ns, "due", ttl(15*time.Second)...)
	kept := createPod(t, ns, "kept", append(ttl(5*time.Second), "keep", "true")...)
	r.waitRunning(t, due, kept)
	r.checkRemoved(t, due, deadline(t, due), latenessOK)
	r.checkNotRemoved(t, kept)
}

// TestBenchKind runs `make bench-kind` for real at a small size: a fresh kind
// cluster of its own, 200 pods of the steady scenario over a minute, and
// checks its results: every pod removed, none early.
func TestBenchKind(t *testing.T) {
	// Its own port base (podjanitor's metrics port is base+90): a `make bench`
	// elsewhere on the machine uses the default 29400.
	portBase := os.Getenv("KIND_BENCH_PORT_BASE")
	if portBase == "" {
		portBase = "26500"
	}
	out := run(t, 20*time.Minute, "make", "--no-print-directory", "bench-kind",
		"BENCH_KIND_CLUSTER="+cluster+"-bench", "BENCH_PODS=200", "BENCH_SCENARIOS=steady",
		"BENCH_WINDOWS=1m", "BENCH_RUNS=1", "BENCH_ARGS=-ideal=false", "BENCH_PORT_BASE="+portBase)
	m := regexp.MustCompile(`(?m)^Results: (\S+\.json)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no results line in the output of make bench-kind:\n%s", out)
	}
	t.Logf("make bench-kind: %s", lastLines(out, 25))
	raw, err := os.ReadFile(filepath.Join(root, m[1]))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Steady []struct {
			Pods       int `json:"pods"`
			Removed    int `json:"removed"`
			NotRemoved int `json:"not_removed"`
			Early      int `json:"removed_before_deadline"`
		} `json:"steady"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatalf("%s: %v", m[1], err)
	}
	if len(res.Steady) != 1 {
		t.Fatalf("%s: %d steady results, want 1", m[1], len(res.Steady))
	}
	s := res.Steady[0]
	t.Logf("steady: %+v", s)
	if s.Pods != 200 || s.NotRemoved != 0 || s.Early != 0 || s.Removed == 0 {
		t.Errorf("steady: %+v; want 200 pods, all removed, none early", s)
	}
	// The cluster is gone again (make bench-kind deletes it).
	if strings.Contains(run(t, time.Minute, filepath.Join(root, "_output/bin/kind"), "get", "clusters"), cluster+"-bench") {
		t.Errorf("make bench-kind left its cluster %s-bench", cluster)
	}
}

func lastLines(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewBufferString(s))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "\n" + strings.Join(lines, "\n")
}
