//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned"
	"github.com/podjanitor/podjanitor/policy"
)

// The CRD of the PodLifetimePolicy resource (hack/crdgen writes it).
const crdFile = "../../artifacts/crd/podjanitor.io_podlifetimepolicies.yaml"

var (
	policiesGVR = v1alpha1.SchemeGroupVersion.WithResource("podlifetimepolicies")
	crdGVR      = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crdOnce     sync.Once
	crdErr      error
)

// dynamicClient is a dynamic client with the admin kubeconfig.
func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	return dynamic.NewForConfigOrDie(cfg)
}

// installCRD creates or updates the CRD of artifacts/crd, once per run, and
// waits until the API server serves the resource. It stays installed: other
// tests (and other runs on a shared cluster) use the same one.
func installCRD(t *testing.T) {
	t.Helper()
	crdOnce.Do(func() { crdErr = applyCRD(ctxFor(t), dynamicClient(t)) })
	if crdErr != nil {
		t.Fatalf("installing %s: %v", crdFile, crdErr)
	}
}

func applyCRD(ctx context.Context, dc dynamic.Interface) error {
	docs, err := deployDocuments(crdFile)
	if err != nil {
		return err
	}
	if len(docs) != 1 {
		return fmt.Errorf("%d documents, want one CRD", len(docs))
	}
	crds := dc.Resource(crdGVR)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(docs[0]); err != nil {
			return false, err
		}
		_, err := crds.Create(ctx, obj, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			return err == nil, err
		}
		existing, err := crds.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		obj.SetResourceVersion(existing.GetResourceVersion())
		_, err = crds.Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return err
	}
	// Established, and served: a list in some namespace answers.
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		crd, err := crds.Get(ctx, "podlifetimepolicies.podjanitor.io", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		established := false
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				established = true
			}
		}
		if !established {
			return false, nil
		}
		_, err = dc.Resource(policiesGVR).Namespace("default").List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
}

// policyObject is a PodLifetimePolicy with spec.rules = rules (no rules
// field when rules is nil).
func policyObject(ns string, rules any) *unstructured.Unstructured {
	spec := map[string]any{}
	if rules != nil {
		spec["rules"] = rules
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(),
		"kind":       "PodLifetimePolicy",
		"metadata":   map[string]any{"generateName": "agree-", "namespace": ns},
		"spec":       spec,
	}}
}

// checkAgreement creates (dry run, strict field validation, as kubectl does)
// a policy with these rules and wants the API server's verdict to be the
// loader's (policy.ParseRules), and, where the CRD's rules carry the
// loader's messages, the loader's error among the API server's causes.
// It reports whether the message was compared.
func checkAgreement(t *testing.T, ctx context.Context, dc dynamic.Interface, ns string, rules any) (compared bool) {
	t.Helper()
	js, err := json.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	_, goErr := policy.ParseRules(js)
	_, apiErr := dc.Resource(policiesGVR).Namespace(ns).Create(ctx, policyObject(ns, jsonValue(js)),
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"})
	switch {
	case goErr == nil && apiErr == nil:
		return false
	case goErr == nil:
		t.Errorf("%s: refused by the API server (%v); podjanitor accepts it", js, apiErr)
		return false
	case apiErr == nil:
		t.Errorf("%s: accepted by the API server; podjanitor says %v", js, goErr)
		return false
	case !apierrors.IsInvalid(apiErr) && !apierrors.IsBadRequest(apiErr):
		t.Errorf("%s: %v, want a refusal for invalid rules", js, apiErr)
		return false
	}
	var rerr *policy.RulesError
	if !errors.As(goErr, &rerr) {
		t.Fatalf("%s: ParseRules: %v is not a *policy.RulesError", js, goErr)
	}
	// Messages the CRD cannot give: the loader's decoding errors (the API
	// server's are its own) and label selector errors (the CRD checks the
	// grammar, not the parser's words).
	if strings.HasPrefix(rerr.Message, "unknown field ") || strings.HasPrefix(rerr.Message, "want ") ||
		strings.HasSuffix(rerr.Field, ".labelSelector") || strings.HasPrefix(rerr.Message, "yaml: ") {
		return false
	}
	var status apierrors.APIStatus
	if !errors.As(apiErr, &status) || status.Status().Details == nil {
		t.Errorf("%s: %v has no causes", js, apiErr)
		return true
	}
	want := "spec." + rerr.Field
	// The bounds (maxItems, maxLength) are the schema's, in its words.
	bound := strings.HasPrefix(rerr.Message, "at most ")
	var causes []string
	for _, c := range status.Status().Details.Causes {
		causes = append(causes, c.Field+": "+c.Message)
		if bound && c.Field == want {
			return false
		}
		if !bound && (c.Field == want || strings.HasPrefix(want, c.Field+".") || strings.HasPrefix(want, c.Field+"[")) &&
			strings.HasSuffix(c.Message, ": "+rerr.Message) {
			return true
		}
	}
	t.Errorf("%s: podjanitor says\n  %s: %s\nthe API server:\n  %s", js, want, rerr.Message, strings.Join(causes, "\n  "))
	return true
}

// jsonValue is js decoded for an unstructured object.
func jsonValue(js []byte) any {
	var v any
	if err := utiljson.Unmarshal(js, &v); err != nil { // int64s stay int64s
		panic(err)
	}
	return v
}

// TestTenantAPIAcceptsTheExample: artifacts/examples/podlifetimepolicy*.yaml,
// as a user applies them (in a namespace of the test's own), are accepted
// by the API server with strict field validation.
func TestTenantAPIAcceptsTheExample(t *testing.T) {
	t.Parallel()
	installCRD(t)
	files, err := filepath.Glob("../../artifacts/examples/podlifetimepolicy*.yaml")
	if err != nil || len(files) < 2 {
		t.Fatalf("examples %v, %v", files, err)
	}
	ns := newNamespace(t)
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			t.Fatal(err)
		}
		obj.SetNamespace(ns)
		if _, err := dynamicClient(t).Resource(policiesGVR).Namespace(ns).Create(ctxFor(t), &obj,
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}); err != nil {
			t.Errorf("the API server refuses %s: %v", file, err)
		}
	}
}

// TestTenantAPIAgreesWithLoader: on rule lists built from the pieces the
// loader cares about, the API server refuses what policy.ParseRules refuses,
// with the loader's message where the CRD can give it, and accepts the rest.
func TestTenantAPIAgreesWithLoader(t *testing.T) {
	t.Parallel()
	installCRD(t)
	ctx := ctxFor(t)
	dc := dynamicClient(t)
	ns := newNamespace(t)

	cases := generatedRuleLists()
	jobs := make(chan any)
	var wg sync.WaitGroup
	var mu sync.Mutex
	checked, refused, compared := 0, 0, 0
	for range 8 {
		wg.Go(func() {
			for rules := range jobs {
				js, _ := json.Marshal(rules)
				_, goErr := policy.ParseRules(js)
				c := checkAgreement(t, ctx, dc, ns, rules)
				mu.Lock()
				checked++
				if goErr != nil {
					refused++
				}
				if c {
					compared++
				}
				mu.Unlock()
			}
		})
	}
	for _, rules := range cases {
		jobs <- rules
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d rule lists checked, %d refused, %d of the refusals with the loader's message compared", checked, refused, compared)
	if refused == 0 || refused == checked || compared < refused/2 {
		t.Errorf("%d of %d refused, %d messages compared: the generated rule lists do not exercise the validation", refused, checked, compared)
	}
}

type obj = map[string]any

// generatedRuleLists are rule lists that change one field (or two) of a
// valid rule to a value built from the pieces the loader cares about, the
// same for every run; nil stands for a spec without rules.
func generatedRuleLists() []any {
	r := rand.New(rand.NewPCG(22, 2026))
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	base := func() obj { return obj{"name": "r", "clock": "finished", "after": "1h"} }
	one := func(fields ...any) []any {
		rule := base()
		for i := 0; i+1 < len(fields); i += 2 {
			path := strings.Split(fields[i].(string), ".")
			m := rule
			for _, p := range path[:len(path)-1] {
				if _, ok := m[p].(obj); !ok {
					m[p] = obj{}
				}
				m = m[p].(obj)
			}
			if fields[i+1] == nil {
				delete(m, path[len(path)-1])
			} else {
				m[path[len(path)-1]] = fields[i+1]
			}
		}
		return []any{rule}
	}
	var cases []any
	add := func(rules ...any) { cases = append(cases, rules...) }

	// The list.
	add(nil, []any{}, one(), []any{"not a rule"}, []any{obj{}})
	for range 40 {
		var rules []any
		for i := range 1 + r.IntN(5) {
			rule := base()
			rule["name"] = pick([]string{"a", "b", "c", "", "a"})
			if i%3 == 2 {
				rule["clock"] = pick([]string{"created", "x", ""})
			}
			rules = append(rules, rule)
		}
		add(rules)
	}

	// Names.
	for _, name := range []any{"", "a", "a-b.c_d", "-a", "a-", "a b", "A1", "_", "a..b", "日本", "a\tb", strings.Repeat("x", 200), 5, nil} {
		add(one("name", name))
	}
	// Clocks and minRestarts.
	for _, clock := range []any{"finished", "pending", "crashLooping", "created", "", "Finished", "created ", "x", "crashlooping", 1, nil} {
		add(one("clock", clock))
		for _, restarts := range []any{0, 3, -1, "3"} {
			add(one("clock", clock, "minRestarts", restarts))
		}
	}
	// Durations: the admission policy's generated values.
	for _, d := range generatedValues()["ttl"] {
		add(one("after", d))
	}
	for _, d := range []any{"", "0", "+0", "+", "-1h", "0s", "1w2d12h", 3600, nil} {
		add(one("after", d))
	}
	// Actions and grace periods.
	for _, action := range []any{"", "delete", "evict", "Delete", "remove", " evict", 0} {
		add(one("action", action))
	}
	for _, g := range []any{-5, -1, 0, 1, 30, 9223372036854775807, "30", 1.5} {
		add(one("gracePeriodSeconds", g))
	}
	// Retention by count and the notice.
	for _, n := range []any{1, 3, 0, -1, 100000, 100001, "3", 1.5, nil} {
		add(one("keepNewest", n), one("maxPods", n))
		for _, g := range []any{"owner", "", "label:app", "label:app.kubernetes.io/name", "label:", "label:bad key", "label:-a",
			"label:" + strings.Repeat("k", 64), "label:" + strings.Repeat("p", 254) + "/k", "label:a/b/c", "Owner", "job", 5} {
			add(one("keepNewest", n, "groupBy", g))
		}
	}
	add(one("maxPods", 1000000), one("maxPods", 1000001))
	for _, d := range []any{"10m", "0s", "", "-1m", "5x", "1h30m", 600, nil} {
		add(one("removalNotice", d))
	}
	// Phases against clocks.
	phases := []string{"Pending", "Running", "Succeeded", "Failed", "Unknown", "running", "", "Done"}
	for range 60 {
		var list []any
		for range r.IntN(3) + 1 {
			list = append(list, pick(phases))
		}
		add(one("clock", pick([]string{"finished", "pending", "crashLooping", "created"}), "match.phases", list))
	}
	add(one("match.phases", "Running"))
	// Reasons, owner kinds, priority classes.
	for _, reasons := range [][]any{{"Evicted"}, {""}, {"OOMKilled", ""}, {"a b"}} {
		add(one("match.reasons", reasons))
	}
	for _, kind := range []string{"Job", "ReplicaSet", "<none>", "", "a b", "apps/ReplicaSet", "a\tb", "a\nb", "a\rb", "Ünïcode"} {
		add(one("match.ownerKinds.include", []any{kind}), one("match.ownerKinds.exclude", []any{"Job", kind}))
	}
	for _, class := range []string{"high", "system-node-critical", "High", "", "a..b", "a_b", "a.b-c", "-a", strings.Repeat("a", 254), strings.Repeat("a", 253)} {
		add(one("match.priorityClassNames.include", []any{class}), one("match.priorityClassNames.exclude", []any{class}))
	}
	// Label selectors.
	for _, s := range generatedSelectors(r) {
		add(one("match.labelSelector", s))
	}
	// The bounds.
	for _, n := range []int{32, 33} {
		var rules []any
		for i := range n {
			rule := base()
			rule["name"] = fmt.Sprintf("r%d", i)
			rules = append(rules, rule)
		}
		add(rules)
	}
	add(one("match.labelSelector", "a in ("+strings.Repeat("v,", 508)+"v)"), one("match.labelSelector", "a in ("+strings.Repeat("v,", 509)+"v)"),
		one("match.reasons", slices.Repeat([]any{"Error"}, 33)), one("match.reasons", []any{strings.Repeat("é", 256)}),
		one("match.reasons", []any{strings.Repeat("é", 257)}))
	// What a tenant's rule does not have, and unknown fields.
	add(one("match.namespaces", obj{"include": []any{"x"}}), one("match.namespaceSelector", "a=b"), one("extra", 1),
		one("match.extra", "x"), one("match.ownerKinds.other", []any{"x"}), one("match", "x"), one("match.reasons", "x"))
	return cases
}

// generatedSelectors are label selectors built from labels.Parse's tokens:
// keys with and without prefixes, operators, values, sets, blanks, commas.
func generatedSelectors(r *rand.Rand) []string {
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	keys := []string{"app", "a.b/c", "example.com/app", "Example.com/app", "a", "A_b", "-a", "a-", "in", "notin", "x/", "/x",
		"a/b/c", strings.Repeat("k", 63), strings.Repeat("k", 64), strings.Repeat("p", 253) + "/k", strings.Repeat("p", 254) + "/k", "ä", "a*"}
	values := []string{"web", "", "a-b", "A.b_c", "-x", "x-", "5", "007", "-5", "+5", "1.5", "9223372036854775807", "9223372036854775808",
		"00000000000000000000009", "99999999999999999999", strings.Repeat("v", 63), strings.Repeat("v", 64), "in", "a b", "ä"}
	ws := []string{"", "", " ", "  ", "\t", "\n"}
	requirement := func() string {
		w := func() string { return pick(ws) }
		switch r.IntN(7) {
		case 0:
			return w() + pick(keys) + w()
		case 1:
			return w() + "!" + w() + pick(keys) + w()
		case 2, 3:
			return w() + pick(keys) + w() + pick([]string{"=", "==", "!=", "=!", "===", "!==", "="}) + w() + pick(values) + w()
		case 4:
			return w() + pick(keys) + w() + pick([]string{">", "<", ">=", "<"}) + w() + pick(values) + w()
		default:
			var set []string
			for range r.IntN(4) {
				set = append(set, w()+pick(values)+w())
			}
			sep := pick([]string{" ", " ", "", "\t"})
			return w() + pick(keys) + sep + pick([]string{"in", "notin", "in", "In", "not in"}) + w() +
				pick([]string{"(", "(", ""}) + strings.Join(set, pick([]string{",", ",", ", ", ",,"})) + pick([]string{")", ")", ""}) + w()
		}
	}
	out := []string{"", " ", "app=web", "app=web,tier!=db", "env in (a,b)", "!legacy", "x in ()", "x in (,)", "a,", ",a", "a,,b", "a>5", "a<-1"}
	for range 300 {
		var reqs []string
		for range 1 + r.IntN(3) {
			reqs = append(reqs, requirement())
		}
		out = append(out, strings.Join(reqs, pick([]string{",", ",", ", ", " ,", ";"})))
	}
	return out
}

// tenantClients applies the ClusterRoles of artifacts/deploy aggregated into
// the built-in roles, creates ServiceAccount name in ns bound (a RoleBinding
// in ns) to the built-in ClusterRole role, and returns clients with its token.
func tenantClients(t *testing.T, ns, name, role string) (kubernetes.Interface, versioned.Interface) {
	t.Helper()
	ctx := ctxFor(t)
	docs, err := deployDocuments(rbacDeployDir + "/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var want []string // role's podjanitor.io permissions, as the aggregated ClusterRoles give them
	for _, doc := range docs {
		var cr rbacv1.ClusterRole
		if err := json.Unmarshal(doc, &cr); err != nil || cr.Kind != "ClusterRole" {
			continue
		}
		for k, v := range cr.Labels {
			if to, ok := strings.CutPrefix(k, "rbac.authorization.k8s.io/aggregate-to-"); ok {
				if err := applyDeployDoc(ctx, "ClusterRole", doc); err != nil {
					t.Fatalf("ClusterRole %s: %v", cr.Name, err)
				}
				if to == role && v == "true" {
					want = append(want, podjanitorPermissions(cr.Rules)...)
				}
			}
		}
	}
	if len(want) == 0 {
		t.Fatalf("artifacts/deploy/rbac.yaml has no ClusterRole aggregated into %s", role)
	}
	// The aggregation controller writes the rules into the built-in role a
	// moment later (and takes out what a ClusterRole no longer grants).
	want = compactSorted(want)
	var got []string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		builtin, err := client.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = compactSorted(podjanitorPermissions(builtin.Rules))
		return slices.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("the built-in ClusterRole %s grants %q on podjanitor.io, want %q from the aggregated ClusterRoles: %v", role, got, want, err)
	}
	if _, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", writeTokenKubeconfig(t, tr.Status.Token))
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(cfg), versioned.NewForConfigOrDie(cfg)
}

// podjanitorPermissions are the rules' "resource verb" on podjanitor.io.
func podjanitorPermissions(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		if !slices.Contains(r.APIGroups, v1alpha1.GroupName) {
			continue
		}
		for _, res := range r.Resources {
			for _, v := range r.Verbs {
				out = append(out, res+" "+v)
			}
		}
	}
	return out
}

func compactSorted(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

func tenantPolicy(name, after string) *v1alpha1.PodLifetimePolicy {
	return &v1alpha1.PodLifetimePolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.PodLifetimePolicySpec{Rules: []v1alpha1.PodLifetimeRule{
			{Name: "finished-jobs", Clock: "finished", After: after, Match: v1alpha1.PodLifetimeMatch{
				OwnerKinds: v1alpha1.IncludeExclude{Include: []string{"Job"}}}},
		}},
	}
}

// TestTenantAPIEditRoleDelegation: an identity with only the built-in edit
// role in namespace A (a RoleBinding) manages PodLifetimePolicies in A and
// not in B, cannot write their status, and is refused an invalid one with
// the loader's message; one with view reads them and cannot create one.
func TestTenantAPIEditRoleDelegation(t *testing.T) {
	t.Parallel()
	installCRD(t)
	ctx := ctxFor(t)
	a, b := newNamespace(t), newNamespace(t)
	editKube, edit := tenantClients(t, a, "tenant", "edit")
	_, view := tenantClients(t, a, "viewer", "view")

	// The authorizer sees the aggregated rules a moment later.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return saCan(t, ctx, editKube, v1alpha1.GroupName, "podlifetimepolicies", "", "create", a), nil
	})
	if err != nil {
		t.Fatalf("edit in %s never allowed creating podlifetimepolicies: the ClusterRole aggregated into edit did not take effect", a)
	}

	policies := edit.PodjanitorV1alpha1().PodLifetimePolicies(a)
	created, err := policies.Create(ctx, tenantPolicy("jobs", "1h"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("edit in %s: creating a PodLifetimePolicy there: %v", a, err)
	}
	// Another podjanitor on the cluster may write the status meanwhile.
	var updated *v1alpha1.PodLifetimePolicy
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		latest, err := policies.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		latest.Spec.Rules[0].After = "2h"
		updated, err = policies.Update(ctx, latest, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Errorf("edit in %s: updating its PodLifetimePolicy: %v", a, err)
	} else {
		updated.Status.PodsWithDeadline = 3
		if _, err := policies.UpdateStatus(ctx, updated, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("edit in %s: writing the status: err = %v, want Forbidden (podjanitor writes it)", a, err)
		}
	}
	if _, err := edit.PodjanitorV1alpha1().PodLifetimePolicies(b).Create(ctx, tenantPolicy("jobs", "1h"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("edit in %s: creating a PodLifetimePolicy in %s: err = %v, want Forbidden", a, b, err)
	}
	if _, err := edit.PodjanitorV1alpha1().PodLifetimePolicies("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("edit in %s: listing PodLifetimePolicies in all namespaces: err = %v, want Forbidden", a, err)
	}

	// An invalid policy: the API server refuses it with the loader's message.
	_, want := policy.ParseRules([]byte(`[{name: finished-jobs, clock: finished, after: 3x, match: {ownerKinds: {include: [Job]}}}]`))
	var rerr *policy.RulesError
	if !errors.As(want, &rerr) {
		t.Fatalf("ParseRules: %v, want a RulesError", want)
	}
	_, err = policies.Create(ctx, tenantPolicy("bad", "3x"), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec."+rerr.Field+": Invalid value: \"3x\": "+rerr.Message) {
		t.Errorf("creating a policy with after 3x: err = %v, want it invalid with spec.%s: %s", err, rerr.Field, rerr.Message)
	}

	if list, err := view.PodjanitorV1alpha1().PodLifetimePolicies(a).List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 1 {
		t.Errorf("view in %s: listing PodLifetimePolicies: %v, err %v; want the one policy", a, list, err)
	}
	if _, err := view.PodjanitorV1alpha1().PodLifetimePolicies(a).Create(ctx, tenantPolicy("view", "1h"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("view in %s: creating a PodLifetimePolicy: err = %v, want Forbidden", a, err)
	}
	if err := policies.Delete(ctx, "jobs", metav1.DeleteOptions{}); err != nil {
		t.Errorf("edit in %s: deleting its PodLifetimePolicy: %v", a, err)
	}
}

// TestTenantAPIPodjanitorRBAC: podjanitor's ServiceAccount (artifacts/deploy)
// reads PodLifetimePolicies cluster-wide and writes their status and, by
// patch, its finalizer on them.
func TestTenantAPIPodjanitorRBAC(t *testing.T) {
	t.Parallel()
	installCRD(t)
	_, sa := setupDeployRBAC(t)
	ctx := ctxFor(t)
	ns := newNamespace(t)
	for _, c := range []struct {
		subresource, verb, namespace string
		want                         bool
	}{
		{"", "list", "", true}, {"", "watch", "", true}, {"", "get", ns, true},
		{"status", "update", ns, true}, {"status", "patch", ns, true},
		{"", "patch", ns, true}, // its finalizer alone (podjanitor.io/wave-guard)
		{"", "create", ns, false}, {"", "update", ns, false},
		{"", "delete", ns, false}, {"", "deletecollection", ns, false}, {"status", "get", ns, false},
	} {
		if got := saCan(t, ctx, sa, v1alpha1.GroupName, "podlifetimepolicies", c.subresource, c.verb, c.namespace); got != c.want {
			t.Errorf("podjanitor can %s podlifetimepolicies (subresource %q) in %q: %v, want %v", c.verb, c.subresource, c.namespace, got, c.want)
		}
	}
	// The resource's kind is PodLifetimePolicy alone: the policy file's kind
	// (PodJanitorPolicy, artifacts/policy.yaml) is no object of the API.
	resources, err := client.Discovery().ServerResourcesForGroupVersion(v1alpha1.SchemeGroupVersion.String())
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, r := range resources.APIResources {
		if !strings.Contains(r.Name, "/") {
			kinds = append(kinds, r.Kind)
		}
	}
	if len(kinds) != 1 || kinds[0] != "PodLifetimePolicy" || kinds[0] == policy.PolicyKind {
		t.Errorf("%s serves the kinds %q, want PodLifetimePolicy alone", v1alpha1.SchemeGroupVersion, kinds)
	}
}
