package wave

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestScopesRecordRoundTrip: the held changes of two namespaces, published
// on a Lease that is not there yet, read back as they were; none held
// removes the annotation.
func TestScopesRecordRoundTrip(t *testing.T) {
	ctx := context.Background()
	h := NewHolds(SourceNamespace, threshold, time.Minute, nil)
	before := func(ns string) []byte {
		return []byte(fmt.Sprintf(`{"namespace":%q,"annotations":{"podjanitor.io/keep":"true"}}`, ns))
	}
	afterJSON := func(ns string) []byte { return []byte(fmt.Sprintf(`{"namespace":%q}`, ns)) }
	for _, ns := range []string{"a", "b"} {
		ps := []*corev1.Pod{nsPod(ns, "1", time.Hour), nsPod(ns, "2", time.Hour), nsPod(ns, "3", time.Hour)}
		if _, ok := h.Change(ns, "namespace/"+ns, before(ns), after(7*24*time.Hour), afterJSON(ns), after(time.Minute), pods(ps...), t0); !ok {
			t.Fatalf("namespace %s not held", ns)
		}
	}
	r := Record{Client: fake.NewClientset(), Namespace: "podjanitor", Name: "podjanitor"}
	snap := h.Snapshot()
	if left, err := r.PublishScopes(ctx, snap); err != nil || len(left) > 0 {
		t.Fatalf("publish: %v, left out %v", err, left)
	}
	stored, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := stored.HeldScopes()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("read back %v, want a and b", got)
	}
	for ns, want := range snap {
		g := got[ns]
		if g.Change != want.Change || g.Change != ChangeID(before(ns), afterJSON(ns)) || g.Pods != 3 || string(g.Before) != string(before(ns)) {
			t.Errorf("namespace %s read back %+v, want %+v", ns, g, want)
		}
	}
	if _, err := r.PublishScopes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if stored, err = r.Read(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := stored.HeldScopes(); err != nil || len(got) != 0 {
		t.Errorf("after none held: %v, %v; want none", got, err)
	}
}

// TestScopesRecordIsBounded: however many namespaces are held, and however
// large their labels, the record stays within maxHeldScopes (the Lease's
// annotations are bounded); the namespaces left out are named.
func TestScopesRecordIsBounded(t *testing.T) {
	held := map[string]ScopeHold{}
	big := strings.Repeat("x", 1000)
	for i := range 500 {
		held[fmt.Sprintf("ns-%03d", i)] = ScopeHold{Change: "id", Pods: 1, Before: json.RawMessage(fmt.Sprintf(`{"labels":{"l":%q}}`, big))}
	}
	value, left := encodeScopes(held)
	if len(value) > maxHeldScopes {
		t.Errorf("record of %d bytes, want at most %d", len(value), maxHeldScopes)
	}
	var back map[string]ScopeHold
	if err := json.Unmarshal([]byte(value), &back); err != nil {
		t.Fatal(err)
	}
	if len(back)+len(left) != 500 || len(left) == 0 || len(back) < 50 {
		t.Errorf("recorded %d, left out %d of 500", len(back), len(left))
	}
	for _, name := range left {
		if _, ok := back[name]; ok {
			t.Errorf("%s both recorded and left out", name)
		}
	}
}
