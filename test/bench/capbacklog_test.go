package main

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func capPod(ns, name, uid, rv string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), ResourceVersion: rv}}
}

// requests lists the fake clientset's actions as "verb resource[/subresource] ns/name".
func requests(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		s := a.GetVerb() + " " + a.GetResource().Resource
		if a.GetSubresource() != "" {
			s += "/" + a.GetSubresource()
		}
		name := ""
		switch a := a.(type) {
		case k8stesting.GetAction:
			name = a.GetName()
		case k8stesting.DeleteAction:
			name = a.GetName()
		case k8stesting.CreateAction:
			if e, ok := a.GetObject().(*policyv1.Eviction); ok {
				name = e.Name
			}
		}
		if a.GetNamespace() != "" {
			name = a.GetNamespace() + "/" + name
		}
		out = append(out, s+" "+name)
	}
	return out
}

// The raw remover of ns-backlog makes podjanitor's requests: a namespace GET
// shared by the removals of that namespace within a second, then the DELETE.
// One worker and a clock that moves 600 ms per removal: the third pod of a
// namespace is 1.2 s after its first read, so the namespace is read again.
func TestRawRemoverReadsEachNamespaceOncePerSecond(t *testing.T) {
	side := capSide{namespaces: []string{"a", "b"}, names: [][]string{{"a-0", "a-1", "a-2"}, {"b-0"}}}
	cs := fake.NewClientset(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "b"}},
		capPod("a", "a-0", "u0", "1"), capPod("a", "a-1", "u1", "1"), capPod("a", "a-2", "u2", "1"), capPod("b", "b-0", "u3", "1"))
	cs.ClearActions()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	calls := 0
	now := func() time.Time { calls++; return t0.Add(time.Duration(calls-1) * 600 * time.Millisecond) }

	res, err := rawRemove(context.Background(), cs, side, false, 1, now)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"get namespaces a", "delete pods a/a-0",
		"delete pods a/a-1",                     // 0.6 s after the read
		"get namespaces a", "delete pods a/a-2", // 1.2 s
		"get namespaces b", "delete pods b/b-0",
	}
	got := requests(cs)
	if len(got) != len(want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("request %d %q, want %q (all: %q)", i, got[i], want[i], got)
		}
	}
	if g := res.byVerb(); g["GET namespace"] != 3 || g["DELETE"] != 4 || g["GET pod"] != 0 || g["POST eviction"] != 0 || res.errors.Load() != 0 {
		t.Fatalf("counted %v, %d errors; want 3 namespace GETs, 4 DELETEs", g, res.errors.Load())
	}
}

// The raw remover of evict-backlog reads each pod and evicts it with that
// read's UID and resourceVersion, as podjanitor's freshDecision does, and
// reads no namespace.
func TestRawRemoverEvictsWithTheReadsPreconditions(t *testing.T) {
	side := capSide{namespaces: []string{"e"}, names: [][]string{{"e-0", "e-1"}}}
	cs := fake.NewClientset(capPod("e", "e-0", "uid-0", "17"), capPod("e", "e-1", "uid-1", "23"))
	type pre struct{ uid, rv string }
	evicted := map[string]pre{}
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		e, ok := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		if !ok || a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		p := e.DeleteOptions.Preconditions
		evicted[e.Name] = pre{string(*p.UID), *p.ResourceVersion}
		return true, nil, nil
	})
	cs.ClearActions()

	res, err := rawRemove(context.Background(), cs, side, true, 1, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"get pods e/e-0", "create pods/eviction e/e-0", "get pods e/e-1", "create pods/eviction e/e-1"}
	got := requests(cs)
	if len(got) != len(want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("request %d %q, want %q (all: %q)", i, got[i], want[i], got)
		}
	}
	if evicted["e-0"] != (pre{"uid-0", "17"}) || evicted["e-1"] != (pre{"uid-1", "23"}) {
		t.Fatalf("eviction preconditions %v, want each pod's read UID and resourceVersion", evicted)
	}
	if g := res.byVerb(); g["GET pod"] != 2 || g["POST eviction"] != 2 || g["GET namespace"] != 0 || res.errors.Load() != 0 {
		t.Fatalf("counted %v, %d errors", g, res.errors.Load())
	}
}

// A refused eviction is made again, the pod read afresh, as podjanitor
// retries it; the refusal is counted by code and reason.
func TestRawRemoverRetriesARefusedEviction(t *testing.T) {
	side := capSide{namespaces: []string{"e"}, names: [][]string{{"e-0"}}}
	cs := fake.NewClientset(capPod("e", "e-0", "uid-0", "17"))
	refused := false
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		if !refused {
			refused = true
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		return true, nil, nil
	})
	cs.ClearActions()

	res, err := rawRemove(context.Background(), cs, side, true, 1, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"get pods e/e-0", "create pods/eviction e/e-0", "get pods e/e-0", "create pods/eviction e/e-0"}
	if got := requests(cs); len(got) != len(want) || got[2] != want[2] || got[3] != want[3] {
		t.Fatalf("requests %q, want %q", got, want)
	}
	if by := res.errorsBy(); res.errors.Load() != 1 || by["429 TooManyRequests"] != 1 {
		t.Fatalf("errors %d by %v, want one 429 TooManyRequests", res.errors.Load(), by)
	}
}
