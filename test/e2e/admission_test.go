//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/podjanitor/podjanitor/policy"
)

// The admission policy of artifacts/admission (the chart's, rendered) on the
// real API server, bound to this test's namespace only: other tests create
// pods with bad annotations on purpose.
const (
	admissionFile   = "../../artifacts/admission/validatingadmissionpolicy.yaml"
	annotationTable = "../../policy/testdata/annotation-values.yaml"
	admissionLabel  = "e2e.podjanitor.io/admission"
)

// goError is podjanitor's own verdict on a pod with these annotations: ""
// when they parse, else the message of its InvalidAnnotation warning (after
// "Not removing pod: "). Keep vetoes a pod without reading the others; the
// admission policy checks every annotation, so keep is only combined with
// values that parse.
func goError(annotations map[string]string) string {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default",
		CreationTimestamp: metav1.Now(), Annotations: annotations}}
	if _, err := (&policy.Evaluator{}).Decide(pod, &policy.Namespace{}, time.Now()); err != nil {
		return err.Error()
	}
	return ""
}

// admission installs the policy with a binding limited to a new namespace
// and returns that namespace once the policy refuses a bad value there.
func admission(t *testing.T) string {
	t.Helper()
	ctx := ctxFor(t)
	ns := newNamespace(t)
	run := ns // unique per test
	if _, err := client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, admissionLabel, run), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	docs, err := deployDocuments(admissionFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != 2 {
		t.Fatalf("%s: %d objects, want a policy and a binding", admissionFile, len(docs))
	}
	var vap admissionv1.ValidatingAdmissionPolicy
	var binding admissionv1.ValidatingAdmissionPolicyBinding
	if err := rbacStrictJSON(docs[0], &vap); err != nil {
		t.Fatalf("%s: policy: %v", admissionFile, err)
	}
	if err := rbacStrictJSON(docs[1], &binding); err != nil {
		t.Fatalf("%s: binding: %v", admissionFile, err)
	}
	if binding.Spec.PolicyName != vap.Name {
		t.Fatalf("the binding names policy %q, not %q", binding.Spec.PolicyName, vap.Name)
	}
	vap.Name = "e2e-" + run
	binding.Name, binding.Spec.PolicyName = vap.Name, vap.Name
	binding.Spec.MatchResources = &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
		MatchLabels: map[string]string{admissionLabel: run}}}

	policies := client.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	bindings := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if _, err := policies.Create(ctx, &vap, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the ValidatingAdmissionPolicy: %v", err)
	}
	t.Cleanup(func() { _ = policies.Delete(context.Background(), vap.Name, metav1.DeleteOptions{}) })
	if _, err := bindings.Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the binding: %v", err)
	}
	t.Cleanup(func() { _ = bindings.Delete(context.Background(), binding.Name, metav1.DeleteOptions{}) })

	// The API server type-checks the expressions in the background and
	// reports what it finds in the policy's status.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := policies.Get(ctx, vap.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.TypeChecking == nil || p.Status.ObservedGeneration != p.Generation {
			return false, nil
		}
		for _, w := range p.Status.TypeChecking.ExpressionWarnings {
			t.Errorf("type checking %s: %s", w.FieldRef, w.Warning)
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the policy was never type-checked: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return createDryRun(ctx, ns, map[string]string{prefix + "ttl": "3x"}) != nil, nil
	})
	if err != nil {
		t.Fatal("the admission policy never refused ttl=3x")
	}
	return ns
}

// createDryRun asks the API server to create a pod with the annotations,
// without storing it, and returns its refusal.
func createDryRun(ctx context.Context, ns string, annotations map[string]string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "admission-", Namespace: ns, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "fake-image"}}},
	}
	_, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// checkAdmission wants the pod admitted when want is "", else refused by the
// policy with the message want.
func checkAdmission(t *testing.T, ctx context.Context, ns string, annotations map[string]string, want string) {
	t.Helper()
	err := createDryRun(ctx, ns, annotations)
	switch {
	case want == "" && err != nil:
		t.Errorf("%q: refused (%v); podjanitor accepts it", annotations, err)
	case want != "" && err == nil:
		t.Errorf("%q: admitted; podjanitor says %s", annotations, want)
	case want != "" && (!apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.HasSuffix(err.Error(), "denied request: "+want)):
		t.Errorf("%q: refused with\n  %v\nwant the message\n  %s", annotations, err, want)
	}
}

// TestAdmissionPolicyTable: every value of policy/testdata/annotation-values.yaml
// is admitted when podjanitor's parser accepts it, and refused with the
// parser's message when not.
func TestAdmissionPolicyTable(t *testing.T) {
	t.Parallel()
	ns := admission(t)
	ctx := ctxFor(t)
	data, err := os.ReadFile(annotationTable)
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Annotation, Value, Error string
	}
	if err := yaml.Unmarshal(data, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 50 {
		t.Fatalf("%s has only %d rows", annotationTable, len(rows))
	}
	for _, row := range rows {
		annotations := map[string]string{prefix + row.Annotation: row.Value}
		if got := goError(annotations); got != row.Error {
			t.Errorf("the table is stale: %s=%q: podjanitor says %q, the table %q", row.Annotation, row.Value, got, row.Error)
		}
		checkAdmission(t, ctx, ns, annotations, row.Error)
	}

	// Several annotations: the first that does not parse, in podjanitor's order.
	for _, annotations := range []map[string]string{
		{prefix + "keep": "yes", prefix + "ttl": "3x"},
		{prefix + "ttl": "1h", prefix + "ttl-after-finished": "2 days"},
		{prefix + "ttl": "3x", prefix + "expires-at": "tomorrow", prefix + "ttl-after-finished": "1x"},
		{prefix + "expires-at": "tomorrow", prefix + "ttl-after-finished": "1x"},
		{prefix + "keep": "true", prefix + "ttl": "1h", prefix + "expires-at": "2026-12-01", prefix + "ttl-after-finished": "1d"},
		{"other.example.com/ttl": "3x", "e2e.podjanitor.io/ttl": "3x", prefix + "ttl": "1h"}, // other prefixes
		// Every key under the prefix is podjanitor's: another one is refused,
		// before any value, the first in byte order.
		{prefix + "owner": "team-a"},
		{prefix + "keeps": "true", prefix + "ttl": "3x"},
		{prefix + "Keep": "true", prefix + "keep": "true"},
		{prefix + "zz": "", prefix + "TTL": "1h", prefix + "max-age": "1d"},
		{prefix + "ttl_after_finished": "1h", prefix + "ttl-after-finished": "1x"},
	} {
		checkAdmission(t, ctx, ns, annotations, goError(annotations))
	}
}

// generatedValues are values built from the pieces the parsers care about,
// the same for every run.
func generatedValues() map[string][]string {
	r := rand.New(rand.NewPCG(13, 2026))
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	durationPieces := []string{"0", "1", "9", "12", "00", "5", ".", ".5", "1.", "+", "-", "h", "m", "s", "ms", "us", "µs", "μs", "ns",
		"d", "w", "x", " ", "H", "15250w", "9223372036854775807", "99999999999999999999", "e", "mh", "hm", "\t", "\"", ",", "١"}
	numbers := []string{"0", "1", "12", "1.5", ".5", "1.", "007", "2562047", "15250", "9223372036854775807", "1.000000000000000000001"}
	units := []string{"h", "m", "s", "ms", "us", "µs", "ns", "d", "w"}
	var durations []string
	for i := range 400 {
		var b strings.Builder
		for range 1 + r.IntN(4) {
			if i%2 == 0 { // mostly well-formed terms
				b.WriteString(pick(numbers) + pick(units))
			} else {
				b.WriteString(pick(durationPieces))
			}
		}
		durations = append(durations, b.String())
	}
	var times []string
	for range 300 {
		s := pick([]string{"2026", "0000", "1900", "1969", "1970", "2000", "2024", "9999", "26", "+2026"}) + "-" +
			pick([]string{"01", "02", "12", "13", "00", "1"}) + "-" +
			pick([]string{"01", "28", "29", "30", "31", "32", "00", "1"})
		if r.IntN(4) > 0 {
			s += pick([]string{"T", "t", " "}) + pick([]string{"0", "9", "09", "23", "24", "100"}) + ":" +
				pick([]string{"00", "59", "60", "5"}) + ":" + pick([]string{"00", "59", "60"}) +
				pick([]string{"", "", ".5", ",123", ".", ".123456789123"}) +
				pick([]string{"Z", "Z", "+01:00", "-23:59", "+24:00", "+25:00", "+01:60", "+01:61", "+0100", "", "z", "Zx"})
		} else if r.IntN(2) == 0 {
			s = pick([]string{"2026-11-30", "2024-02-29", "2026-12-01T10:00:00Z", "2026-12-01T09:30:00.5+05:30"})
		}
		times = append(times, s)
	}
	return map[string][]string{
		"ttl": durations, "ttl-after-finished": durations[:50], "expires-at": times,
		"keep": {"true", "false", "TRUE", "yes", "", " true", "true "},
	}
}

// generatedNames are names under the prefix built from podjanitor's names
// and the typos the hint looks for (case, '-', '_', '.', a trailing 's'),
// and other words, the same for every run; all are valid annotation names.
func generatedNames() []string {
	r := rand.New(rand.NewPCG(21, 2026))
	words := [][]string{{"keep"}, {"ttl"}, {"expires", "at"}, {"ttl", "after", "finished"}, {"expire", "at"}, {"ttl", "after", "finish"},
		{"owner"}, {"max", "age"}, {"k"}, {"s"}, {"keep", "s"}}
	seps := []string{"-", "_", ".", ""}
	var names []string
	for range 150 {
		w := words[r.IntN(len(words))]
		sep := seps[r.IntN(len(seps))]
		var b strings.Builder
		for i, part := range w {
			if i > 0 {
				b.WriteString(sep)
			}
			switch r.IntN(4) {
			case 0:
				part = strings.ToUpper(part)
			case 1:
				part = strings.ToUpper(part[:1]) + part[1:]
			}
			b.WriteString(part)
		}
		if r.IntN(3) == 0 {
			b.WriteString([]string{"s", "S", "2", "x"}[r.IntN(4)])
		}
		names = append(names, b.String())
	}
	return names
}

// TestAdmissionPolicyAgreesWithParser: on values built from the pieces the
// parsers care about, the API server's verdict and message equal podjanitor's.
func TestAdmissionPolicyAgreesWithParser(t *testing.T) {
	t.Parallel()
	ns := admission(t)
	ctx := ctxFor(t)
	type job struct{ annotations map[string]string }
	jobs := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	checked, refused := 0, 0
	for range 8 {
		wg.Go(func() {
			for j := range jobs {
				want := goError(j.annotations)
				checkAdmission(t, ctx, ns, j.annotations, want)
				mu.Lock()
				checked++
				if want != "" {
					refused++
				}
				mu.Unlock()
			}
		})
	}
	for name, values := range generatedValues() {
		for _, v := range values {
			jobs <- job{map[string]string{prefix + name: v}}
		}
	}
	names := generatedNames()
	for i, name := range names {
		jobs <- job{map[string]string{prefix + name: "true"}}
		jobs <- job{map[string]string{prefix + name: "true", prefix + names[(i+1)%len(names)]: "1h"}}
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d values checked, %d of them refused", checked, refused)
	if refused == 0 || refused == checked {
		t.Errorf("%d of %d values refused: the generated values do not exercise both outcomes", refused, checked)
	}
}

// TestAdmissionPolicyUpdates: an update that leaves a bad value alone (a
// label, a finalizer) is admitted, one that sets a bad value is refused.
func TestAdmissionPolicyUpdates(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t)
	// The pod predates the policy: created in a namespace the binding does
	// not select yet.
	ns := newNamespace(t)
	pod := createPod(t, ns, "old-bad-value", annotate(prefix+"ttl", "3x", prefix+"keeps", "true"))
	bound := admission(t)
	if _, err := client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, admissionLabel, bound), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return createDryRun(ctx, ns, map[string]string{prefix + "ttl": "3x"}) != nil, nil
	}); err != nil {
		t.Fatal("the policy never applied to the namespace")
	}

	patch := func(body string) error {
		_, err := client.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}
	if err := patch(`{"metadata":{"labels":{"team":"a"}}}`); err != nil {
		t.Errorf("a label update on a pod whose old ttl does not parse and old key is unknown was refused: %v", err)
	}
	if err := patch(`{"metadata":{"annotations":{"podjanitor.io/Keep":"true"}}}`); err == nil || !strings.Contains(err.Error(), "unknown annotation") {
		t.Errorf("adding the key podjanitor.io/Keep: err = %v, want a refusal for an unknown annotation", err)
	}
	want := goError(map[string]string{prefix + "ttl": "4x"})
	if err := patch(`{"metadata":{"annotations":{"podjanitor.io/ttl":"4x"}}}`); err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("setting ttl=4x: err = %v, want the message %s", err, want)
	}
	if err := patch(`{"metadata":{"annotations":{"podjanitor.io/ttl":"1h","podjanitor.io/keep":"true","podjanitor.io/keeps":null}}}`); err != nil {
		t.Errorf("setting values that parse was refused: %v", err)
	}
	if err := patch(`{"metadata":{"annotations":{"podjanitor.io/keep":"maybe"}}}`); err == nil {
		t.Error("setting keep=maybe was admitted")
	}
}
