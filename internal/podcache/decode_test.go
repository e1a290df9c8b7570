package podcache

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

func encodeProtobuf(t *testing.T, obj runtime.Object) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func protobufDecoder(t *testing.T, ns runtime.NegotiatedSerializer) runtime.Decoder {
	t.Helper()
	info, ok := runtime.SerializerInfoForMediaType(ns.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	return ns.DecoderToVersion(info.Serializer, corev1.SchemeGroupVersion)
}

// TestLeanDecodingKeepsDecisions: a pod decoded by LeanDecoding is cached
// exactly as the same pod decoded whole, so every decision on it is the same
// (TestLeanPodKeepsDecisions); and only the spec and managedFields lost
// anything, managedFields no more than the status writes' times.
func TestLeanDecodingKeepsDecisions(t *testing.T) {
	whole := protobufDecoder(t, scheme.Codecs.WithoutConversion())
	lean := protobufDecoder(t, LeanDecoding(scheme.Codecs.WithoutConversion()))
	transform := PodTransform("podjanitor.io")
	rng := rand.New(rand.NewPCG(3, 4))
	base := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	for i := range 2000 {
		pod := generatePod(rng, i, base)
		if i%2 == 0 {
			pod.Spec.PriorityClassName = "batch-low"
		}
		pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		data := encodeProtobuf(t, pod)

		fullObj, err := runtime.Decode(whole, data)
		if err != nil {
			t.Fatal(err)
		}
		leanObj, err := runtime.Decode(lean, data)
		if err != nil {
			t.Fatal(err)
		}
		full, got := fullObj.(*corev1.Pod), leanObj.(*corev1.Pod)
		if diff := cmp.Diff(corev1.PodSpec{PriorityClassName: pod.Spec.PriorityClassName, SchedulingGroup: pod.Spec.SchedulingGroup}, got.Spec); diff != "" {
			t.Fatalf("pod %d: spec decoded (-want,+got):\n%s", i, diff)
		}
		if diff := cmp.Diff(statusWrites(full.ManagedFields), got.ManagedFields); diff != "" {
			t.Fatalf("pod %d: managedFields decoded (-want,+got):\n%s", i, diff)
		}
		if w, g := full.ObjectMeta.DeepCopy(), got.ObjectMeta.DeepCopy(); true {
			w.ManagedFields, g.ManagedFields = nil, nil
			if diff := cmp.Diff(w, g); diff != "" {
				t.Fatalf("pod %d: metadata differs (-whole,+lean):\n%s", i, diff)
			}
		}
		if diff := cmp.Diff(full.Status, got.Status); diff != "" {
			t.Fatalf("pod %d: status differs (-whole,+lean):\n%s", i, diff)
		}
		a, err := transform(full)
		if err != nil {
			t.Fatal(err)
		}
		b, err := transform(got)
		if err != nil {
			t.Fatal(err)
		}
		if *a.(*cachedPod) != *b.(*cachedPod) {
			t.Fatalf("pod %d: cached differently when decoded lean", i)
		}
	}
}

// statusWrites is what LeanDecoding keeps of managedFields: the status
// subresource's entries, with their subresource and time.
func statusWrites(all []metav1.ManagedFieldsEntry) []metav1.ManagedFieldsEntry {
	var kept []metav1.ManagedFieldsEntry
	for _, f := range all {
		if f.Subresource == "status" {
			kept = append(kept, metav1.ManagedFieldsEntry{Subresource: f.Subresource, Time: f.Time})
		}
	}
	return kept
}

// TestLeanDecodingLeavesOtherObjectsAlone: anything but a protobuf v1 Pod,
// and anything that does not parse, is decoded as without LeanDecoding; so is
// a pod decoded into another type than a Pod.
func TestLeanDecodingLeavesOtherObjectsAlone(t *testing.T) {
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	list := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: []corev1.Pod{*pod}}
	ns := &corev1.Namespace{TypeMeta: metav1.TypeMeta{Kind: "Namespace", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: "ns"}}
	podData := encodeProtobuf(t, pod)
	whole := protobufDecoder(t, scheme.Codecs.WithoutConversion())
	lean := protobufDecoder(t, LeanDecoding(scheme.Codecs.WithoutConversion()))
	for name, data := range map[string][]byte{
		"pod list":        encodeProtobuf(t, list),
		"namespace":       encodeProtobuf(t, ns),
		"JSON pod":        []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"},"spec":{"nodeName":"n"}}`),
		"truncated pod":   podData[:len(podData)-3],
		"magic only":      podData[:4],
		"garbage":         append(append([]byte{}, podData[:4]...), 0xff, 0xff, 0xff),
		"pod, v2 claimed": bytes.Replace(podData, []byte("\n\x02v1"), []byte("\n\x02v2"), 1),
	} {
		t.Run(name, func(t *testing.T) {
			if _, ok := podMessage(data); ok {
				t.Errorf("taken for a v1 Pod")
			}
			wantObj, wantErr := runtime.Decode(whole, data)
			gotObj, gotErr := runtime.Decode(lean, data)
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Fatalf("error %v, want %v", gotErr, wantErr)
			}
			if diff := cmp.Diff(wantObj, gotObj); diff != "" {
				t.Errorf("decoded differently (-whole,+lean):\n%s", diff)
			}
		})
	}
	t.Run("pod into an Unknown", func(t *testing.T) {
		info, _ := runtime.SerializerInfoForMediaType(LeanDecoding(scheme.Codecs.WithoutConversion()).SupportedMediaTypes(), runtime.ContentTypeProtobuf)
		var u runtime.Unknown
		if _, _, err := info.Serializer.Decode(podData, nil, &u); err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(u.Raw, []byte("node-1")) {
			t.Errorf("the Unknown's raw pod lost its spec")
		}
	})
	raw, ok := podMessage(podData)
	if !ok {
		t.Fatal("a protobuf v1 Pod not taken for one")
	}
	if got, ok := appendLeanPod(nil, raw); !ok || len(got) >= len(raw) {
		t.Errorf("a pod's message went from %d bytes to %d (%v), want fewer", len(raw), len(got), ok)
	}
}

// TestLeanDecodingDoesNotKeepItsBuffer: the decoded pod shares no bytes with
// the buffer its lean message was built in, which LeanDecoding reuses for
// the next pod.
func TestLeanDecodingDoesNotKeepItsBuffer(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	base := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	for i := range 500 {
		pod := generatePod(rng, i, base)
		raw, ok := podMessage(encodeProtobuf(t, pod))
		if !ok {
			t.Fatal("not taken for a v1 Pod")
		}
		lean, ok := appendLeanPod(nil, raw)
		if !ok {
			t.Fatal("did not parse")
		}
		var got corev1.Pod
		if err := got.Unmarshal(lean); err != nil {
			t.Fatal(err)
		}
		want := got.DeepCopy()
		for j := range lean {
			lean[j] = 'x'
		}
		if diff := cmp.Diff(want, &got); diff != "" {
			t.Fatalf("pod %d changed with the buffer (-before,+after):\n%s", i, diff)
		}
	}
}

// TestLeanDecodingOnAWatch: a pods client on LeanDecoding (as the pod
// informer's, setup.go) decodes the pods of a protobuf watch stream lean, and
// a GET whole is not what it is for but decodes too.
func TestLeanDecodingOnAWatch(t *testing.T) {
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "7"},
		Spec:       corev1.PodSpec{NodeName: "node-1", PriorityClassName: "high", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning}}
	podData := encodeProtobuf(t, pod)
	info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
		if r.URL.Query().Get("watch") != "true" {
			_, _ = w.Write(podData)
			return
		}
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
		enc := streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(w), info.StreamSerializer.Serializer)
		_ = enc.Encode(&metav1.WatchEvent{Type: "ADDED", Object: runtime.RawExtension{Raw: podData}})
		w.(http.Flusher).Flush()
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{
		GroupVersion: &corev1.SchemeGroupVersion, ContentType: runtime.ContentTypeProtobuf,
		AcceptContentTypes:   runtime.ContentTypeProtobuf,
		NegotiatedSerializer: LeanDecoding(rest.CodecFactoryForGeneratedClient(scheme.Scheme, scheme.Codecs).WithoutConversion()),
	}, APIPath: "/api"}
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pods := corev1client.New(rc).Pods("ns")
	w, err := pods.Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := <-w.ResultChan()
	got, ok := ev.Object.(*corev1.Pod)
	if !ok {
		t.Fatalf("watch event %v %T, want a Pod", ev.Type, ev.Object)
	}
	if diff := cmp.Diff(corev1.PodSpec{PriorityClassName: "high"}, got.Spec); diff != "" {
		t.Errorf("spec from the watch (-want,+got):\n%s", diff)
	}
	if got.Name != "p" || got.ResourceVersion != "7" || got.Status.Phase != corev1.PodRunning {
		t.Errorf("pod from the watch %s rv %s phase %s, want p, 7, Running", got.Name, got.ResourceVersion, got.Status.Phase)
	}
}
