package main

import (
	"fmt"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// cachedPod is what the pod informer stores: a lean pod (see leanPod) packed
// to a few hundred bytes. The embedded ObjectMeta holds only name, namespace,
// uid, resourceVersion and the creation and deletion timestamps, which is all
// the informer itself reads. Labels, owner references and the priority class
// name are one protobuf message interned with unique.Make, so the pods of one
// workload share a single copy; the kept annotations and the status are a
// protobuf message of their own.
//
// A cachedPod is not a Pod: the controller reads it with podFromCache, never
// through a PodLister. It is immutable once stored.
type cachedPod struct {
	metav1.ObjectMeta
	workload unique.Handle[string] // corev1.Pod{ObjectMeta{Labels, OwnerReferences}, Spec{PriorityClassName}}, marshalled
	rest     string                // corev1.Pod{ObjectMeta{Annotations}, Status}, marshalled
}

var _ runtime.Object = &cachedPod{}

// packPod packs a lean pod. Protobuf keeps every field leanPod keeps (times
// in whole seconds, as the API server serves them), and sorts map keys, so
// equal label sets marshal to equal strings.
func packPod(lean *corev1.Pod) (*cachedPod, error) {
	workload, err := (&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Labels: lean.Labels, OwnerReferences: lean.OwnerReferences},
		Spec:       corev1.PodSpec{PriorityClassName: lean.Spec.PriorityClassName},
	}).Marshal()
	if err != nil {
		return nil, fmt.Errorf("packing pod %s/%s: %w", lean.Namespace, lean.Name, err)
	}
	rest, err := (&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: lean.Annotations}, Status: lean.Status}).Marshal()
	if err != nil {
		return nil, fmt.Errorf("packing pod %s/%s: %w", lean.Namespace, lean.Name, err)
	}
	meta := lean.ObjectMeta // what leanPod kept, less the packed fields
	meta.Labels, meta.Annotations, meta.OwnerReferences = nil, nil, nil
	return &cachedPod{ObjectMeta: meta, workload: unique.Make(string(workload)), rest: string(rest)}, nil
}

// Pod unpacks the lean pod. Each call returns a new Pod the caller may keep.
func (p *cachedPod) Pod() (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	if err := pod.Unmarshal([]byte(p.rest)); err != nil {
		return nil, fmt.Errorf("unpacking cached pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	var workload corev1.Pod
	if err := workload.Unmarshal([]byte(p.workload.Value())); err != nil {
		return nil, fmt.Errorf("unpacking cached pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	annotations := pod.Annotations
	pod.ObjectMeta = *p.ObjectMeta.DeepCopy()
	pod.Labels, pod.Annotations, pod.OwnerReferences = workload.Labels, annotations, workload.OwnerReferences
	pod.Spec.PriorityClassName = workload.Spec.PriorityClassName
	return pod, nil
}

// GetObjectKind and DeepCopyObject make a cachedPod a runtime.Object, as the
// informer's mutation detector expects of what it stores.
func (p *cachedPod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (p *cachedPod) DeepCopyObject() runtime.Object {
	c := *p
	c.ObjectMeta = *p.ObjectMeta.DeepCopy()
	return &c
}

// podFromCache returns the pod for an object of the pod informer's store: a
// cachedPod, or a *corev1.Pod when the informer has no transform.
func podFromCache(obj interface{}) (*corev1.Pod, error) {
	switch o := obj.(type) {
	case *cachedPod:
		return o.Pod()
	case *corev1.Pod:
		return o, nil
	case cache.DeletedFinalStateUnknown:
		return podFromCache(o.Obj)
	}
	return nil, fmt.Errorf("unexpected object of type %T in the pod cache", obj)
}

// GetLabels, GetAnnotations and GetOwnerReferences unpack the packed fields,
// so that a cachedPod answers metav1.Object's getters truthfully. (Its setters
// are ObjectMeta's: a cachedPod is never changed once stored.)
func (p *cachedPod) GetLabels() map[string]string { return p.unpacked().Labels }

func (p *cachedPod) GetAnnotations() map[string]string { return p.unpacked().Annotations }

func (p *cachedPod) GetOwnerReferences() []metav1.OwnerReference {
	return p.unpacked().OwnerReferences
}

func (p *cachedPod) unpacked() *corev1.Pod {
	pod, err := p.Pod()
	if err != nil { // cannot happen: packPod marshalled what Pod unmarshals
		return &corev1.Pod{}
	}
	return pod
}
