package main

import (
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/policy"
)

// namespaceTransform returns the namespace informer's transform: of each
// namespace's metadata, only what decisions read (labels for rules'
// namespaceSelector, the keep annotation) and what the informer needs.
func namespaceTransform(keepKey string) cache.TransformFunc {
	return func(obj interface{}) (interface{}, error) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return obj, nil // a tombstone
		}
		lean := &metav1.PartialObjectMetadata{
			TypeMeta: m.TypeMeta,
			ObjectMeta: metav1.ObjectMeta{
				Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion, Labels: m.Labels,
			},
		}
		if value, ok := m.Annotations[keepKey]; ok {
			lean.Annotations = map[string]string{keepKey: value}
		}
		return lean, nil
	}
}

// namespaceInfo is what the namespace cache knows of a namespace; nil when
// the namespace is not in it (not yet seen, or deleted), which policy.Decide
// takes as "not known" and leaves the namespace's pods alone.
func namespaceInfo(namespaces cache.Indexer, name string) *policy.Namespace {
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

// namespaceEventHandler decides a namespace's pods again when what decisions
// read of it changes: its labels or keep annotation, or its arrival after
// the initial list (its pods, seen first, were left alone until then). The
// initial list enqueues nothing: every cached pod is queued already, and
// workers start only once both caches have synced.
func (c *Controller) namespaceEventHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj interface{}, isInInitialList bool) {
			if !isInInitialList {
				c.enqueueNamespacePods(obj)
			}
		},
		UpdateFunc: func(old, cur interface{}) {
			oldMeta, err1 := meta.Accessor(old)
			curMeta, err2 := meta.Accessor(cur)
			if err1 != nil || err2 != nil ||
				!maps.Equal(oldMeta.GetLabels(), curMeta.GetLabels()) ||
				!maps.Equal(oldMeta.GetAnnotations(), curMeta.GetAnnotations()) {
				c.enqueueNamespacePods(cur)
			}
		},
	}
}

// enqueueNamespacePods adds the key of every cached pod of a namespace. It
// looks through every key (the pod cache keeps no namespace index, which
// would cost a map entry per pod for what changes rarely: a namespace's
// labels or keep annotation).
func (c *Controller) enqueueNamespacePods(obj interface{}) {
	m, err := meta.Accessor(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	prefix := m.GetName() + "/"
	for _, key := range c.pods.ListKeys() {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		name, err := cache.ParseObjectName(key)
		if err != nil {
			utilruntime.HandleError(err)
			continue
		}
		c.queue.Add(name)
	}
}
