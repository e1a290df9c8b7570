package policy

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// annotationValuesFile is the table that keeps the admission policy
// (charts/podjanitor/templates/admission-policy.yaml, a CEL copy of these
// parsers) and the Go parsers in agreement: this test runs it through Decide,
// test/e2e/admission_test.go through a real API server with the policy.
const annotationValuesFile = "testdata/annotation-values.yaml"

var updateAnnotationValues = flag.Bool("update-annotation-values", false, "rewrite the errors in "+annotationValuesFile+" from the parsers")

// AnnotationValue is one row: an annotation (name under the prefix), a
// value, and podjanitor's error for it ("" when it parses).
type AnnotationValue struct {
	Annotation string `json:"annotation"`
	Value      string `json:"value"`
	Error      string `json:"error"`
}

// AnnotationValueError is what Decide says about a pod that carries only
// this annotation: "" when it parses, else the InvalidAnnotation message.
func AnnotationValueError(annotation, value string) string {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: "p", Namespace: "default", CreationTimestamp: metav1.NewTime(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)),
		Annotations: map[string]string{DefaultAnnotationPrefix + "/" + annotation: value},
	}}
	if _, err := (&Evaluator{}).Decide(pod, &Namespace{}, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)); err != nil {
		return err.Error()
	}
	return ""
}

func TestAnnotationValuesTable(t *testing.T) {
	data, err := os.ReadFile(annotationValuesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rows []AnnotationValue
	if err := yaml.UnmarshalStrict(data, &rows); err != nil {
		t.Fatalf("%s: %v", annotationValuesFile, err)
	}
	valid, invalid := map[string]int{}, map[string]int{}
	changed := false
	for i, row := range rows {
		got := AnnotationValueError(row.Annotation, row.Value)
		if got != row.Error {
			changed = true
			if !*updateAnnotationValues {
				t.Errorf("%s row %d: %s=%q: error %q, table says %q", annotationValuesFile, i, row.Annotation, row.Value, got, row.Error)
			}
			rows[i].Error = got
		}
		if got == "" {
			valid[row.Annotation]++
		} else {
			invalid[row.Annotation]++
		}
	}
	for _, name := range []string{AnnotationKeep, AnnotationTTL, AnnotationExpiresAt, AnnotationTTLAfterFinished} {
		if valid[name] == 0 || invalid[name] == 0 {
			t.Errorf("the table needs valid and invalid values of %s: %d valid, %d invalid", name, valid[name], invalid[name])
		}
	}
	if *updateAnnotationValues && changed {
		writeAnnotationValues(t, data, rows)
	}
}

// writeAnnotationValues keeps the file's header comment and writes the rows,
// one JSON object (a YAML flow mapping) per line.
func writeAnnotationValues(t *testing.T, old []byte, rows []AnnotationValue) {
	t.Helper()
	var b bytes.Buffer
	for _, line := range strings.SplitAfter(string(old), "\n") {
		if !strings.HasPrefix(line, "#") {
			break
		}
		b.WriteString(line)
	}
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	for _, row := range rows {
		b.WriteString("- ")
		if err := enc.Encode(row); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(annotationValuesFile, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
