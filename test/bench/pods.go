package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/podjanitor/podjanitor/internal/workload"
)

// createResult is when each pod was created (index = pod number).
type createResult struct {
	created  []time.Time
	errors   int64
	duration time.Duration
	rate     float64
}

// createPods creates pods 0..n-1 with `concurrency` goroutines, taking indices
// in order (so pods are created roughly in deadline order), and prints a
// progress line. With status, each pod also gets a Running status.
func createPods(ctx context.Context, cs kubernetes.Interface, n, concurrency int, label string,
	mk func(i int) *corev1.Pod, status bool) createResult {
	return createPodsThen(ctx, cs, n, concurrency, label, mk, status, nil)
}

// createPodsThen is createPods, calling then (if not nil) with each pod as the
// API server's create response returned it (its UID, creationTimestamp).
func createPodsThen(ctx context.Context, cs kubernetes.Interface, n, concurrency int, label string,
	mk func(i int) *corev1.Pod, status bool, then func(i int, created *corev1.Pod)) createResult {
	res := createResult{created: make([]time.Time, n)}
	next := atomic.Int64{}
	var done atomic.Int64
	start := time.Now()
	stop := progress(func() string {
		d := done.Load()
		el := time.Since(start).Seconds()
		return fmt.Sprintf("%s: created %d/%d pods (%.0f/s, %d errors)", label, d, n, float64(d)/max(el, 0.001), atomic.LoadInt64(&res.errors))
	})
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				pod := mk(i)
				var created *corev1.Pod
				var err error
				for attempt := 0; attempt < 5; attempt++ {
					created, err = cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
					if err == nil || apierrors.IsAlreadyExists(err) || ctx.Err() != nil {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if err != nil {
					if atomic.AddInt64(&res.errors, 1) <= 3 {
						fmt.Fprintf(os.Stderr, "\ncreate %s: %v\n", pod.Name, err)
					}
					continue
				}
				if status {
					created.Status = workload.RunningStatus(created, time.Now(), i)
					for attempt := 0; attempt < 5; attempt++ {
						_, err = cs.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
						if err == nil || ctx.Err() != nil {
							break
						}
						time.Sleep(200 * time.Millisecond)
					}
					if err != nil && atomic.AddInt64(&res.errors, 1) <= 3 {
						fmt.Fprintf(os.Stderr, "\nstatus %s: %v\n", pod.Name, err)
					}
				}
				res.created[i] = time.Now()
				done.Add(1)
				if then != nil {
					then(i, created)
				}
			}
		})
	}
	wg.Wait()
	stop()
	res.duration = time.Since(start)
	res.rate = float64(done.Load()) / res.duration.Seconds()
	return res
}
