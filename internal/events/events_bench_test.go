package events

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	clientevents "k8s.io/client-go/tools/events"
)

// nopSink accepts every event without an API call.
type nopSink struct{}

func (nopSink) Create(_ context.Context, e *eventsv1.Event) (*eventsv1.Event, error) { return e, nil }
func (nopSink) Update(_ context.Context, e *eventsv1.Event) (*eventsv1.Event, error) { return e, nil }
func (nopSink) Patch(_ context.Context, e *eventsv1.Event, _ []byte) (*eventsv1.Event, error) {
	return e, nil
}

// BenchmarkEventRecording is podjanitor's own cost of a LifetimeExpired event, up to
// the API call: the recorder, the broadcaster and the draining sink, with a
// sink that makes no request. Run it with
//
//	go test -run '^$' -bench EventRecording ./internal/events/
func BenchmarkEventRecording(b *testing.B) {
	broadcaster := clientevents.NewBroadcaster(&drainingSink{EventSink: nopSink{}})
	if err := broadcaster.StartRecordingToSinkWithContext(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, "podjanitor")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("pod-", i), Namespace: "default", UID: "uid", ResourceVersion: "1"}}
		recorder.Eventf(pod, nil, corev1.EventTypeNormal, ReasonLifetimeExpired, "Delete",
			"Pod %s: its deadline %s (%s) has passed", "deleted", time.Now().UTC().Format(time.RFC3339), "ttl")
	}
}
