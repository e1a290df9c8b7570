//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// namespaceRequests matches podjanitor's list and watch requests of
// namespaces and, with get, its GETs of one namespace.
func namespaceRequests(get bool) func(proxiedRequest) bool {
	return func(r proxiedRequest) bool {
		if r.Method != http.MethodGet {
			return false
		}
		if r.Path == "/api/v1/namespaces" {
			return true
		}
		return get && strings.HasPrefix(r.Path, "/api/v1/namespaces/") && strings.Count(r.Path, "/") == 4
	}
}

// servedMatching returns the requests answered so far that match.
func (p *faultProxy) servedMatching(match func(proxiedRequest) bool) []proxiedRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []proxiedRequest
	for _, r := range p.requests {
		if match(r) {
			out = append(out, r)
		}
	}
	return out
}

// namespaceWatchScenario is two namespaces with a due pod each, watched by a
// podjanitor that reaches the API server through a fault proxy; the pods
// are selected by a label of the test's own, so that the podjanitor, which
// watches every namespace, touches no other test's pods.
type namespaceWatchScenario struct {
	proxy             *faultProxy
	d                 *daemon
	kept, plain       *corev1.Pod
	keptW, plainW     *removals
	deadlineAt        time.Time
	health            string
	namespaceFaultsOn time.Time
}

// startNamespaceWatchScenario starts podjanitor, creates the pods (due in
// 20 s), waits until podjanitor has decided them, then breaks the namespace
// watch with f: the watch open now is ended, so podjanitor must ask again.
// Then keep is added to the first namespace, directly at the API server.
func startNamespaceWatchScenario(t *testing.T, f fault) *namespaceWatchScenario {
	t.Helper()
	const ttlFor = 20 * time.Second
	s := &namespaceWatchScenario{proxy: newFaultProxy(t)}
	keptNS, plainNS := newNamespace(t), newNamespace(t)
	s.keptW, s.plainW = watchRemovals(t, keptNS), watchRemovals(t, plainNS)
	run := fmt.Sprintf("%06d", rand.IntN(1000000))
	s.d = startDaemon(t, "--label-selector", "e2e-nswatch="+run, "--kubeconfig", s.proxy.kubeconfig(t),
		"--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0")
	s.health = s.d.endpoints()["health"]
	s.kept = createPod(t, keptNS, "kept", label("e2e-nswatch", run), ttl(ttlFor))
	s.plain = createPod(t, plainNS, "plain", label("e2e-nswatch", run), ttl(ttlFor))
	s.deadlineAt = created(s.kept).Add(ttlFor)
	waitCached(t, s.d.log, []*corev1.Pod{s.kept, s.plain})

	s.proxy.inject(&f)
	s.namespaceFaultsOn = time.Now()
	s.proxy.endWatches()
	// podjanitor must have asked for the namespaces again and met the fault.
	deadline := time.Now().Add(30 * time.Second)
	for !s.proxy.hit(&f) {
		if time.Now().After(deadline) {
			t.Fatal("podjanitor did not ask for the namespaces again after its watch was ended")
		}
		time.Sleep(100 * time.Millisecond)
	}
	patchNamespace(t, keptNS, map[string]any{"annotations": map[string]any{prefix + "keep": "true"}})
	if time.Now().After(s.deadlineAt.Add(-2 * time.Second)) {
		t.Fatal("keep was added to the namespace too late before the pods' deadline; the test did not test it")
	}
	return s
}

// hit says whether a request has met the fault f.
func (p *faultProxy) hit(f *fault) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return f.hits > 0
}

// watchHealthy reads podjanitor_namespace_watch_healthy.
func (s *namespaceWatchScenario) watchHealthy(t *testing.T) float64 {
	t.Helper()
	return s.d.scrape(t).sum("podjanitor_namespace_watch_healthy")
}

// waitWatchHealthy waits until podjanitor_namespace_watch_healthy is want.
func (s *namespaceWatchScenario) waitWatchHealthy(t *testing.T, want float64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for s.watchHealthy(t) != want {
		if time.Now().After(deadline) {
			t.Fatalf("podjanitor_namespace_watch_healthy is not %v after %v", want, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestNamespaceWatchAndReadsRefused refuses (403, as after an RBAC change)
// every namespace request of podjanitor's after it has started, lists,
// watches and GETs alike, and adds keep to one namespace. Asserted: neither
// due pod is removed while the namespace cannot be read (held, not lost:
// podjanitor tried to read it), and /readyz and the metric say why; once
// the proxy heals, the pod of the namespace without keep goes within 30 s
// (its backoff is at most 10 s) and the kept one stays.
func TestNamespaceWatchAndReadsRefused(t *testing.T) {
	t.Parallel()
	s := startNamespaceWatchScenario(t, fault{Status: http.StatusForbidden, Match: namespaceRequests(true)})

	s.waitWatchHealthy(t, 0, 30*time.Second)
	if code, body := httpGet(t, "http://"+s.health+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "namespace watch failing") {
		t.Errorf("/readyz while the namespace watch is refused = %d %q, want 503 naming the namespace watch", code, body)
	}
	time.Sleep(time.Until(s.deadlineAt.Add(8 * time.Second)))
	s.keptW.checkNotRemoved(t, s.kept)
	s.plainW.checkNotRemoved(t, s.plain)
	refusedGets := s.proxy.servedMatching(func(r proxiedRequest) bool {
		return r.Injected && strings.HasPrefix(r.Path, "/api/v1/namespaces/") && r.At.After(s.namespaceFaultsOn)
	})
	if len(refusedGets) == 0 {
		t.Error("podjanitor never tried to read a namespace before a removal; the test did not test the hold")
	}
	if t.Failed() {
		return
	}

	s.proxy.clearFaults()
	healed := time.Now()
	at := s.plainW.waitRemoved(t, s.plain, 30*time.Second)
	t.Logf("pod %s removed %v after the namespace requests were healed", s.plain.Name, at.Sub(healed))
	if at.Before(healed) {
		t.Errorf("pod %s removed before the namespace could be read", s.plain.Name)
	}
	s.waitWatchHealthy(t, 1, 90*time.Second) // the reflector's own backoff is up to 30 s
	if code, body := httpGet(t, "http://"+s.health+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after the namespace watch recovered = %d %q, want 200", code, body)
	}
	time.Sleep(3 * time.Second)
	s.keptW.checkNotRemoved(t, s.kept)
}

// TestNamespaceWatchRefusedReadsFresh refuses (403) only podjanitor's lists
// and watches of namespaces; GETs of one namespace go through. Asserted:
// the pod of the namespace that got keep while the watch failed stays (the
// read before the removal saw keep), the other pod goes on time, and the
// metric shows the failing watch.
func TestNamespaceWatchRefusedReadsFresh(t *testing.T) {
	t.Parallel()
	s := startNamespaceWatchScenario(t, fault{Status: http.StatusForbidden, Match: namespaceRequests(false)})

	s.plainW.checkOnTime(t, s.plain, s.deadlineAt)
	if got := s.watchHealthy(t); got != 0 {
		t.Errorf("podjanitor_namespace_watch_healthy = %v while its lists and watches are refused, want 0", got)
	}
	time.Sleep(time.Until(s.deadlineAt.Add(5 * time.Second)))
	s.keptW.checkNotRemoved(t, s.kept)
	s.proxy.clearFaults()
	s.waitWatchHealthy(t, 1, 90*time.Second)
	time.Sleep(3 * time.Second)
	s.keptW.checkNotRemoved(t, s.kept)
}

// TestNamespaceWatchStalled holds podjanitor's next namespace watch (and
// list) request at the proxy for two minutes without answering: no error,
// nothing client-go's error handler or the metric can see; its cache keeps
// the namespaces as they were. Asserted: the pod of the namespace that got
// keep meanwhile stays, the other goes on time.
func TestNamespaceWatchStalled(t *testing.T) {
	t.Parallel()
	s := startNamespaceWatchScenario(t, fault{Delay: 2 * time.Minute, Match: namespaceRequests(false)})

	s.plainW.checkOnTime(t, s.plain, s.deadlineAt)
	time.Sleep(time.Until(s.deadlineAt.Add(5 * time.Second)))
	s.keptW.checkNotRemoved(t, s.kept)
	if got := s.watchHealthy(t); got != 1 {
		t.Logf("podjanitor_namespace_watch_healthy = %v for a stalled watch (it cannot tell)", got)
	}
}

// TestInvalidNamespaceKeepWarnsOnce gives a namespace an invalid keep value
// and five due pods. Asserted: one InvalidAnnotation Warning, regarding the
// Namespace, none regarding the pods, and no pod removed.
func TestInvalidNamespaceKeepWarnsOnce(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	patchNamespace(t, ns, map[string]any{"annotations": map[string]any{prefix + "keep": "maybe"}})
	r := watchRemovals(t, ns)
	var pods []*corev1.Pod
	for i := range 5 {
		pods = append(pods, createPod(t, ns, fmt.Sprintf("p%d", i), ttl(time.Second)))
	}
	d := startDaemon(t, "--namespace", ns)
	waitCached(t, d.log, pods)
	time.Sleep(time.Until(created(pods[len(pods)-1]).Add(6 * time.Second)))

	list, err := client.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var onNamespace, onPods int
	for _, e := range list.Items {
		if e.Reason != "InvalidAnnotation" {
			continue
		}
		switch e.Regarding.Kind {
		case "Namespace":
			onNamespace++
			if want := `annotation ` + prefix + `keep="maybe"`; !strings.Contains(e.Note, want) {
				t.Errorf("warning %q does not name %s", e.Note, want)
			}
		default:
			onPods++
		}
	}
	if onNamespace != 1 || onPods != 0 {
		t.Errorf("InvalidAnnotation warnings: %d on the Namespace, %d on pods; want 1 and 0", onNamespace, onPods)
	}
	for _, p := range pods {
		r.checkNotRemoved(t, p)
	}
}
