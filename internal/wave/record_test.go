package wave

import (
	"context"
	"encoding/json"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestRecordMovesOffTheLease: a record an earlier podjanitor wrote on the
// Lease (the policy acted on, the held namespace changes) is read from
// there while the ConfigMap has none of it; once the leader records its own
// in the ConfigMap, the Lease carries only the held change and its
// approval, so its renewals (a whole object every retry period) carry no
// record, and what the ConfigMap says is what is read.
func TestRecordMovesOffTheLease(t *testing.T) {
	ctx := context.Background()
	policy := []byte(`{"Rules":[{"After":60000000000}]}`)
	held := map[string]ScopeHold{"team-a": {Change: "0123456789ab", Pods: 12, Before: json.RawMessage(`{"namespace":"team-a"}`)}}
	heldJSON, _ := json.Marshal(held)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "podjanitor", Name: "podjanitor", Annotations: map[string]string{
		AnnotationBaseline: string(policy), AnnotationBaselineHash: BaselineHash(policy),
		AnnotationHeldNamespaces: string(heldJSON), AnnotationApprove: "ba9876543210", "other": "kept"}}}
	client := fake.NewClientset(lease)
	r := Record{Client: client, Namespace: "podjanitor", Name: "podjanitor"}

	s, err := r.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hash, b := s.Baseline(); hash != BaselineHash(policy) || string(b) != string(policy) {
		t.Errorf("the earlier release's policy read as %q, %s", hash, b)
	}
	if got, err := s.HeldScopes(); err != nil || got["team-a"].Change != "0123456789ab" {
		t.Errorf("the earlier release's held namespaces read as %v, %v", got, err)
	}

	newer := []byte(`{"Rules":[{"After":120000000000}]}`)
	if err := r.PublishBaseline(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PublishScopes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	l, err := client.CoordinationV1().Leases("podjanitor").Get(ctx, "podjanitor", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{AnnotationBaseline, AnnotationBaselineHash, AnnotationHeldNamespaces} {
		if _, ok := l.Annotations[k]; ok {
			t.Errorf("the Lease still carries %s", k)
		}
	}
	if l.Annotations[AnnotationApprove] != "ba9876543210" || l.Annotations["other"] != "kept" {
		t.Errorf("the Lease's other annotations changed: %v", l.Annotations)
	}
	if s, err = r.Read(ctx); err != nil {
		t.Fatal(err)
	}
	if hash, b := s.Baseline(); hash != BaselineHash(newer) || string(b) != string(newer) {
		t.Errorf("the recorded policy read as %q, %s; want the one recorded in the ConfigMap", hash, b)
	}
	if got, err := s.HeldScopes(); err != nil || len(got) != 0 {
		t.Errorf("held namespaces read as %v, %v; want none, as recorded", got, err)
	}

	// None acted on yet (a first install held): recorded as none, not
	// read from the Lease.
	if err := r.PublishBaseline(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if s, err = r.Read(ctx); err != nil {
		t.Fatal(err)
	}
	if hash, b := s.Baseline(); hash != "" || b != nil {
		t.Errorf("none acted on read as %q, %s", hash, b)
	}
}

// TestRecordTooLargeAPolicy: a policy past maxBaseline is recorded by its
// hash alone, and reads as a hash without its rules.
func TestRecordTooLargeAPolicy(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	r := Record{Client: client, Namespace: "podjanitor", Name: "podjanitor"}
	big := make([]byte, maxBaseline+1)
	for i := range big {
		big[i] = 'x'
	}
	if err := r.PublishBaseline(ctx, big); err != nil {
		t.Fatal(err)
	}
	cm, err := client.CoreV1().ConfigMaps("podjanitor").Get(ctx, RecordName("podjanitor"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cm.Data[KeyPolicy]; ok || cm.Data[KeyPolicyHash] != BaselineHash(big) {
		t.Errorf("recorded %d bytes of policy, hash %q", len(cm.Data[KeyPolicy]), cm.Data[KeyPolicyHash])
	}
	if hash, b := (Stored{ConfigMap: cm}).Baseline(); hash != BaselineHash(big) || b != nil {
		t.Errorf("read as %q and %d bytes; want the hash alone", hash, len(b))
	}
}
