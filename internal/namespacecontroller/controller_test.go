package namespacecontroller

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/podjanitor/podjanitor/internal/wave"
	"github.com/podjanitor/podjanitor/policy"
)

// TestInfoIsWhatWasMeasured: the namespace cache has a change (keep taken
// off) a moment before the controller's handler measures it; a pod decided
// in that moment reads the namespace as last measured (kept), not the
// cache's unmeasured change, which could have let it go with no hold. Once
// the handler has taken the change, decisions read it.
func TestInfoIsWhatWasMeasured(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kept := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", UID: "u", Annotations: map[string]string{"podjanitor.io/keep": "true"}}}
	client := fake.NewClientset(kept)
	factory := informers.NewSharedInformerFactory(client, 0)
	informer := factory.Core().V1().Namespaces().Informer()
	c, err := New(ctx, informer, Config{
		Pods:        cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		Decide:      func(*policy.Namespace) wave.Decide { return nil },
		Now:         time.Now,
		Clock:       clock.RealClock{},
		OnHeld:      func(string, int) {},
		Redecide:    func(string) {},
		Requeue:     func(cache.ObjectName) {},
		Terminating: func(string) {},
	})
	if err != nil {
		t.Fatal(err)
	}
	go c.Run(ctx)
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.HasSynced) {
		t.Fatal("namespace cache did not sync")
	}
	if ns := c.Info("team-a"); ns == nil || ns.Annotations["podjanitor.io/keep"] != "true" {
		t.Fatalf("Info = %+v, want team-a kept", ns)
	}

	// The cache changes before the handler hears of it.
	changed := kept.DeepCopy()
	changed.Annotations = nil
	changed.ResourceVersion = "2"
	if err := informer.GetIndexer().Update(changed); err != nil {
		t.Fatal(err)
	}
	if ns := c.Info("team-a"); ns == nil || ns.Annotations["podjanitor.io/keep"] != "true" {
		t.Fatalf("Info = %+v with the change not yet measured, want team-a as measured (kept)", ns)
	}

	// Through the informer, the handler measures it, and decisions read it.
	if _, err := client.CoreV1().Namespaces().Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		ns := c.Info("team-a")
		return ns != nil && ns.Annotations["podjanitor.io/keep"] == "", nil
	}); err != nil {
		t.Fatalf("Info = %+v after the handler took the change, want it", c.Info("team-a"))
	}
	if err := client.CoreV1().Namespaces().Delete(ctx, "team-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return c.Info("team-a") == nil, nil
	}); err != nil {
		t.Fatal("a deleted namespace is still known")
	}
}
