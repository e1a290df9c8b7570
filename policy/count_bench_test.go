package policy

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// BenchmarkGroups measures retention by count at scale: the places of n
// failed pods in groups of n/groups (each group a Job), under a rule that
// keeps the newest 3 of each. It reports the memory the places hold per
// pod, and per op the cost of one pod coming (its places set, the pod it
// pushes out returned) and going, and of deciding a pod by its place.
//
//	go test -run '^$' -bench Groups -benchmem ./policy/
func BenchmarkGroups(b *testing.B) {
	for _, c := range []struct{ pods, groups int }{{150000, 10000}, {10000, 1}, {150000, 1}} {
		b.Run(fmt.Sprintf("pods=%d/groups=%d", c.pods, c.groups), func(b *testing.B) {
			p, err := Parse([]byte("apiVersion: podjanitor.io/v1alpha1\nkind: PodJanitorPolicy\nrules:\n" + keepThree))
			if err != nil {
				b.Fatal(err)
			}
			g := NewGroups()
			e := &Evaluator{Policy: p, Ranks: g}
			mk := func(i int) (*corev1.Pod, string) {
				job := i % c.groups
				pod := newPod(inPhase(corev1.PodFailed), withContainers(terminatedContainer("Error", created.Add(time.Duration(i)*time.Second))))
				pod.Name = fmt.Sprintf("job-%d-%d", job, i)
				pod.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: fmt.Sprintf("job-%d", job), UID: types.UID(fmt.Sprintf("uid-%d", job)), Controller: ptr(true)}}
				return pod, pod.Namespace + "/" + pod.Name
			}
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			for i := range c.pods {
				pod, key := mk(i)
				g.Set(pod.Namespace, key, e.Members(pod, anyNamespace, key))
			}
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			heapPerPod := float64(after.HeapAlloc-before.HeapAlloc) / float64(c.pods)

			// Each op: the newest pod of a group comes (pushing one out) and
			// is decided, then goes (letting it back in).
			pods := make([]*corev1.Pod, 1000)
			keys := make([]string, len(pods))
			members := make([][]Member, len(pods))
			for i := range pods {
				pods[i], keys[i] = mk(c.pods + i)
				members[i] = e.Members(pods[i], anyNamespace, keys[i])
			}
			b.ResetTimer()
			for i := range b.N {
				k := i % len(pods)
				g.Set("default", keys[k], members[k])
				if _, err := e.Decide(pods[k], anyNamespace, now); err != nil {
					b.Fatal(err)
				}
				g.Set("default", keys[k], nil)
			}
			b.ReportMetric(heapPerPod, "heap-B/pod")
		})
	}
}
