package tenant

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"

	"k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/podjanitor/podjanitor/pkg/apis/podjanitor/v1alpha1"
	"github.com/podjanitor/podjanitor/policy"
)

// rulesBytesAnnotation is the one annotation a cached policy has: the
// bytes of its rules (policy.TenantRulesSize), set by Transform. A tenant's
// own annotations are dropped, so a tenant cannot set it.
const rulesBytesAnnotation = "podjanitor.io/cached-rules-bytes"

// FinalizerPrefix begins the name of every podjanitor's finalizer on the
// tenant policies it uses: a policy's deletion waits for podjanitor to
// measure it, and a deletion that makes too many pods due at once (the pods
// the policy kept longer than the cluster's rules do) is held, the policy
// kept, until it is approved. Each podjanitor (each record Lease: a release,
// a canary, a team's namespaced one) has its own (FinalizerFor), so that
// one that sees no wave cannot let go a deletion another holds.
const FinalizerPrefix = "podjanitor.io/wave-guard"

// FinalizerFor is the finalizer of the podjanitor whose record Lease is
// namespace/name: FinalizerPrefix + "." + namespace + "." + name, or, past
// the 63 characters a finalizer's name may have after its prefix, "." and
// the first 16 hex digits of the pair's SHA-256.
func FinalizerFor(namespace, name string) string {
	suffix := "." + namespace + "." + name
	if len(strings.TrimPrefix(FinalizerPrefix, "podjanitor.io/"))+len(suffix) > 63 {
		sum := sha256.Sum256([]byte(namespace + "/" + name))
		suffix = "." + hex.EncodeToString(sum[:8])
	}
	return FinalizerPrefix + suffix
}

// HasFinalizer reports whether the policy has the finalizer.
func HasFinalizer(p *v1alpha1.PodLifetimePolicy, finalizer string) bool {
	return slices.Contains(p.Finalizers, finalizer)
}

// RuleSpecs are the resource's rules as package policy reads them; strings
// and lists are shared with obj.
func RuleSpecs(obj *v1alpha1.PodLifetimePolicy) []policy.TenantRuleSpec {
	specs := make([]policy.TenantRuleSpec, len(obj.Spec.Rules))
	for i, r := range obj.Spec.Rules {
		specs[i] = policy.TenantRuleSpec{
			Name: r.Name, LabelSelector: r.Match.LabelSelector,
			OwnerKinds:         policy.IncludeExclude{Include: r.Match.OwnerKinds.Include, Exclude: r.Match.OwnerKinds.Exclude},
			PriorityClassNames: policy.IncludeExclude{Include: r.Match.PriorityClassNames.Include, Exclude: r.Match.PriorityClassNames.Exclude},
			Phases:             r.Match.Phases, Reasons: r.Match.Reasons,
			Clock: r.Clock, After: r.After, MinRestarts: r.MinRestarts, Action: r.Action, GracePeriodSeconds: r.GracePeriodSeconds,
			KeepNewest: r.KeepNewest, GroupBy: r.GroupBy, MaxPods: r.MaxPods, RemovalNotice: r.RemovalNotice,
		}
	}
	return specs
}

// approveWaveAnnotation is the one annotation of a tenant's that the cache
// keeps: the approval of a held change of the policy, when it is no longer
// than a change ID could be (policy.MaxApproveWave).
const approveWaveAnnotation = policy.ApproveWaveAnnotation

// Transform is the tenant policy informer's transform: the cache keeps
// what conversion and status read (name, namespace, UID, generation,
// resourceVersion, deletion timestamp, the rules, the status, the approval
// of a held wave) and drops the rest: managedFields, labels, other annotations (kubectl's last-applied copy of
// the whole object among them), owner references and the finalizers not
// podjanitor's (FinalizerPrefix; HasFinalizer still answers). The rules
// of a policy larger than maxBytes on its own (0: no bound), which no
// namespace could use, are dropped too; RulesBytes says so.
func Transform(maxBytes int) cache.TransformFunc {
	return func(obj interface{}) (interface{}, error) {
		p, ok := obj.(*v1alpha1.PodLifetimePolicy)
		if !ok {
			return obj, nil // a tombstone: as it is
		}
		var finalizers []string
		for _, f := range p.Finalizers {
			if strings.HasPrefix(f, FinalizerPrefix) {
				finalizers = append(finalizers, f)
			}
		}
		p.ManagedFields, p.Labels, p.OwnerReferences, p.Finalizers = nil, nil, nil, finalizers
		size := policy.TenantRulesSize(RuleSpecs(p))
		if maxBytes > 0 && size > maxBytes {
			p.Spec.Rules = nil
		}
		kept := map[string]string{rulesBytesAnnotation: strconv.Itoa(size)}
		if v, ok := p.Annotations[approveWaveAnnotation]; ok && len(v) <= policy.MaxApproveWave {
			kept[approveWaveAnnotation] = v
		}
		p.Annotations = kept
		return p, nil
	}
}

// RulesBytes is the bytes of the policy's rules (policy.TenantRulesSize)
// and whether Transform dropped them.
func RulesBytes(p *v1alpha1.PodLifetimePolicy) (size int, dropped bool) {
	if v, ok := p.Annotations[rulesBytesAnnotation]; ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n, n > 0 && len(p.Spec.Rules) == 0
		}
	}
	return policy.TenantRulesSize(RuleSpecs(p)), false
}
