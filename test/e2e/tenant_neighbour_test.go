//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned"
)

// TestTenantNoisyNeighbour is issue 31's acceptance for one namespace's
// policies against another's removals: a namespace holds the most policies
// and rules podjanitor uses (16 of 4 rules: the defaults' 16 and 64) and two
// more past the cap, over 500 pods, and its policies are rewritten ~40 times
// a second for a minute while another namespace's 200 ttl pods come due.
// Those are removed none early and with a lateness p99 under 1 s (the
// figures are logged); the two policies past the cap are Ready=False,
// TooManyPolicies. About 100 s.
func TestTenantNoisyNeighbour(t *testing.T) {
	installCRD(t)
	ctx := ctxFor(t)
	noisy, quiet := newNamespace(t), newNamespace(t)
	rq := watchRemovals(t, quiet)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	admin := versioned.NewForConfigOrDie(cfg)
	policies := admin.PodjanitorV1alpha1().PodLifetimePolicies(noisy)
	run := fmt.Sprintf("r%06d", rand.IntN(1000000))
	runLabel := label(tenantRunLabel, run)
	startDaemon(t, "--tenant-policies", "--label-selector", tenantRunLabel+"="+run)

	rules := func(i int, after string) []v1alpha1.PodLifetimeRule {
		var out []v1alpha1.PodLifetimeRule
		for j := range 4 {
			out = append(out, v1alpha1.PodLifetimeRule{Name: fmt.Sprintf("r%d", j),
				Match: v1alpha1.PodLifetimeMatch{LabelSelector: fmt.Sprintf("app=noisy-%d-%d", i, j)}, Clock: "created", After: after})
		}
		return out
	}
	const used, over = 16, 2
	for i := range used + over { // p-16 and p-17 sort after the 16 used
		if _, err := policies.Create(ctx, lifetimePolicy(fmt.Sprintf("p-%02d", i), rules(i, "1h")...), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 500 {
		createPod(t, noisy, fmt.Sprintf("noisy-%03d", i), runLabel, label("app", fmt.Sprintf("noisy-%d-%d", i%used, i%4)))
	}
	waitReady(t, admin, noisy, "p-00", metav1.ConditionTrue, time.Minute)
	for i := used; i < used+over; i++ {
		p := waitReady(t, admin, noisy, fmt.Sprintf("p-%02d", i), metav1.ConditionFalse, time.Minute)
		if c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady); c.Reason != "TooManyPolicies" {
			t.Errorf("policy p-%02d past the cap: Ready %+v, want reason TooManyPolicies", i, c)
		}
	}

	// The rewrites: each flips one used policy's `after` between 1h and 2h
	// (a new generation, every pod of the namespace decided again).
	rewriteCtx, stop := context.WithCancel(ctx)
	var writes, failed atomic.Int64
	var wg sync.WaitGroup
	started := time.Now()
	for w := range 4 {
		wg.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond) // 4 writers: ~40 a second
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-rewriteCtx.Done():
					return
				case <-tick.C:
				}
				i := (w*4 + n) % used
				after := []string{"1h", "2h"}[n%2]
				patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"rules": rules(i, after)}})
				if _, err := policies.Patch(rewriteCtx, fmt.Sprintf("p-%02d", i), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
					if rewriteCtx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				writes.Add(1)
			}
		})
	}
	t.Cleanup(func() { stop(); wg.Wait() })

	// The quiet namespace's 200 pods, their deadlines spread over 30 s
	// from 20 s on, all within the minute of rewrites.
	type due struct {
		pod      string
		deadline time.Time
	}
	var dues []due
	pods := map[string]types.UID{}
	for i := range 200 {
		d := 20*time.Second + time.Duration(i%30)*time.Second
		p := createPod(t, quiet, fmt.Sprintf("ttl-%03d", i), runLabel, ttl(d))
		dues = append(dues, due{p.Name, created(p).Add(d)})
		pods[p.Name] = p.UID
	}
	last := slices.MaxFunc(dues, func(a, b due) int { return a.deadline.Compare(b.deadline) }).deadline
	time.Sleep(time.Until(last.Add(latenessOK)))
	stop()
	wg.Wait()
	elapsed := time.Since(started)

	var lateness []time.Duration
	for _, d := range dues {
		at, ok := rq.get(pods[d.pod])
		if !ok {
			t.Errorf("pod %s/%s not removed %v after its deadline", quiet, d.pod, time.Since(d.deadline))
			continue
		}
		if l := at.Sub(d.deadline); l < 0 {
			t.Errorf("pod %s/%s removed %v BEFORE its deadline", quiet, d.pod, -l)
		} else {
			lateness = append(lateness, l)
		}
	}
	if len(lateness) == 0 {
		t.Fatal("no pod of the quiet namespace removed")
	}
	slices.Sort(lateness)
	q := func(f float64) time.Duration { return lateness[int(f*float64(len(lateness)-1))] }
	rate := float64(writes.Load()) / elapsed.Seconds()
	t.Logf("%d policy writes in %v (%.1f/s, %d failed) in %s; %d pods of %s removed: lateness p50 %v, p99 %v, max %v",
		writes.Load(), elapsed.Round(time.Second), rate, failed.Load(), noisy, len(lateness), quiet, q(0.5), q(0.99), lateness[len(lateness)-1])
	if rate < 20 {
		t.Errorf("only %.1f policy writes a second: the test did not load podjanitor as meant (want ~40)", rate)
	}
	if p99 := q(0.99); p99 > time.Second {
		t.Errorf("lateness p99 %v in the quiet namespace, want under 1 s while another namespace's policies churn", p99)
	}
}
