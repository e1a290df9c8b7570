package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clientevents "k8s.io/client-go/tools/events"

	"github.com/podjanitor/podjanitor/internal/events"
	"github.com/podjanitor/podjanitor/internal/workload"
)

// BenchmarkAPIWrite compares the client side of the two writes a removal
// makes by default: the Event POST (through the events library's sink, as
// podjanitor sends it) and the pod DELETE. Both go over HTTP/2 and TLS with
// protobuf, as podjanitor's do, to an in-process server that answers at
// once (it echoes the event; it returns a realistic deleted pod), so the
// time per operation is the client's work plus a trivial server's. Run it with
//
//	go test -run '^$' -bench APIWrite -benchtime 3000x .
func BenchmarkAPIWrite(b *testing.B) {
	podBytes, err := runtime.Encode(protobufCodec(), workload.Pod("bench", "checkout-0", "bench", 0, time.Now(), "node-0"))
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
		switch r.Method {
		case http.MethodPost:
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(body)
		case http.MethodDelete:
			_, _ = w.Write(podBytes)
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	// podjanitor's client settings, with the client-side rate limit off.
	flags := clusterFlags{kubeAPIContentType: runtime.ContentTypeProtobuf, kubeAPIQPS: -1, kubeAPIBurst: 1}
	client, err := kubernetes.NewForConfig(withLimits(cfg, flags))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("EventPOST", func(b *testing.B) {
		sink := &clientevents.EventSinkImpl{Interface: client.EventsV1()}
		b.ReportAllocs()
		for b.Loop() {
			ev := &eventsv1.Event{
				ObjectMeta:          metav1.ObjectMeta{Name: "checkout-0.17c2f8a1b2c3d4e5", Namespace: "bench"},
				EventTime:           metav1.NowMicro(),
				ReportingController: "podjanitor", ReportingInstance: "podjanitor" + "-host",
				Action: "Delete", Reason: events.ReasonLifetimeExpired, Type: corev1.EventTypeNormal,
				Regarding: corev1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: "checkout-0", UID: "0b1c", APIVersion: "v1", ResourceVersion: "12345"},
				Note:      "Pod deleted: its deadline 2026-11-29T22:00:00Z (ttl) has passed",
			}
			if _, err := sink.Create(ctx, ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("PodDELETE", func(b *testing.B) {
		uid, rv := types.UID("0b1c"), "12345"
		b.ReportAllocs()
		for b.Loop() {
			err := client.CoreV1().Pods("bench").Delete(ctx, "checkout-0",
				metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

func protobufCodec() runtime.Encoder {
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	return scheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
}
