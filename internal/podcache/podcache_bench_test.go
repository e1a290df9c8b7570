package podcache

import (
	"bytes"
	"encoding/json"
	"fmt"
	goruntime "runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/internal/workload"
)

// BenchmarkCacheMemory measures the live heap that the pod informer's store
// holds per cached pod (the B/pod metric), for the load benchmark's idle pods:
// realistic workload pods, bound and Running, each with its own expires-at.
// Each pod is decoded from its own JSON, as from a watch, so that nothing is
// shared that the API server would not share. Variants: the full pod as
// decoded, the lean *corev1.Pod that the transform keeps, and the packed
// cachedPod that the informer stores (without a namespace index, as
// informerFactory's pod informer). Run it with
//
//	go test -run '^$' -bench CacheMemory -benchtime 1x .
func BenchmarkCacheMemory(b *testing.B) {
	const n = 10000
	raw := make([][]byte, n)
	far := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := range raw {
		pod := workload.Pod("bench-idle", fmt.Sprintf("idle-%06d", i), "idle", i, far.Add(time.Duration(i)*time.Second), "kwok-node-0")
		pod.UID = types.UID(fmt.Sprintf("0b6f1d4e-3c2a-4f7e-9d1b-%012d", i))
		pod.ResourceVersion = fmt.Sprint(100000 + i)
		pod.CreationTimestamp = metav1.NewTime(far.Add(-24 * time.Hour))
		pod.Status = workload.RunningStatus(pod, far.Add(-24*time.Hour), i)
		pod.ManagedFields = benchManagedFields(far.Add(-24*time.Hour + time.Duration(i)*time.Millisecond))
		var err error
		if raw[i], err = json.Marshal(pod); err != nil {
			b.Fatal(err)
		}
	}
	variants := []struct {
		name      string
		transform cache.TransformFunc
	}{
		{"full", nil},
		{"lean-pod", func(obj any) (any, error) { return leanPod(obj.(*corev1.Pod), "podjanitor.io/"), nil }},
		{"cached-pod", PodTransform("podjanitor.io")},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			var perPod float64
			for b.Loop() {
				var before, after goruntime.MemStats
				goruntime.GC()
				goruntime.ReadMemStats(&before)
				store := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{}) // as informerFactory's
				for _, data := range raw {
					var obj any = &corev1.Pod{}
					if err := json.Unmarshal(data, obj); err != nil {
						b.Fatal(err)
					}
					if v.transform != nil {
						var err error
						if obj, err = v.transform(obj); err != nil {
							b.Fatal(err)
						}
					}
					if err := store.Add(obj); err != nil {
						b.Fatal(err)
					}
				}
				goruntime.GC()
				goruntime.ReadMemStats(&after)
				if len(store.ListKeys()) != n {
					b.Fatal("store lost pods")
				}
				perPod = float64(after.HeapAlloc-before.HeapAlloc) / n
				goruntime.KeepAlive(store)
			}
			b.ReportMetric(perPod, "B/pod")
		})
	}
}

// benchManagedFields are the managedFields of a workload pod: its
// controller's create and the kubelet's status writes (the policy keeps the
// latest status time, see leanManagedFields).
func benchManagedFields(at time.Time) []metav1.ManagedFieldsEntry {
	t := metav1.NewTime(at.Truncate(time.Second))
	return []metav1.ManagedFieldsEntry{
		{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &t, FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{".":{},"f:podjanitor.io/expires-at":{}},"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"x\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:image":{},"f:name":{},"f:resources":{}}},"f:dnsPolicy":{},"f:restartPolicy":{}}}`)}},
		{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &t, Subresource: "status", FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}}},"f:containerStatuses":{},"f:hostIP":{},"f:phase":{},"f:podIP":{},"f:startTime":{}}}`)}},
	}
}

// BenchmarkCachedPodUnpack is the cost of reading a pod from the cache, paid
// once per sync of the pod.
func BenchmarkCachedPodUnpack(b *testing.B) {
	far := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	pod := workload.Pod("bench-idle", "idle-000001", "idle", 1, far, "kwok-node-0")
	pod.Status = workload.RunningStatus(pod, far.Add(-time.Hour), 1)
	obj, err := PodTransform("podjanitor.io")(pod)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Pod(obj); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPodDecode is what the pod informer spends on each pod it is sent
// in protobuf, from bytes to the cached pod: whole, as client-go's decoder
// decodes it, and lean (LeanDecoding). Run it with
//
//	go test -run '^$' -bench PodDecode -benchmem ./internal/podcache/
func BenchmarkPodDecode(b *testing.B) {
	far := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	pod := workload.Pod("bench-idle", "idle-000001", "idle", 1, far, "kwok-node-0")
	pod.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
	pod.UID = "0b6f1d4e-3c2a-4f7e-9d1b-000000000001"
	pod.ResourceVersion = "100001"
	pod.CreationTimestamp = metav1.NewTime(far.Add(-24 * time.Hour))
	pod.Status = workload.RunningStatus(pod, far.Add(-24*time.Hour), 1)
	pod.ManagedFields = benchManagedFields(far.Add(-24 * time.Hour))
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(pod, &buf); err != nil {
		b.Fatal(err)
	}
	transform := PodTransform("podjanitor.io")
	for name, ns := range map[string]runtime.NegotiatedSerializer{
		"whole": scheme.Codecs.WithoutConversion(),
		"lean":  LeanDecoding(scheme.Codecs.WithoutConversion()),
	} {
		b.Run(name, func(b *testing.B) {
			info, _ := runtime.SerializerInfoForMediaType(ns.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
			dec := ns.DecoderToVersion(info.Serializer, corev1.SchemeGroupVersion)
			b.ReportAllocs()
			for b.Loop() {
				obj, err := runtime.Decode(dec, buf.Bytes())
				if err != nil {
					b.Fatal(err)
				}
				if _, err := transform(obj); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
