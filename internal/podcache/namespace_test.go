package podcache

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNamespaceTransformKeepsLabelsAndKeep proves that the namespace cache
// holds labels and the keep annotation under the configured prefix, nothing else.
func TestNamespaceTransformKeepsLabelsAndKeep(t *testing.T) {
	full := &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: "ci", UID: "u", ResourceVersion: "5", Labels: map[string]string{"team": "ci"},
			Annotations: map[string]string{"janitor.example.com/keep": "true", "podjanitor.io/keep": "true", "other": "x"},
			Finalizers:  []string{"kubernetes"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
	}
	got, err := NamespaceTransform("janitor.example.com/keep")(full)
	if err != nil {
		t.Fatal(err)
	}
	want := &metav1.PartialObjectMetadata{
		TypeMeta: full.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: "ci", UID: "u", ResourceVersion: "5", Labels: map[string]string{"team": "ci"},
			Annotations: map[string]string{"janitor.example.com/keep": "true"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("transformed namespace (-want,+got):\n%s", diff)
	}
}
