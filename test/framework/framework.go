//go:build e2e || kind

// Package framework is what the end-to-end suites share (test/e2e against the
// local cluster, test/kind against a kind cluster): namespaces for one test,
// a watch that records when each pod was removed, and the checks on it: removed
// on time, not removed, seen in a state. Each suite keeps its own TestMain,
// pods and daemon handling, and calls these with its client.
package framework

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Ctx is a context for one test's API calls, cancelled after timeout or at
// the test's end.
func Ctx(t *testing.T, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

var nonDNS = regexp.MustCompile(`[^a-z0-9]+`)

// NewNamespace creates a namespace for one test, named prefix-<test>-<random>,
// deleted at the test's end, and waits for its default ServiceAccount, which
// pod admission needs.
func NewNamespace(t *testing.T, client kubernetes.Interface, prefix string) string {
	t.Helper()
	ctx := Ctx(t, 5*time.Minute)
	base := strings.Trim(nonDNS.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 40 {
		base = base[:40]
	}
	// A test that makes many namespaces draws the same suffix now and
	// then (41 of 10,000: one run in twelve): another is drawn.
	var name string
	var err error
	for range 20 {
		name = fmt.Sprintf("%s-%s-%04d", prefix, base, rand.IntN(10000))
		_, err = client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("namespace %s: default ServiceAccount never appeared: %v", name, err)
	}
	return name
}

// WatchPods watches the namespace's pods until the test ends and calls seen
// with each pod event and the time it arrived; start it before the pods exist.
func WatchPods(t *testing.T, client kubernetes.Interface, ns string, seen func(ev watch.EventType, pod *corev1.Pod, at time.Time)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			now := time.Now()
			if pod, ok := ev.Object.(*corev1.Pod); ok {
				seen(ev.Type, pod, now)
			}
		}
	}()
}

// Removal reports whether a pod event shows the pod being removed (a
// deletionTimestamp or a DELETED event).
func Removal(ev watch.EventType, pod *corev1.Pod) bool {
	return ev == watch.Deleted || pod.DeletionTimestamp != nil
}

// RemovedAt tells when the pod of a UID was first seen being removed.
type RemovedAt func(types.UID) (time.Time, bool)

// WaitRemoved waits until the pod is removed and returns when that was seen.
func WaitRemoved(t *testing.T, removedAt RemovedAt, pod *corev1.Pod, timeout time.Duration) time.Time {
	t.Helper()
	end := time.Now().Add(timeout)
	for time.Now().Before(end) {
		if at, ok := removedAt(pod.UID); ok {
			return at
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("pod %s/%s was not removed within %v", pod.Namespace, pod.Name, timeout)
	return time.Time{}
}

// CheckRemoved asserts the pod was removed at or after its deadline, and
// within late of it.
func CheckRemoved(t *testing.T, removedAt RemovedAt, pod *corev1.Pod, deadline time.Time, late time.Duration) {
	t.Helper()
	at := WaitRemoved(t, removedAt, pod, time.Until(deadline)+late+5*time.Second)
	lateness := at.Sub(deadline)
	t.Logf("pod %s: deadline %s, removed %s, lateness %v", pod.Name, deadline.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano), lateness)
	if lateness < 0 {
		t.Errorf("pod %s removed %v BEFORE its deadline", pod.Name, -lateness)
	}
	if lateness > late {
		t.Errorf("pod %s removed %v after its deadline, want within %v", pod.Name, lateness, late)
	}
}

// CheckNotRemoved asserts the pod is still there and was never marked for removal.
func CheckNotRemoved(t *testing.T, client kubernetes.Interface, removedAt RemovedAt, pod *corev1.Pod) {
	t.Helper()
	if at, ok := removedAt(pod.UID); ok {
		t.Errorf("pod %s/%s was removed at %s; it must not be", pod.Namespace, pod.Name, at.Format(time.RFC3339Nano))
		return
	}
	got, err := client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		t.Errorf("pod %s/%s is gone; it must not be", pod.Namespace, pod.Name)
	case err != nil:
		t.Errorf("getting pod %s/%s: %v", pod.Namespace, pod.Name, err)
	case got.UID != pod.UID:
		t.Errorf("pod %s/%s was replaced", pod.Namespace, pod.Name)
	case got.DeletionTimestamp != nil:
		t.Errorf("pod %s/%s is terminating; it must not be", pod.Namespace, pod.Name)
	}
}

// WaitPod waits until a version of the pod satisfies cond (one that seen
// returns, or one read now) and returns it.
func WaitPod(t *testing.T, client kubernetes.Interface, seen func(*corev1.Pod, func(*corev1.Pod) bool) *corev1.Pod, pod *corev1.Pod, what string, timeout time.Duration, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	err := wait.PollUntilContextTimeout(Ctx(t, timeout+time.Minute), 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if got = seen(pod, cond); got != nil {
			return true, nil
		}
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.UID != pod.UID {
			return false, nil
		}
		got = p
		return cond(p), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s never became %s: %v", pod.Namespace, pod.Name, what, err)
	}
	return got
}
