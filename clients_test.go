package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

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
