package policy

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkDecideWithTenants measures what tenant policies add to a
// decision, the steady cost per pod event: a pod decided by the policy
// file's rule with no tenant policies (none), with five tenant policies in
// other namespaces (elsewhere: the pod's namespace has none), and with five
// in its own namespace none of whose rules match it (own, not matching)
// before the file's rule decides. Run it with
//
//	go test -run '^$' -bench DecideWithTenants ./policy/
func BenchmarkDecideWithTenants(b *testing.B) {
	cluster, err := NewPolicy(Rule{Name: "max-age", Match: Match{LabelSelector: "app=web"}, Clock: ClockCreated, After: 48 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	policies := func(namespace string) []*TenantPolicy {
		var out []*TenantPolicy
		for i := range 5 {
			p, err := NewTenantPolicy(namespace, fmt.Sprintf("p%d", i),
				[]Rule{{Name: "batch", Match: Match{LabelSelector: "app=batch"}, Clock: ClockCreated, After: time.Hour}}, Restrictions{})
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, p)
		}
		return out
	}
	pod := newPod(labelled("app", "web"))
	for _, bc := range []struct {
		name    string
		tenants Tenants
	}{
		{"none", nil},
		{"elsewhere", NewStaticTenants(policies("team-b")...)},
		{"own, not matching", NewStaticTenants(policies("default")...)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := &Evaluator{Policy: cluster, Tenants: bc.tenants}
			b.ReportAllocs()
			for b.Loop() {
				d, err := e.Decide(pod, anyNamespace, now)
				if err != nil || d.Rule != "max-age" {
					b.Fatalf("Decide = %+v, %v", d, err)
				}
			}
		})
	}
}
