package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// TestInformerClientDecodesPodsLean: the pod informer's clientset decodes a
// pod's spec down to what the cache keeps, through the same transport
// wrappers (the API-server clock reads every answer) as every other client;
// the clientset the removals use decodes the whole pod.
func TestInformerClientDecodesPodsLean(t *testing.T) {
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec:       corev1.PodSpec{NodeName: "node-1", PriorityClassName: "high", Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(pod, &buf); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
		_, _ = w.Write(buf.Bytes())
	}))
	defer srv.Close()
	var wrapped atomic.Int32
	cfg := withLimits(&rest.Config{Host: srv.URL}, clusterFlags{kubeAPIQPS: 50, kubeAPIBurst: 100, kubeAPIContentType: runtime.ContentTypeProtobuf})
	c, err := newClients(cfg, func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) { wrapped.Add(1); return rt.RoundTrip(r) })
	})
	if err != nil {
		t.Fatal(err)
	}
	lean, err := c.informerKube.CoreV1().Pods("ns").Get(context.Background(), "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lean.Spec.NodeName != "" || len(lean.Spec.Containers) != 0 || lean.Spec.PriorityClassName != "high" || lean.Name != "p" {
		t.Errorf("the informer's client decoded spec %+v of %s, want priorityClassName alone", lean.Spec, lean.Name)
	}
	whole, err := c.kube.CoreV1().Pods("ns").Get(context.Background(), "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if whole.Spec.NodeName != "node-1" || len(whole.Spec.Containers) != 1 {
		t.Errorf("the removals' client decoded spec %+v, want the whole pod", whole.Spec)
	}
	if got := wrapped.Load(); got != 2 {
		t.Errorf("%d requests went through the transport wrapper, want both", got)
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestClockProbeHasItsOwnConnectionAndNoRateLimit: the API-server clock's
// probe answers on an HTTP/1.1 connection the other clients do not share (an
// answer behind a watch's events on a shared HTTP/2 connection comes late,
// and its lateness is the clock estimate's), and does not wait in the
// clients' rate limiter behind a backlog's removals.
func TestClockProbeHasItsOwnConnectionAndNoRateLimit(t *testing.T) {
	var mu sync.Mutex
	remotes := map[string][]string{} // path: the client addresses it came from
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes[r.URL.Path] = append(remotes[r.URL.Path], fmt.Sprintf("%s %s", r.Proto, r.RemoteAddr))
		mu.Unlock()
		w.Header().Set("Content-Type", runtime.ContentTypeJSON)
		fmt.Fprint(w, `{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"ns"},"major":"1","minor":"37"}`)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	// One request a thousand seconds: the first request takes the burst.
	cfg := withLimits(&rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM}},
		clusterFlags{kubeAPIQPS: 0.001, kubeAPIBurst: 1, kubeAPIContentType: runtime.ContentTypeJSON})
	var wrapped atomic.Int32
	c, err := newClients(cfg, func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) { wrapped.Add(1); return rt.RoundTrip(r) })
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.kube.CoreV1().Namespaces().Get(ctx, "ns", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := c.probeClock(ctx); err != nil {
			t.Fatalf("probe %d with the clients' rate limit spent: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	kube, probes := remotes["/api/v1/namespaces/ns"], remotes["/version"]
	if len(kube) != 1 || len(probes) != 3 {
		t.Fatalf("requests %v, want one namespace GET and three probes", remotes)
	}
	for _, p := range probes {
		if p == kube[0] || p != probes[0] || !strings.HasPrefix(p, "HTTP/1.1 ") {
			t.Errorf("probes came from %v and the namespace GET from %s: want one HTTP/1.1 connection of the probes' own", probes, kube[0])
			break
		}
	}
	if !strings.HasPrefix(kube[0], "HTTP/2.0 ") {
		t.Errorf("the namespace GET came over %s, want HTTP/2 (the clients' own protocol untouched)", kube[0])
	}
	if got := wrapped.Load(); got != 4 {
		t.Errorf("%d requests went through the transport wrapper, want 4 (the clock reads the probes' answers)", got)
	}
}
