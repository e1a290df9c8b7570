//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/podjanitor/podjanitor/internal/ociarchive"
)

// TestDeployment runs the shipped artifacts/deploy on the local cluster's real
// node (kubelet, containerd, runc; hack/node/real-node.sh), rendered by
// kustomize through the overlay that hack/local-cluster.sh writes: the image
// loaded from `make image-archive`, the API server's address for the in-cluster
// configuration, and a toleration of the real node's taint; nothing else.
//
// It is not parallel: the Deployment's podjanitor acts on the whole cluster
// with the shipped policy, so it runs before the parallel tests start (Go
// runs them only after every sequential test has finished) and is removed
// before they do.
func TestDeployment(t *testing.T) {
	clusterDir, kustomize, archive := os.Getenv("E2E_CLUSTER_DIR"), os.Getenv("KUSTOMIZE_BIN"), os.Getenv("E2E_IMAGE_ARCHIVE")
	if clusterDir == "" || kustomize == "" || archive == "" {
		t.Fatal("set E2E_CLUSTER_DIR, KUSTOMIZE_BIN and E2E_IMAGE_ARCHIVE: hack/e2e.sh runs a cluster with a real node, loads the image and sets them")
	}
	docs := renderKustomization(t, kustomize, filepath.Join(clusterDir, "deploy"))
	checkOnlyOverlayChanges(t, docs, renderKustomization(t, kustomize, rbacDeployDir))
	dep := deploymentOf(t, docs)
	img := archiveDigests(t, archive)
	x := &deployed{t: t, ctr: []string{"ctr", "--address", filepath.Join(clusterDir, "node", "containerd.sock"), "--namespace", "k8s.io"}}

	ctx := ctxFor(t)
	t.Cleanup(func() { x.remove() })
	waitNamespaceUsable(t, ctx)
	// The ClusterRoleBinding comes last, once the pod has shown that it cannot
	// sync its cache without it.
	var binding []byte
	for _, d := range docs {
		if d.kind == "ClusterRoleBinding" {
			binding = d.json
			if err := client.RbacV1().ClusterRoleBindings().Delete(ctx, d.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			continue
		}
		if err := applyDoc(ctx, d); err != nil {
			t.Fatalf("applying %s %s: %v", d.kind, d.name, err)
		}
	}
	if binding == nil {
		t.Fatal("the rendered manifests have no ClusterRoleBinding")
	}
	pod := x.waitPods(1, "a running container", func(p *corev1.Pod) bool { return runningContainer(p) != nil })[0]
	t.Logf("pod %s on node %s, IP %s", pod.Name, pod.Spec.NodeName, pod.Status.PodIP)

	var readyLog int // length of the log once the pod became Ready
	t.Run("ReadyThroughProbesOnceTheCacheSynced", func(t *testing.T) {
		if pod.Spec.NodeName != realNodeName {
			t.Errorf("pod %s runs on node %q, want %s", pod.Name, pod.Spec.NodeName, realNodeName)
		}
		if id := runningContainer(pod).ImageID; id != img.config && !strings.HasSuffix(id, "@"+img.manifest) {
			t.Errorf("the container runs image %s, want the archive's (manifest %s, config %s)", id, img.manifest, img.config)
		}
		// Without the ClusterRoleBinding the pod cache cannot sync: the
		// kubelet's readiness probe of /readyz fails, its liveness probe of
		// /healthz passes (no restart), and the log shows who was refused.
		ev := waitKubeletEvent(t, pod, "Unhealthy", "Readiness probe failed: HTTP probe failed with statuscode: 503", time.Minute)
		t.Logf("kubelet: %s", ev.Message)
		// (klog quotes the error, so its quotes are escaped.)
		x.waitLog(pod, `User \"system:serviceaccount:podjanitor:podjanitor\" cannot list resource \"pods\"`, 30*time.Second)
		p := x.get(pod)
		if c := condition(p, corev1.PodReady); c == nil || c.Status != corev1.ConditionFalse {
			t.Errorf("pod Ready = %v before its cache could sync, want False", c)
		}
		if n := runningContainer(p); n == nil || n.RestartCount != 0 {
			t.Fatalf("container restarted while /readyz failed (liveness must pass): %+v", p.Status.ContainerStatuses)
		}

		if err := applyDoc(ctx, doc{kind: "ClusterRoleBinding", json: binding}); err != nil {
			t.Fatal(err)
		}
		bound := time.Now()
		p = x.waitPod(pod, "Ready", 2*time.Minute, func(p *corev1.Pod) bool {
			c := condition(p, corev1.PodReady)
			return c != nil && c.Status == corev1.ConditionTrue
		})
		t.Logf("Ready %v after the ClusterRoleBinding", time.Since(bound).Round(time.Millisecond))
		if c := condition(p, corev1.PodReady); c.LastTransitionTime.Time.Before(bound.Add(-time.Second)) {
			t.Errorf("Ready since %s, before the ClusterRoleBinding (%s)", c.LastTransitionTime, bound.Format(time.RFC3339))
		}
		if n := runningContainer(p); n == nil || n.RestartCount != 0 {
			t.Errorf("container restarted: %+v", p.Status.ContainerStatuses)
		}
		readyLog = len(x.log(pod, false))
	})

	t.Run("InClusterConfigRemovesKwokPods", func(t *testing.T) {
		c := dep.Spec.Template.Spec.Containers[0]
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--kubeconfig") || strings.HasPrefix(a, "--master") {
				t.Errorf("the Deployment passes %s; want the in-cluster configuration", a)
			}
		}
		if !hasProjectedToken(x.get(pod)) {
			t.Errorf("pod %s has no projected ServiceAccount token volume", pod.Name)
		}
		host, port := envValue(c, "KUBERNETES_SERVICE_HOST"), envValue(c, "KUBERNETES_SERVICE_PORT")
		x.waitLog(pod, fmt.Sprintf(`"Starting podjanitor" version=%q apiServer="https://%s:%s"`, x.version(pod), host, port), 5*time.Second)
		x.waitLeader(pod, "", time.Minute)

		ns := newNamespace(t)
		r := watchRemovals(t, ns)
		pending := createPod(t, ns, "pending", ttl(5*time.Second))
		running := createPod(t, ns, "running", onNode, ttl(10*time.Second))
		kept := createPod(t, ns, "kept", onNode, ttl(2*time.Second), annotate(prefix+"keep", "true"))
		// Taints keep pods off both nodes unless they tolerate one: this pod,
		// unbound, stays Pending, and kwok's pods are bound by name.
		waitPod(t, pending, "Unschedulable", func(p *corev1.Pod) bool {
			c := condition(p, corev1.PodScheduled)
			return c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
		})
		waitPod(t, running, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		r.checkOnTime(t, pending, created(pending).Add(5*time.Second))
		r.checkOnTime(t, running, created(running).Add(10*time.Second))
		checkEventFrom(t, pending, "Delete", prefix+"ttl", pod)
		checkEventFrom(t, running, "Evict", prefix+"ttl", pod)
		r.checkNotRemoved(t, kept)
		if after := x.log(pod, false)[readyLog:]; strings.Contains(after, "forbidden") {
			t.Errorf("a request was forbidden after the pod became Ready (RBAC of artifacts/deploy/rbac.yaml):\n%s", after)
		}
	})

	t.Run("MetricsOverHTTPSToReadersOnly", func(t *testing.T) {
		// --metrics-secure: the self-signed certificate, reviews of the
		// caller through the in-cluster configuration with rbac.yaml's
		// permissions, and artifacts/monitoring's reader token.
		token := applyMetricsReader(t, ctx)
		url := fmt.Sprintf("https://%s:%d/metrics", x.get(pod).Status.PodIP, containerPort(t, dep, "metrics"))
		if code, body := secureGet(t, url, ""); code != http.StatusUnauthorized {
			t.Errorf("anonymous GET %s: %d %q, want 401", url, code, lastLines(body, 3))
		}
		var code int
		var body string
		err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
			code, body = secureGet(t, url, token)
			return code == http.StatusOK, nil
		})
		if err != nil || !strings.Contains(body, "podjanitor_leader 1") {
			t.Errorf("GET %s with the reader's token: %d %q, want the leader's metrics", url, code, lastLines(body, 3))
		}
		if after := x.log(pod, false)[readyLog:]; strings.Contains(after, "forbidden") {
			t.Errorf("a review was forbidden (RBAC of artifacts/deploy/rbac.yaml):\n%s", after)
		}
	})

	t.Run("NonRootReadOnlyNoCapabilities", func(t *testing.T) {
		pid := x.pid(pod)
		status := readProc(t, pid, "status")
		for field, want := range map[string]string{
			"Uid": "65532\t65532\t65532\t65532", "Gid": "65532\t65532\t65532\t65532",
			"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
			"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2",
		} {
			if got := procField(status, field); got != want {
				t.Errorf("/proc/%d/status %s: %q, want %q", pid, field, got, want)
			}
		}
		if g := procField(status, "Groups"); slices.Contains(strings.Fields(g), "0") {
			t.Errorf("supplementary groups %q include root", g)
		}
		// Every mount outside /proc, /sys and /dev is read-only, the root
		// file system first, but /etc/hosts: the kubelet mounts its
		// pod-wide hosts file writable whatever the security context says.
		upper := ""
		for _, m := range parseMountinfo(readProc(t, pid, "mountinfo")) {
			if m.point == "/" {
				upper = m.option("upperdir")
			}
			if m.point == "/proc" || m.point == "/sys" || m.point == "/dev" || m.point == "/etc/hosts" ||
				strings.HasPrefix(m.point, "/proc/") || strings.HasPrefix(m.point, "/sys/") || strings.HasPrefix(m.point, "/dev/") {
				continue
			}
			if !slices.Contains(strings.Split(m.opts, ","), "ro") {
				t.Errorf("mount %s (%s) is writable in the container", m.point, m.fstype)
			}
		}
		// The writable files the kubelet gives every container are untouched:
		// /etc/hosts is older than the process, the termination log empty.
		started, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		if err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(fmt.Sprintf("/proc/%d/root/etc/hosts", pid)); err != nil || fi.ModTime().After(started.ModTime()) {
			t.Errorf("/etc/hosts in the container: %v, modified after the process started (%s)", err, started.ModTime())
		}
		if fi, err := os.Stat(fmt.Sprintf("/proc/%d/root/dev/termination-log", pid)); err != nil || fi.Size() != 0 {
			t.Errorf("/dev/termination-log in the container: %v, want it empty", err)
		}
		// Nothing podjanitor did since it started (sync, removals, events)
		// wrote a file: it has no file open for writing, and the container's
		// layer holds only the empty mount points runc made before it turned
		// the root read-only.
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, fd := range fds {
			target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if fi, err := os.Stat(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err != nil || !fi.Mode().IsRegular() || !strings.HasPrefix(target, "/") {
				continue // pipes, sockets, devices (/dev/null), anonymous inodes
			}
			flags := procField(readProc(t, pid, "fdinfo/"+fd.Name()), "flags")
			if f, err := strconv.ParseInt(flags, 8, 64); err != nil || f&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
				t.Errorf("fd %s (%s) is open for writing (flags %s)", fd.Name(), target, flags)
			}
		}
		if upper == "" {
			t.Fatal("the container's root is not an overlay with an upper directory")
		}
		err = filepath.Walk(upper, func(path string, info os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			if !info.IsDir() && info.Size() != 0 {
				t.Errorf("the container wrote %s (%d bytes)", strings.TrimPrefix(path, upper), info.Size())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("MemoryLimitFromTheCgroup", func(t *testing.T) {
		pid := x.pid(pod)
		var cgroup string
		for _, line := range strings.Split(readProc(t, pid, "cgroup"), "\n") {
			if f := strings.SplitN(line, ":", 3); len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "memory") {
				cgroup = f[2]
			}
		}
		if cgroup == "" {
			t.Fatalf("/proc/%d/cgroup has no memory cgroup", pid)
		}
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cgroup, "memory.limit_in_bytes"))
		if err != nil {
			t.Fatal(err)
		}
		limit, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		want := dep.Spec.Template.Spec.Containers[0].Resources.Limits.Memory().Value()
		if limit != want {
			t.Errorf("container cgroup %s: memory limit %d, want the Deployment's %d", cgroup, limit, want)
		}
		x.waitLog(pod, fmt.Sprintf(`softMemoryLimit="%d bytes (90%% of the cgroup's memory limit)"`, int64(float64(limit)*0.9)), 5*time.Second)
	})

	t.Run("RestartedByTheKubeletAfterKill", func(t *testing.T) {
		before := runningContainer(x.get(pod))
		holder := x.waitLeader(pod, "", 10*time.Second)
		ns := newNamespace(t)
		r := watchRemovals(t, ns)
		if err := syscall.Kill(x.pid(pod), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		// Pods that come due while no podjanitor acts: the killed one did not
		// release the Lease, so the restarted one waits until it expires.
		var due []*corev1.Pod
		for i := range 3 {
			due = append(due, createPod(t, ns, fmt.Sprintf("due-%d", i), ttl(2*time.Second)))
		}
		p := x.waitPod(pod, "restarted", time.Minute, func(p *corev1.Pod) bool {
			c := runningContainer(p)
			return c != nil && c.RestartCount == before.RestartCount+1 && c.ContainerID != before.ContainerID
		})
		c := runningContainer(p)
		if c.LastTerminationState.Terminated == nil || c.LastTerminationState.Terminated.ExitCode != 137 {
			t.Errorf("last termination %+v, want exit code 137 (SIGKILL)", c.LastTerminationState.Terminated)
		}
		t.Logf("the kubelet restarted the container %v after the kill", c.State.Running.StartedAt.Sub(killed).Round(time.Second))
		lease := x.waitLeaderLease(pod, holder, time.Minute)
		for _, d := range due {
			deadline := created(d).Add(2 * time.Second)
			at := r.waitRemoved(t, d, time.Minute)
			t.Logf("pod %s: deadline %s, removed %v late", d.Name, deadline.Format(time.RFC3339), at.Sub(deadline).Round(time.Millisecond))
			if at.Before(deadline) {
				t.Errorf("pod %s removed before its deadline", d.Name)
			}
			if lease.Spec.AcquireTime.Time.Before(deadline) {
				t.Errorf("the restarted podjanitor took the lease at %s, before pod %s came due", lease.Spec.AcquireTime.Format(time.RFC3339Nano), d.Name)
			}
			checkEventFrom(t, d, "Delete", prefix+"ttl", pod)
		}
	})

	t.Run("PolicyConfigMapEditAppliedWithoutRestart", func(t *testing.T) {
		before := runningContainer(x.get(pod))
		ns := newNamespace(t)
		r := watchRemovals(t, ns)
		run := fmt.Sprintf("%04d", rand.IntN(10000))
		early := createPod(t, ns, "before-edit", label("e2e.podjanitor.io/reload", run))
		reloads := strings.Count(x.log(pod, false), "Reloaded the policy file")
		// The new rule goes first: the shipped "unschedulable" rule would
		// otherwise decide these Pending pods (after 30 minutes).
		rule := fmt.Sprintf("  - name: e2e-reload\n    match:\n      labelSelector: \"e2e.podjanitor.io/reload=%s\"\n    clock: created\n    after: 3s\n", run)
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cm, err := client.CoreV1().ConfigMaps(rbacNS).Get(ctx, "podjanitor-policy", metav1.GetOptions{})
			if err != nil {
				return err
			}
			policy := cm.Data["policy.yaml"]
			if !strings.Contains(policy, "\nrules:\n") {
				return fmt.Errorf("policy.yaml has no top-level rules: list")
			}
			cm.Data["policy.yaml"] = strings.Replace(policy, "\nrules:\n", "\nrules:\n"+rule, 1)
			_, err = client.CoreV1().ConfigMaps(rbacNS).Update(ctx, cm, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		edited := time.Now()
		r.checkNotRemoved(t, early)
		x.waitLogCount(pod, "Reloaded the policy file", reloads+1, 2*time.Minute)
		t.Logf("the edit reached the pod and was reloaded %v after the update", time.Since(edited).Round(time.Second))
		r.waitRemoved(t, early, 30*time.Second)
		checkEventFrom(t, early, "Delete", "rule/e2e-reload", pod)
		late := createPod(t, ns, "after-edit", label("e2e.podjanitor.io/reload", run))
		r.checkOnTime(t, late, created(late).Add(3*time.Second))
		checkEventFrom(t, late, "Delete", "rule/e2e-reload", pod)
		if c := runningContainer(x.get(pod)); c == nil || c.ContainerID != before.ContainerID || c.RestartCount != before.RestartCount {
			t.Errorf("the container was restarted: before %+v, now %+v", before, c)
		}
	})

	t.Run("TwoReplicasHandOverTheLease", func(t *testing.T) {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			d, err := client.AppsV1().Deployments(rbacNS).Get(ctx, dep.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			d.Spec.Replicas = ptrTo(int32(2))
			_, err = client.AppsV1().Deployments(rbacNS).Update(ctx, d, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		pods := x.waitPods(2, "Ready", func(p *corev1.Pod) bool {
			c := condition(p, corev1.PodReady)
			return c != nil && c.Status == corev1.ConditionTrue
		})
		if pods[0].Status.PodIP == pods[1].Status.PodIP {
			t.Errorf("both replicas have IP %s; want a network namespace each", pods[0].Status.PodIP)
		}
		lease := x.lease()
		var leader *corev1.Pod
		for _, p := range pods {
			if strings.HasPrefix(deref(lease.Spec.HolderIdentity), p.Name+"_") {
				leader = p
			}
		}
		if leader == nil {
			t.Fatalf("the Lease is held by %q, neither replica", deref(lease.Spec.HolderIdentity))
		}
		if err := client.CoreV1().Pods(rbacNS).Delete(ctx, leader.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		// The other replica, warm, or the ReplicaSet's replacement for the
		// deleted pod, whichever asks first once the leader released the Lease.
		next := x.waitNewLeader(leader, 30*time.Second)
		handover := time.Since(deleted)
		duration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
		t.Logf("the lease went from %s to %s %v after the leader's pod was deleted (lease duration %v)", leader.Name, next.Name, handover.Round(time.Millisecond), duration)
		if handover >= duration {
			t.Errorf("handover took %v: the deleted leader did not release the lease on SIGTERM", handover)
		}
		ns := newNamespace(t)
		r := watchRemovals(t, ns)
		var due []*corev1.Pod
		for i := range 3 {
			due = append(due, createPod(t, ns, fmt.Sprintf("after-handover-%d", i), ttl(time.Duration(2+i)*time.Second)))
		}
		for _, d := range due {
			r.checkOnTime(t, d, created(d).Add(ttlOf(t, d)))
			checkEventFrom(t, d, "Delete", prefix+"ttl", next)
		}
	})
}

const realNodeName = "real-node-0"

// containerPort is the number of the Deployment's container port name.
func containerPort(t *testing.T, dep *appsv1.Deployment, name string) int32 {
	t.Helper()
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("Deployment %s has no container port %s", dep.Name, name)
	return 0
}

// deployed is the Deployment of TestDeployment and its pods.
type deployed struct {
	t   *testing.T
	ctr []string // ctr with the real node's containerd socket
}

var appSelector = "app.kubernetes.io/name=podjanitor"

// waitPods waits until the Deployment has n pods, none terminating, each
// satisfying cond, and returns them.
func (x *deployed) waitPods(n int, what string, cond func(*corev1.Pod) bool) []*corev1.Pod {
	x.t.Helper()
	var pods []*corev1.Pod
	err := wait.PollUntilContextTimeout(ctxFor(x.t), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(rbacNS).List(ctx, metav1.ListOptions{LabelSelector: appSelector})
		if err != nil {
			return false, nil
		}
		pods = pods[:0]
		for i := range list.Items {
			if p := &list.Items[i]; p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		if len(pods) != n {
			return false, nil
		}
		for _, p := range pods {
			if !cond(p) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		x.dumpPods()
		x.t.Fatalf("the Deployment never had %d pods with %s: %v", n, what, err)
	}
	return pods
}

func (x *deployed) get(pod *corev1.Pod) *corev1.Pod {
	x.t.Helper()
	p, err := client.CoreV1().Pods(pod.Namespace).Get(ctxFor(x.t), pod.Name, metav1.GetOptions{})
	if err != nil {
		x.t.Fatalf("pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return p
}

func (x *deployed) waitPod(pod *corev1.Pod, what string, timeout time.Duration, cond func(*corev1.Pod) bool) *corev1.Pod {
	x.t.Helper()
	var got *corev1.Pod
	err := wait.PollUntilContextTimeout(ctxFor(x.t), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = p
		return cond(p), nil
	})
	if err != nil {
		x.dumpPods()
		x.t.Fatalf("pod %s never became %s within %v", pod.Name, what, timeout)
	}
	return got
}

// log is the container's log through the API server (and so the kubelet).
func (x *deployed) log(pod *corev1.Pod, previous bool) string {
	x.t.Helper()
	b, err := client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "podjanitor", Previous: previous}).DoRaw(ctxFor(x.t))
	if err != nil {
		x.t.Fatalf("log of pod %s: %v", pod.Name, err)
	}
	return string(b)
}

func (x *deployed) waitLog(pod *corev1.Pod, s string, timeout time.Duration) {
	x.t.Helper()
	x.waitLogCount(pod, s, 1, timeout)
}

func (x *deployed) waitLogCount(pod *corev1.Pod, s string, n int, timeout time.Duration) {
	x.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l := x.log(pod, false)
		if strings.Count(l, s) >= n {
			return
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("pod %s did not log %q (%d times) within %v; its log:\n%s", pod.Name, s, n, timeout, lastLines(l, 40))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

var versionRE = regexp.MustCompile(`"Starting podjanitor" version="([^"]*)"`)

func (x *deployed) version(pod *corev1.Pod) string {
	x.t.Helper()
	x.waitLog(pod, `"Starting podjanitor"`, 30*time.Second)
	m := versionRE.FindStringSubmatch(x.log(pod, false))
	if m == nil {
		x.t.Fatal("no version in the \"Starting podjanitor\" line")
	}
	return m[1]
}

// pid is the host PID of the pod's podjanitor process, from containerd.
func (x *deployed) pid(pod *corev1.Pod) int {
	x.t.Helper()
	c := runningContainer(x.get(pod))
	if c == nil {
		x.t.Fatalf("pod %s has no running container", pod.Name)
	}
	id := strings.TrimPrefix(c.ContainerID, "containerd://")
	out, err := exec.Command(x.ctr[0], append(x.ctr[1:], "tasks", "ls")...).CombinedOutput()
	if err != nil {
		x.t.Fatalf("ctr tasks ls: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == id && f[2] == "RUNNING" {
			pid, err := strconv.Atoi(f[1])
			if err == nil {
				return pid
			}
		}
	}
	x.t.Fatalf("containerd runs no task %s:\n%s", id, out)
	return 0
}

func (x *deployed) lease() *coordinationv1.Lease {
	x.t.Helper()
	l, err := client.CoordinationV1().Leases(rbacNS).Get(ctxFor(x.t), "podjanitor", metav1.GetOptions{})
	if err != nil {
		x.t.Fatalf("Lease %s/podjanitor: %v", rbacNS, err)
	}
	return l
}

// waitLeader waits until a process of pod holds the Lease, under another
// identity than notHolder, and returns its identity.
func (x *deployed) waitLeader(pod *corev1.Pod, notHolder string, timeout time.Duration) string {
	x.t.Helper()
	return deref(x.waitLeaderLease(pod, notHolder, timeout).Spec.HolderIdentity)
}

func (x *deployed) waitLeaderLease(pod *corev1.Pod, notHolder string, timeout time.Duration) *coordinationv1.Lease {
	x.t.Helper()
	var l *coordinationv1.Lease
	err := wait.PollUntilContextTimeout(ctxFor(x.t), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		got, err := client.CoordinationV1().Leases(rbacNS).Get(ctx, "podjanitor", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		l = got
		h := deref(l.Spec.HolderIdentity)
		return strings.HasPrefix(h, pod.Name+"_") && h != notHolder, nil
	})
	if err != nil {
		x.t.Fatalf("pod %s did not take the Lease within %v (holder %q)", pod.Name, timeout, deref(l.Spec.HolderIdentity))
	}
	return l
}

// waitNewLeader waits until a pod of the Deployment other than old holds the
// Lease, and returns that pod.
func (x *deployed) waitNewLeader(old *corev1.Pod, timeout time.Duration) *corev1.Pod {
	x.t.Helper()
	var holder string
	var next *corev1.Pod
	err := wait.PollUntilContextTimeout(ctxFor(x.t), 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoordinationV1().Leases(rbacNS).Get(ctx, "podjanitor", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		holder = deref(l.Spec.HolderIdentity)
		name, _, _ := strings.Cut(holder, "_")
		if name == "" || name == old.Name {
			return false, nil
		}
		next, err = client.CoreV1().Pods(rbacNS).Get(ctx, name, metav1.GetOptions{})
		return err == nil && next.DeletionTimestamp == nil && next.Labels["app.kubernetes.io/name"] == "podjanitor", nil
	})
	if err != nil {
		x.dumpPods()
		x.t.Fatalf("no other pod of the Deployment took the Lease from %s within %v (holder %q)", old.Name, timeout, holder)
	}
	return next
}

func (x *deployed) dumpPods() {
	list, err := client.CoreV1().Pods(rbacNS).List(context.Background(), metav1.ListOptions{LabelSelector: appSelector})
	if err != nil {
		return
	}
	for _, p := range list.Items {
		b, _ := json.MarshalIndent(p.Status, "", "  ")
		x.t.Logf("pod %s (node %q):\n%s", p.Name, p.Spec.NodeName, b)
		if l, err := client.CoreV1().Pods(rbacNS).GetLogs(p.Name, &corev1.PodLogOptions{Container: "podjanitor"}).DoRaw(context.Background()); err == nil {
			x.t.Logf("log of %s:\n%s", p.Name, lastLines(string(l), 40))
		}
		evs, _ := client.CoreV1().Events(rbacNS).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name})
		for _, e := range evs.Items {
			x.t.Logf("event %s %s: %s", e.Type, e.Reason, e.Message)
		}
	}
}

// remove deletes the Deployment and what else of the manifests a test run
// could leave acting (the policy, the Lease), and waits until its pods are
// gone, so that the parallel tests run without it. The Namespace and the
// RBAC objects stay, as TestRBAC* leave them.
func (x *deployed) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if x.t.Failed() {
		x.dumpPods()
	}
	bg := metav1.DeletePropagationBackground
	_ = client.AppsV1().Deployments(rbacNS).Delete(ctx, "podjanitor", metav1.DeleteOptions{PropagationPolicy: &bg})
	_ = client.CoreV1().ConfigMaps(rbacNS).Delete(ctx, "podjanitor-policy", metav1.DeleteOptions{})
	_ = client.CoreV1().Services(rbacNS).Delete(ctx, "podjanitor-metrics", metav1.DeleteOptions{})
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(rbacNS).List(ctx, metav1.ListOptions{LabelSelector: appSelector})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		x.t.Errorf("the Deployment's pods were not gone 2 minutes after its deletion: %v", err)
	}
	_ = client.CoordinationV1().Leases(rbacNS).Delete(ctx, "podjanitor", metav1.DeleteOptions{})
}

func runningContainer(p *corev1.Pod) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if c := &p.Status.ContainerStatuses[i]; c.Name == "podjanitor" && c.State.Running != nil {
			return c
		}
	}
	return nil
}

func hasProjectedToken(p *corev1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.ServiceAccountToken != nil {
				return true
			}
		}
	}
	return false
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// checkEventFrom checks the removal event and that the pod's podjanitor
// reported it (events name their reporting instance after the host name).
func checkEventFrom(t *testing.T, pod *corev1.Pod, action, source string, from *corev1.Pod) {
	t.Helper()
	checkReportedEvent(t, pod, action, source)
	ev := waitRemovalEvent(t, pod, action)
	if want := "podjanitor-" + from.Name; ev.ReportingInstance != want {
		t.Errorf("%s event on %s reported by instance %q, want %q", ev.Reason, pod.Name, ev.ReportingInstance, want)
	}
}

// waitKubeletEvent waits for a core/v1 event of the kubelet on the pod.
func waitKubeletEvent(t *testing.T, pod *corev1.Pod, reason, message string, timeout time.Duration) corev1.Event {
	t.Helper()
	var found corev1.Event
	err := wait.PollUntilContextTimeout(ctxFor(t), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
		if err != nil {
			return false, nil
		}
		for _, e := range list.Items {
			if e.Reason == reason && strings.Contains(e.Message, message) && e.Source.Component == "kubelet" {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no kubelet event %s %q on pod %s within %v", reason, message, pod.Name, timeout)
	}
	return found
}

func readProc(t *testing.T, pid int, name string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// procField returns the value of "Name:\tvalue" in a /proc status-like file.
func procField(s, name string) string {
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

type mount struct {
	point, opts, fstype, superOpts string
}

func (m mount) option(name string) string {
	for _, o := range strings.Split(m.superOpts, ",") {
		if v, ok := strings.CutPrefix(o, name+"="); ok {
			return v
		}
	}
	return ""
}

// parseMountinfo reads /proc/<pid>/mountinfo: mount point, per-mount
// options, file system type and super block options.
func parseMountinfo(s string) []mount {
	var out []mount
	for _, line := range strings.Split(s, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 3 {
			continue
		}
		out = append(out, mount{point: f[4], opts: f[5], fstype: g[0], superOpts: g[2]})
	}
	return out
}

// doc is one rendered object, as JSON.
type doc struct {
	kind, name string
	json       []byte
}

// renderKustomization runs `kustomize build dir`.
func renderKustomization(t *testing.T, kustomize, dir string) []doc {
	t.Helper()
	out, err := exec.Command(kustomize, "build", dir).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, msg)
	}
	path := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	raw, err := deployDocuments(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []doc
	for _, j := range raw {
		var m struct {
			Kind     string            `json:"kind"`
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(j, &m); err != nil {
			t.Fatal(err)
		}
		docs = append(docs, doc{kind: m.Kind, name: m.Metadata.Name, json: j})
	}
	return docs
}

func deploymentOf(t *testing.T, docs []doc) *appsv1.Deployment {
	t.Helper()
	for _, d := range docs {
		if d.kind == "Deployment" {
			var dep appsv1.Deployment
			if err := rbacStrictJSON(d.json, &dep); err != nil {
				t.Fatal(err)
			}
			return &dep
		}
	}
	t.Fatal("the rendered manifests have no Deployment")
	return nil
}

// checkOnlyOverlayChanges compares the overlay's rendering with
// artifacts/deploy's own: the same objects, and the Deployment differs only in
// its image, the API server's address and the toleration.
func checkOnlyOverlayChanges(t *testing.T, overlay, base []doc) {
	t.Helper()
	if len(overlay) != len(base) {
		t.Fatalf("the overlay renders %d objects, artifacts/deploy %d", len(overlay), len(base))
	}
	for i := range base {
		o, b := overlay[i], base[i]
		if o.kind != b.kind || o.name != b.name {
			t.Fatalf("object %d: overlay %s %s, artifacts/deploy %s %s", i, o.kind, o.name, b.kind, b.name)
		}
		if o.kind != "Deployment" {
			if !bytes.Equal(o.json, b.json) {
				t.Errorf("the overlay changes %s %s:\n%s\nvs\n%s", o.kind, o.name, o.json, b.json)
			}
			continue
		}
		od, bd := deploymentOf(t, []doc{o}), deploymentOf(t, []doc{b})
		oc, bc := &od.Spec.Template.Spec.Containers[0], bd.Spec.Template.Spec.Containers[0]
		if oc.Image != "local/podjanitor:dev" {
			t.Errorf("overlay image %q, want local/podjanitor:dev", oc.Image)
		}
		oc.Image = bc.Image
		oc.Env = slices.DeleteFunc(oc.Env, func(e corev1.EnvVar) bool {
			return e.Name == "KUBERNETES_SERVICE_HOST" || e.Name == "KUBERNETES_SERVICE_PORT"
		})
		od.Spec.Template.Spec.Tolerations = nil
		if !reflect.DeepEqual(od, bd) {
			a, _ := json.MarshalIndent(od, "", " ")
			b, _ := json.MarshalIndent(bd, "", " ")
			t.Errorf("the overlay changes the Deployment beyond image, API server address and toleration:\n%s\nvs\n%s", a, b)
		}
	}
}

// imageDigests identify an image: its manifest's digest (a repository
// digest names it) and its config's (the image ID).
type imageDigests struct{ manifest, config string }

// archiveDigests reads them from an OCI archive.
func archiveDigests(t *testing.T, path string) imageDigests {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, err := ociarchive.Read(f, func(hdr *tar.Header) bool { return hdr.Name == "index.json" || hdr.Size < 1<<20 })
	if err != nil {
		t.Fatal(err)
	}
	manifest, config, err := files.ImageDigests()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return imageDigests{manifest: manifest, config: config}
}

// waitNamespaceUsable waits until the podjanitor namespace is not terminating.
func waitNamespaceUsable(t *testing.T, ctx context.Context) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		ns, err := client.CoreV1().Namespaces().Get(ctx, rbacNS, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && ns.DeletionTimestamp == nil), nil
	})
	if err != nil {
		t.Fatalf("namespace %s is still terminating: %v", rbacNS, err)
	}
}

// applyDoc creates or updates one rendered object.
func applyDoc(ctx context.Context, d doc) error {
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(d.json, &meta); err != nil {
		return err
	}
	ns := meta.Metadata.Namespace
	switch d.kind {
	case "ConfigMap":
		c := client.CoreV1().ConfigMaps(ns)
		return upsertObject[corev1.ConfigMap](ctx, d.json, c.Create, c.Get, c.Update)
	case "Service":
		c := client.CoreV1().Services(ns)
		return upsertObject[corev1.Service](ctx, d.json, c.Create, c.Get, c.Update)
	case "Deployment":
		c := client.AppsV1().Deployments(ns)
		return upsertObject[appsv1.Deployment](ctx, d.json, c.Create, c.Get, c.Update)
	case "ClusterRoleBinding":
		c := client.RbacV1().ClusterRoleBindings()
		return upsertObject[rbacv1.ClusterRoleBinding](ctx, d.json, c.Create, c.Get, c.Update)
	case "Namespace", "ServiceAccount", "ClusterRole", "Role", "RoleBinding":
		return applyDeployDoc(ctx, d.kind, d.json)
	default:
		return fmt.Errorf("unexpected kind %s", d.kind)
	}
}
