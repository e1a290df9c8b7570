// Package podcache owns what the informers' caches hold: the lean pod
// (PodTransform: only the fields the policy reads, packed to a few hundred
// bytes, its status time kept across writes that change none of the times it
// counts from) and the lean namespace (NamespaceTransform: labels and the keep
// annotation).
//
// It promises that a decision on what Pod reads back from the cache equals
// the decision on the full pod (TestLeanPodKeepsDecisions), and that what the
// cache stores is never changed once stored: a cached pod's setters panic.
package podcache

import (
	"fmt"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// cachedPod is what the pod informer stores: a lean pod (see leanPod) packed
// to a few hundred bytes. It keeps in fields only what the informer reads of
// every pod: the key (namespace/name) and the resourceVersion. Labels, owner
// references, the priority class name and the scheduling group are one
// protobuf message interned with unique.Make, so the pods of one workload
// share a single copy; the uid,
// the creation and deletion timestamps, the kept annotations, the one
// managedFields entry (the status write's time) and the status are a protobuf
// message of their own.
//
// A cachedPod is not a Pod: the controller reads it with Pod, never
// through a PodLister. It is immutable once stored: its metav1.Object getters
// answer as the pod would, its setters panic.
type cachedPod struct {
	key             string // namespace/name
	slash           int    // index of the '/' in key
	resourceVersion string
	workload        unique.Handle[string] // corev1.Pod{ObjectMeta{Labels, OwnerReferences}, Spec{PriorityClassName, SchedulingGroup}}, marshalled
	rest            string                // corev1.Pod{ObjectMeta{UID, CreationTimestamp, DeletionTimestamp, Annotations, ManagedFields}, Status}, marshalled
}

var (
	_ runtime.Object = &cachedPod{}
	_ metav1.Object  = &cachedPod{}
)

// packPod packs a lean pod. Protobuf keeps every field leanPod keeps (times
// in whole seconds, as the API server serves them), and sorts map keys, so
// equal label sets marshal to equal strings.
func packPod(lean *corev1.Pod) (*cachedPod, error) {
	workload, err := (&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Labels: lean.Labels, OwnerReferences: lean.OwnerReferences},
		Spec:       corev1.PodSpec{PriorityClassName: lean.Spec.PriorityClassName, SchedulingGroup: lean.Spec.SchedulingGroup},
	}).Marshal()
	if err != nil {
		return nil, fmt.Errorf("packing pod %s/%s: %w", lean.Namespace, lean.Name, err)
	}
	rest, err := (&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			UID:               lean.UID,
			CreationTimestamp: lean.CreationTimestamp,
			DeletionTimestamp: lean.DeletionTimestamp,
			Annotations:       lean.Annotations,
			ManagedFields:     lean.ManagedFields,
		},
		Status: lean.Status,
	}).Marshal()
	if err != nil {
		return nil, fmt.Errorf("packing pod %s/%s: %w", lean.Namespace, lean.Name, err)
	}
	return &cachedPod{
		key:             lean.Namespace + "/" + lean.Name,
		slash:           len(lean.Namespace),
		resourceVersion: lean.ResourceVersion,
		workload:        unique.Make(string(workload)),
		rest:            string(rest),
	}, nil
}

// Pod unpacks the lean pod. Each call returns a new Pod the caller may keep.
func (p *cachedPod) Pod() (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	if err := pod.Unmarshal([]byte(p.rest)); err != nil {
		return nil, fmt.Errorf("unpacking cached pod %s: %w", p.key, err)
	}
	var workload corev1.Pod
	if err := workload.Unmarshal([]byte(p.workload.Value())); err != nil {
		return nil, fmt.Errorf("unpacking cached pod %s: %w", p.key, err)
	}
	pod.Namespace, pod.Name, pod.ResourceVersion = p.GetNamespace(), p.GetName(), p.resourceVersion
	pod.Labels, pod.OwnerReferences = workload.Labels, workload.OwnerReferences
	pod.Spec.PriorityClassName, pod.Spec.SchedulingGroup = workload.Spec.PriorityClassName, workload.Spec.SchedulingGroup
	return pod, nil
}

// GetObjectKind and DeepCopyObject make a cachedPod a runtime.Object, as the
// informer's mutation detector expects of what it stores.
func (p *cachedPod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (p *cachedPod) DeepCopyObject() runtime.Object {
	c := *p
	return &c
}

// Pod returns the pod for an object of the pod informer's store: a
// cachedPod, or a *corev1.Pod when the informer has no transform.
func Pod(obj interface{}) (*corev1.Pod, error) {
	switch o := obj.(type) {
	case *cachedPod:
		return o.Pod()
	case *corev1.Pod:
		return o, nil
	case cache.DeletedFinalStateUnknown:
		return Pod(o.Obj)
	}
	return nil, fmt.Errorf("unexpected object of type %T in the pod cache", obj)
}

// metav1.Object: the namespace, name and resourceVersion are read from
// fields, as the informer reads them of every pod; the rest unpacks the pod.
// Nothing the pod cache keeps has a generateName, generation, selfLink or
// finalizers, so those are empty; its one managedFields entry is read with Pod.

func (p *cachedPod) GetNamespace() string         { return p.key[:p.slash] }
func (p *cachedPod) GetName() string              { return p.key[p.slash+1:] }
func (p *cachedPod) GetResourceVersion() string   { return p.resourceVersion }
func (p *cachedPod) GetUID() types.UID            { return p.unpacked().UID }
func (p *cachedPod) GetLabels() map[string]string { return p.unpacked().Labels }
func (p *cachedPod) GetAnnotations() map[string]string {
	return p.unpacked().Annotations
}
func (p *cachedPod) GetOwnerReferences() []metav1.OwnerReference {
	return p.unpacked().OwnerReferences
}
func (p *cachedPod) GetCreationTimestamp() metav1.Time { return p.unpacked().CreationTimestamp }
func (p *cachedPod) GetDeletionTimestamp() *metav1.Time {
	return p.unpacked().DeletionTimestamp
}
func (p *cachedPod) GetDeletionGracePeriodSeconds() *int64 { return nil }
func (p *cachedPod) GetGenerateName() string               { return "" }
func (p *cachedPod) GetGeneration() int64                  { return 0 }
func (p *cachedPod) GetSelfLink() string                   { return "" }
func (p *cachedPod) GetFinalizers() []string               { return nil }
func (p *cachedPod) GetManagedFields() []metav1.ManagedFieldsEntry {
	return nil
}

// The setters panic: a cachedPod is shared by the informer's readers and is
// never changed once stored.

func (p *cachedPod) SetNamespace(string)                          { p.immutable() }
func (p *cachedPod) SetName(string)                               { p.immutable() }
func (p *cachedPod) SetGenerateName(string)                       { p.immutable() }
func (p *cachedPod) SetUID(types.UID)                             { p.immutable() }
func (p *cachedPod) SetResourceVersion(string)                    { p.immutable() }
func (p *cachedPod) SetGeneration(int64)                          { p.immutable() }
func (p *cachedPod) SetSelfLink(string)                           { p.immutable() }
func (p *cachedPod) SetCreationTimestamp(metav1.Time)             { p.immutable() }
func (p *cachedPod) SetDeletionTimestamp(*metav1.Time)            { p.immutable() }
func (p *cachedPod) SetDeletionGracePeriodSeconds(*int64)         { p.immutable() }
func (p *cachedPod) SetLabels(map[string]string)                  { p.immutable() }
func (p *cachedPod) SetAnnotations(map[string]string)             { p.immutable() }
func (p *cachedPod) SetFinalizers([]string)                       { p.immutable() }
func (p *cachedPod) SetOwnerReferences([]metav1.OwnerReference)   { p.immutable() }
func (p *cachedPod) SetManagedFields([]metav1.ManagedFieldsEntry) { p.immutable() }

func (p *cachedPod) immutable() { panic("cached pod " + p.key + " is immutable") }

func (p *cachedPod) unpacked() *corev1.Pod {
	pod, err := p.Pod()
	if err != nil { // cannot happen: packPod marshalled what Pod unmarshals
		return &corev1.Pod{}
	}
	return pod
}
