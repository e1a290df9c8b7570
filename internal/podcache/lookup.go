package podcache

import (
	"iter"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/policy"
)

// NamespaceInfo is what the namespace cache knows of a namespace; nil when
// the namespace is not in it (not yet seen, or deleted), which policy.Decide
// takes as "not known" and leaves the namespace's pods alone.
func NamespaceInfo(namespaces cache.Indexer, name string) *policy.Namespace {
	obj, exists, err := namespaces.GetByKey(name)
	if err != nil || !exists {
		return nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil
	}
	return &policy.Namespace{Labels: m.GetLabels(), Annotations: m.GetAnnotations()}
}

// NamespaceTerminating reports whether the cached namespace has a deletion
// timestamp.
func NamespaceTerminating(namespaces cache.Indexer, name string) bool {
	obj, exists, err := namespaces.GetByKey(name)
	if err != nil || !exists {
		return false
	}
	m, err := meta.Accessor(obj)
	return err == nil && m.GetDeletionTimestamp() != nil
}

// Pods are the pods of the pod cache, for a wave.
func Pods(pods cache.Indexer) iter.Seq[*corev1.Pod] {
	return func(yield func(*corev1.Pod) bool) {
		for _, obj := range pods.List() {
			if pod, err := Pod(obj); err == nil && !yield(pod) {
				return
			}
		}
	}
}

// PodsOf are the cached pods of namespace (the cache's namespace index),
// for a wave.
func PodsOf(pods cache.Indexer, namespace string) iter.Seq[*corev1.Pod] {
	return func(yield func(*corev1.Pod) bool) {
		objs, err := pods.ByIndex(cache.NamespaceIndex, namespace)
		if err != nil {
			utilruntime.HandleError(err)
			return
		}
		for _, obj := range objs {
			if pod, err := Pod(obj); err == nil && !yield(pod) {
				return
			}
		}
	}
}
