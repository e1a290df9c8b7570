package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// podJanitors runs podjanitor as a pod of the Deployment in -pod-manifests
// (artifacts/deploy rendered for the local cluster's real node, by
// hack/bench.sh with BENCH_PODJANITOR=pod): the same container, image,
// security context, probes and memory limit, with the driver's flags instead
// of the Deployment's (one process, no leader election, scoped to the
// measurement's namespace). The driver reads /proc/<pid> of the container's
// process (it runs on the same machine), scrapes the pod's IP, and streams
// the container's log through the API server.
type podJanitors struct {
	cs       kubernetes.Interface
	template corev1.PodTemplateSpec
	ns       string
}

// podMode is set when -pod-manifests is given.
var podMode *podJanitors

// setupPodMode applies the manifests' namespace, ServiceAccount, RBAC and
// ConfigMap, and keeps the Deployment's pod template. The Deployment itself
// is not created: the driver starts and stops each podjanitor.
func setupPodMode(ctx context.Context, cs kubernetes.Interface, path string) (*podJanitors, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	decode := scheme.Codecs.UniversalDeserializer().Decode
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var p *podJanitors
	var objs []runtime.Object
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if d, ok := obj.(*appsv1.Deployment); ok {
			p = &podJanitors{cs: cs, template: d.Spec.Template, ns: d.Namespace}
			continue
		}
		objs = append(objs, obj)
	}
	if p == nil {
		return nil, fmt.Errorf("%s has no Deployment", path)
	}
	for _, obj := range objs {
		if err := createOrUpdate(ctx, cs, obj); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return p, nil
}

func createOrUpdate(ctx context.Context, cs kubernetes.Interface, obj runtime.Object) error {
	var err error
	switch o := obj.(type) {
	case *corev1.Namespace:
		if _, err = cs.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			err = nil
		}
	case *corev1.ServiceAccount:
		if _, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			err = nil
		}
	case *corev1.ConfigMap:
		if _, err = cs.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			_, err = cs.CoreV1().ConfigMaps(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
	case *corev1.Service:
		return nil // the driver scrapes each pod's own address
	case *rbacv1.ClusterRole:
		if _, err = cs.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().ClusterRoles().Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.ClusterRoleBinding:
		if _, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().ClusterRoleBindings().Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.Role:
		if _, err = cs.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().Roles(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.RoleBinding:
		if _, err = cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
	default:
		return fmt.Errorf("unexpected object %T", obj)
	}
	return err
}

var nonName = regexp.MustCompile(`[^a-z0-9-]+`)

// start creates the pod, waits for its container, and returns a janitor
// whose pid, started time, URLs, log and exit channel are the pod's.
func (p *podJanitors) start(cfg *config, args []string, name string) (*janitor, error) {
	ctx := context.Background()
	spec := *p.template.Spec.DeepCopy()
	c := &spec.Containers[0]
	c.Args = append([]string{"--metrics-bind-address=:8080", "--health-probe-bind-address=:8081"}, args...)
	c.Env = append(c.Env, corev1.EnvVar{Name: "GODEBUG", Value: "gctrace=1"})
	for _, e := range cfg.podjanitorEnv {
		k, v, _ := strings.Cut(e, "=")
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: v})
	}
	spec.RestartPolicy = corev1.RestartPolicyNever
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      strings.Trim(nonName.ReplaceAllString("podjanitor-bench-"+strings.ToLower(name), "-"), "-"),
			Namespace: p.ns,
			Labels:    map[string]string{"app.kubernetes.io/name": "podjanitor-bench"},
		},
		Spec: spec,
	}
	_ = p.cs.CoreV1().Pods(p.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err := p.waitGone(ctx, pod.Name, time.Minute); err != nil {
		return nil, err
	}
	if _, err := p.cs.CoreV1().Pods(p.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating pod %s/%s: %w", p.ns, pod.Name, err)
	}
	var running *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := p.cs.CoreV1().Pods(p.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if got.Status.Phase == corev1.PodFailed || got.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod %s/%s ended: %s", p.ns, pod.Name, got.Status.Phase)
		}
		running = got
		return len(got.Status.ContainerStatuses) > 0 && got.Status.ContainerStatuses[0].State.Running != nil && got.Status.PodIP != "", nil
	})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s did not run: %w", p.ns, pod.Name, err)
	}
	id := running.Status.ContainerStatuses[0].ContainerID
	pid, started, err := containerProcess(id[strings.Index(id, "://")+3:])
	if err != nil {
		return nil, err
	}
	lf, err := os.Create(filepath.Join(cfg.outDir, "podjanitor-"+name+".log"))
	if err != nil {
		return nil, err
	}
	j := &janitor{
		pid: pid, started: started, pod: running, pods: p,
		metricsURL: fmt.Sprintf("http://%s:8080/metrics", running.Status.PodIP),
		readyURL:   fmt.Sprintf("http://%s:8081/readyz", running.Status.PodIP),
		exited:     make(chan struct{}), clockTicks: 100, logFile: lf,
	}
	logCtx, stopLog := context.WithCancel(ctx)
	j.stopLog = stopLog
	go p.follow(logCtx, pod.Name, lf)
	go func() { // closes exited when the container ends or the pod is gone
		defer close(j.exited)
		_ = wait.PollUntilContextCancel(logCtx, 500*time.Millisecond, false, func(ctx context.Context) (bool, error) {
			got, err := p.cs.CoreV1().Pods(p.ns).Get(ctx, pod.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return err == nil && (got.Status.Phase == corev1.PodFailed || got.Status.Phase == corev1.PodSucceeded), nil
		})
	}()
	return j, nil
}

// follow copies the container's log to w until ctx ends.
func (p *podJanitors) follow(ctx context.Context, name string, w io.Writer) {
	stream, err := p.cs.CoreV1().Pods(p.ns).GetLogs(name, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		logf("log of pod %s: %v", name, err)
		return
	}
	defer stream.Close()
	_, _ = io.Copy(w, stream)
}

// stop deletes the pod (podjanitor gets SIGTERM and the pod's grace period)
// and waits until it is gone.
func (p *podJanitors) stop(j *janitor) {
	ctx := context.Background()
	if err := p.cs.CoreV1().Pods(p.ns).Delete(ctx, j.pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		logf("deleting pod %s: %v", j.pod.Name, err)
	}
	if err := p.waitGone(ctx, j.pod.Name, 2*time.Minute); err != nil {
		logf("%v", err)
	}
	j.stopLog()
	<-j.exited
	j.logFile.Close()
}

func (p *podJanitors) waitGone(ctx context.Context, name string, timeout time.Duration) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := p.cs.CoreV1().Pods(p.ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		return fmt.Errorf("pod %s/%s still there after %v", p.ns, name, timeout)
	}
	return nil
}

// containerProcess finds the process whose cgroup is the container's (the
// cgroup path ends in the container ID) and when it started.
func containerProcess(id string) (int, time.Time, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, time.Time{}, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || !bytes.Contains(b, []byte("/"+id+"\n")) {
			continue
		}
		started, err := processStart(pid)
		return pid, started, err
	}
	return 0, time.Time{}, fmt.Errorf("no process runs in container %s on this machine", id)
}

// processStart is when the process started: /proc/<pid>/stat's start time, in
// clock ticks after boot, and the boot time from /proc/uptime (centiseconds;
// /proc/stat's btime has whole seconds only).
func processStart(pid int) (time.Time, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // f[0] is field 3
	if len(f) < 20 {
		return time.Time{}, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ticks, err := strconv.ParseInt(f[19], 10, 64) // field 22
	if err != nil {
		return time.Time{}, err
	}
	now := time.Now()
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Time{}, err
	}
	secs, err := strconv.ParseFloat(strings.Fields(string(up))[0], 64)
	if err != nil {
		return time.Time{}, err
	}
	boot := now.Add(-time.Duration(secs * float64(time.Second)))
	return boot.Add(time.Duration(ticks) * time.Second / 100), nil
}
