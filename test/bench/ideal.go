package main

// The ideal remover: the bench driver itself removes the pods of a namespace
// of their own, each with a timer at its deadline, known in advance. It is the
// physical limit of a remover on this machine and API server: what is left
// of its lateness is the timer's wake-up, the DELETE and the watch event that
// tells the watcher, with no cache, queue, rate limiter or clock estimate in
// between. podjanitor's lateness minus the ideal's, in the same run, is what
// podjanitor adds.

import (
	"context"
	"maps"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// idealFire is what became of one pod's timer: when it fired, when its
// DELETE returned, and the DELETE's error.
type idealFire struct {
	Deadline, Fired, Done time.Time
	Err                   error
}

// idealRemover runs a timer per pod and sends the pod's DELETE (with a UID
// precondition, as podjanitor's) when it fires. The deadlines are on the
// driver's clock, which is the API server's: the bench runs on the API
// server's machine (kind's containers share its kernel clock too), so the
// ideal needs no estimate of the offset, which podjanitor has to make.
type idealRemover struct {
	clock clock.WithDelayedExecution
	del   func(ctx context.Context, name string, uid types.UID) error
	ctx   context.Context

	mu     sync.Mutex
	timers map[string]clock.Timer
	fires  map[string]idealFire
	wg     sync.WaitGroup
}

func newIdealRemover(ctx context.Context, c clock.WithDelayedExecution, del func(ctx context.Context, name string, uid types.UID) error) *idealRemover {
	return &idealRemover{clock: c, del: del, ctx: ctx, timers: map[string]clock.Timer{}, fires: map[string]idealFire{}}
}

// idealDeleter is the DELETE of ns's pods with podjanitor's client settings:
// the bench's QPS and burst (podjanitor's --kube-api-qps/--kube-api-burst),
// protobuf, no gzip (podjanitor's defaults), a UID precondition.
func idealDeleter(restCfg *rest.Config, ns string, qps float64, burst int) (func(ctx context.Context, name string, uid types.UID) error, error) {
	c := rest.CopyConfig(restCfg)
	c.QPS, c.Burst, c.UserAgent = float32(qps), burst, "podjanitor-bench-ideal"
	c.ContentType = "application/vnd.kubernetes.protobuf"
	c.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	c.DisableCompression = true
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, name string, uid types.UID) error {
		return cs.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	}, nil
}

// schedule sets the pod's timer for its deadline (at once if it has passed).
// A pod scheduled again keeps its first timer.
func (r *idealRemover) schedule(name string, uid types.UID, deadline time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.timers[name]; ok || r.ctx.Err() != nil {
		return
	}
	r.wg.Add(1)
	r.timers[name] = r.clock.AfterFunc(deadline.Sub(r.clock.Now()), func() {
		// The real clock runs this in a goroutine of its own already; the
		// fake clock of the tests runs it under its lock, which Now needs.
		go r.fire(name, uid, deadline)
	})
}

func (r *idealRemover) fire(name string, uid types.UID, deadline time.Time) {
	defer r.wg.Done()
	f := idealFire{Deadline: deadline, Fired: r.clock.Now()}
	f.Err = r.del(r.ctx, name, uid)
	f.Done = r.clock.Now()
	r.mu.Lock()
	r.fires[name] = f
	r.mu.Unlock()
}

// stop cancels the timers that have not fired and waits for the DELETEs in flight.
func (r *idealRemover) stop() {
	r.mu.Lock()
	for _, t := range r.timers {
		if t.Stop() {
			r.wg.Done()
		}
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// results is every fired timer by pod name.
func (r *idealRemover) results() map[string]idealFire {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.fires)
}

// idealSide is the ideal remover's figures in a run, beside podjanitor's.
type idealSide struct {
	Namespace   string  `json:"namespace"`
	Lateness    latency `json:"lateness"`
	Removed     int     `json:"removed"`
	Early       int     `json:"removed_before_deadline"`
	NotRemoved  int     `json:"not_removed"`
	CreatedLate int     `json:"created_less_than_1s_before_deadline"`
	// DeleteErrors counts DELETEs that failed (NotFound included: someone
	// else removed the pod first, which must not happen).
	DeleteErrors int `json:"delete_errors"`
	// TimerLate is when the timer's goroutine ran, after the deadline: the
	// driver's own wake-up on this machine. Delete is the DELETE's round
	// trip as the ideal's client saw it.
	TimerLate latency `json:"timer_fired_after_deadline"`
	Delete    latency `json:"client_delete"`
}

// versusIdeal is podjanitor's lateness against the ideal's in the same run.
type versusIdeal struct {
	P50Ratio  float64 `json:"p50_ratio"`
	P50DiffMs float64 `json:"p50_difference_ms"`
	P99Ratio  float64 `json:"p99_ratio"`
	P99DiffMs float64 `json:"p99_difference_ms"`
}

func compareToIdeal(pj, ideal latency) versusIdeal {
	return versusIdeal{
		P50Ratio: pj.P50 / ideal.P50, P50DiffMs: pj.P50 - ideal.P50,
		P99Ratio: pj.P99 / ideal.P99, P99DiffMs: pj.P99 - ideal.P99,
	}
}

// fillFires sets the timer and DELETE figures and the errors from the fires.
func (s *idealSide) fillFires(fires map[string]idealFire) {
	var timer, del []time.Duration
	for _, f := range fires {
		timer = append(timer, f.Fired.Sub(f.Deadline))
		del = append(del, f.Done.Sub(f.Fired))
		if f.Err != nil {
			s.DeleteErrors++
		}
	}
	s.TimerLate, s.Delete = latencyOf(timer), latencyOf(del)
}
