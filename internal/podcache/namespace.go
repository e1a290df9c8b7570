package podcache

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/podjanitor/podjanitor/policy"
)

// ApproveWaveAnnotation approves a namespace's held change; a value longer
// than policy.MaxApproveWave is no change ID and is not kept.
const ApproveWaveAnnotation = policy.ApproveWaveAnnotation

// NamespaceTransform returns the namespace informer's transform: of each
// namespace's metadata, only what decisions read (labels for rules'
// namespaceSelector, the keep annotation), the approval of a held change of
// them, its deletion timestamp (a namespace being deleted holds no tenant
// policy's deletion), and what the informer needs.
func NamespaceTransform(keepKey string) cache.TransformFunc {
	return func(obj interface{}) (interface{}, error) {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return obj, nil // a tombstone
		}
		lean := &metav1.PartialObjectMetadata{
			TypeMeta: m.TypeMeta,
			ObjectMeta: metav1.ObjectMeta{
				Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion, Labels: m.Labels,
				DeletionTimestamp: m.DeletionTimestamp,
			},
		}
		if value, ok := m.Annotations[keepKey]; ok {
			lean.Annotations = map[string]string{keepKey: value}
		}
		if value, ok := m.Annotations[ApproveWaveAnnotation]; ok && len(value) <= policy.MaxApproveWave {
			if lean.Annotations == nil {
				lean.Annotations = map[string]string{}
			}
			lean.Annotations[ApproveWaveAnnotation] = value
		}
		return lean, nil
	}
}
