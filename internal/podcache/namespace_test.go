package podcache

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podjanitor/podjanitor/policy"
)

// TestNamespaceTransformKeepsLabelsAndKeep proves that the namespace cache
// holds labels, the keep annotation under the configured prefix and the
// deletion timestamp, nothing else.
func TestNamespaceTransformKeepsLabelsAndKeep(t *testing.T) {
	deleted := metav1.Now()
	full := &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: "ci", UID: "u", ResourceVersion: "5", Labels: map[string]string{"team": "ci"},
			Annotations: map[string]string{"janitor.example.com/keep": "true", "podjanitor.io/keep": "true", "other": "x"},
			Finalizers:  []string{"kubernetes"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}, DeletionTimestamp: &deleted},
	}
	got, err := NamespaceTransform("janitor.example.com/keep")(full)
	if err != nil {
		t.Fatal(err)
	}
	want := &metav1.PartialObjectMetadata{
		TypeMeta: full.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: "ci", UID: "u", ResourceVersion: "5", Labels: map[string]string{"team": "ci"},
			Annotations: map[string]string{"janitor.example.com/keep": "true"}, DeletionTimestamp: &deleted},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("transformed namespace (-want,+got):\n%s", diff)
	}
}

// TestNamespaceTransformKeepsTheApproval: the approval of a held change of
// the namespace is kept, a value longer than a change ID is not.
func TestNamespaceTransformKeepsTheApproval(t *testing.T) {
	for value, kept := range map[string]bool{"0123456789ab": true, string(make([]byte, policy.MaxApproveWave+1)): false} {
		full := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "ci", Annotations: map[string]string{ApproveWaveAnnotation: value}}}
		got, err := NamespaceTransform("podjanitor.io/keep")(full)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := got.(*metav1.PartialObjectMetadata).Annotations[ApproveWaveAnnotation]; ok != kept {
			t.Errorf("approval of %d bytes kept %v, want %v", len(value), ok, kept)
		}
	}
}
