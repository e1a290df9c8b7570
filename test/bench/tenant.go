package main

// -tenant-policies N: the PodLifetimePolicy CRD applied, N PodLifetimePolicy
// resources in every namespace a podjanitor of the bench watches, and
// podjanitor started with --tenant-policies, so that the steady and idle
// figures can be compared with and without tenant policies (issue 22). The
// rules give none of the bench pods a deadline (a label no bench pod has, the
// finished clock: bench pods never finish), so the runs remove the same pods
// at the same deadlines (their expires-at annotations) as without. At the end
// the driver reads every policy's Ready condition and fails the run unless
// all are Ready=True for their generation: podjanitor read and used them.

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/pkg/generated/clientset/versioned"
)

// tenantNeverLabel is a label key no bench pod has: the tenant rules select
// pods by it, so they match none.
const tenantNeverLabel = "bench.podjanitor.io/tenant-target"

// tenantPolicySpecs are the n PodLifetimePolicy resources of a namespace:
// rules as a team would write them (finished Jobs after an hour, evicted pods
// after ten minutes), restricted to pods with tenantNeverLabel.
func tenantPolicySpecs(n int) []*v1alpha1.PodLifetimePolicy {
	var out []*v1alpha1.PodLifetimePolicy
	for k := range n {
		name := fmt.Sprintf("bench-tenant-%02d", k+1)
		selector := tenantNeverLabel + "=" + name
		grace := int64(10)
		out = append(out, &v1alpha1.PodLifetimePolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1alpha1.PodLifetimePolicySpec{Rules: []v1alpha1.PodLifetimeRule{
				{
					Name:  "finished-jobs",
					Match: v1alpha1.PodLifetimeMatch{LabelSelector: selector, OwnerKinds: v1alpha1.IncludeExclude{Include: []string{"Job"}}},
					Clock: "finished", After: "1h",
				},
				{
					Name: "evicted",
					Match: v1alpha1.PodLifetimeMatch{LabelSelector: selector, Phases: []corev1.PodPhase{corev1.PodFailed},
						Reasons: []string{"Evicted"}},
					Clock: "finished", After: "10m", Action: "delete", GracePeriodSeconds: &grace,
				},
			}},
		})
	}
	return out
}

// benchTenants creates the policies of each namespace a podjanitor watches
// (once per namespace) and reads their status at the end.
type benchTenants struct {
	client versioned.Interface
	n      int

	mu         sync.Mutex
	namespaces []string
}

// tenants is set with -tenant-policies > 0 (run).
var tenants *benchTenants

// setupTenants applies the CRD (crd: a file or directory) and waits until it
// is Established.
func (b *bench) setupTenants(ctx context.Context, crd string) (*benchTenants, error) {
	if err := b.applyCRDs(ctx, crd); err != nil {
		return nil, err
	}
	c, err := versioned.NewForConfig(b.rest)
	if err != nil {
		return nil, err
	}
	return &benchTenants{client: c, n: b.cfg.tenantPolicies}, nil
}

// ensure creates the n policies in ns unless it has them already.
func (t *benchTenants) ensure(ns string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if slices.Contains(t.namespaces, ns) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range tenantPolicySpecs(t.n) {
		_, err := t.client.PodjanitorV1alpha1().PodLifetimePolicies(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating PodLifetimePolicy %s/%s: %w", ns, p.Name, err)
		}
	}
	t.namespaces = append(t.namespaces, ns)
	logf("tenant policies: %d PodLifetimePolicy resources in %s", t.n, ns)
	return nil
}

// tenantResult is the policies' Ready state at the end of the run.
type tenantResult struct {
	PerNamespace int               `json:"policies_per_namespace"`
	Namespaces   []tenantNamespace `json:"namespaces"`
	NotReady     []string          `json:"not_ready,omitempty"` // namespace/name: reason
	Ready        int               `json:"ready"`
	Total        int               `json:"total"`
}

type tenantNamespace struct {
	Namespace string `json:"namespace"`
	Policies  int    `json:"policies"`
	Ready     int    `json:"ready"`
}

// readyOf says whether p is Ready=True for its current generation, and why not.
func readyOf(p *v1alpha1.PodLifetimePolicy) (bool, string) {
	c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
	switch {
	case c == nil:
		return false, "no Ready condition (podjanitor never wrote its status)"
	case c.Status != metav1.ConditionTrue:
		return false, fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
	case p.Status.ObservedGeneration != p.Generation || c.ObservedGeneration != p.Generation:
		return false, fmt.Sprintf("Ready=True for generation %d, not %d", c.ObservedGeneration, p.Generation)
	}
	return true, ""
}

// report reads the policies of every namespace they were created in.
func (t *benchTenants) report(ctx context.Context) (*tenantResult, error) {
	t.mu.Lock()
	namespaces := slices.Clone(t.namespaces)
	t.mu.Unlock()
	out := &tenantResult{PerNamespace: t.n}
	for _, ns := range namespaces {
		list, err := t.client.PodjanitorV1alpha1().PodLifetimePolicies(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return out, err
		}
		row := tenantNamespace{Namespace: ns, Policies: len(list.Items)}
		for i := range list.Items {
			p := &list.Items[i]
			if ok, why := readyOf(p); ok {
				row.Ready++
			} else {
				out.NotReady = append(out.NotReady, ns+"/"+p.Name+": "+why)
			}
		}
		if row.Policies < t.n {
			out.NotReady = append(out.NotReady, fmt.Sprintf("%s: %d policies, want %d", ns, row.Policies, t.n))
		}
		out.Namespaces = append(out.Namespaces, row)
		out.Ready += row.Ready
		out.Total += row.Policies
	}
	if len(namespaces) == 0 {
		out.NotReady = append(out.NotReady, "no podjanitor ran: no tenant policies created")
	}
	return out, nil
}

func printTenants(w io.Writer, t *tenantResult) {
	fmt.Fprintf(w, "\n== Tenant policies (-tenant-policies %d; podjanitor --tenant-policies; their rules give no bench pod a deadline)\n", t.PerNamespace)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "namespace\tpolicies\tReady=True")
	for _, ns := range t.Namespaces {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", ns.Namespace, ns.Policies, ns.Ready)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%d of %d Ready=True\n", t.Ready, t.Total)
	for _, n := range t.NotReady {
		fmt.Fprintf(w, "NOT READY: %s\n", n)
	}
}
