// Package clientfeatures owns client-go's feature gates for podjanitor, as
// every Kubernetes component owns them: Install replaces client-go's default
// gates (k8s.io/client-go/features) with ones that read the same
// KUBE_FEATURE_<name> environment variables once, log only the gates an
// environment variable changed, and say nothing about the defaults.
//
// client-go's own gates log every default ("Feature gate default state", one
// line per feature at V(1), through klog.Background so that -vmodule does
// not reach them) the first time a gate is read: a podjanitor at -v=2 began its
// output with ten such lines.
package clientfeatures

import (
	"fmt"
	"os"
	"sort"
	"strconv"

	"k8s.io/client-go/features"
	"k8s.io/klog/v2"
)

// gates are client-go's known features with their state: the default, or
// KUBE_FEATURE_<name> when it is set to a valid value.
type gates struct {
	enabled map[features.Feature]bool
}

// Enabled reports a known feature's state; an unknown one is a programming
// error, as in client-go's own gates.
func (g *gates) Enabled(key features.Feature) bool {
	v, ok := g.enabled[key]
	if !ok {
		panic(fmt.Errorf("feature %q is not registered in client-go's feature gates", key))
	}
	return v
}

// registry collects client-go's known features (features.Registry).
type registry map[features.Feature]features.FeatureSpec

func (r registry) Add(specs map[features.Feature]features.FeatureSpec) error {
	for k, v := range specs {
		r[k] = v
	}
	return nil
}

// Install replaces client-go's feature gates; call it before any client is
// made. The gates set from the environment are logged at V(2), one line
// each; a value that is not a boolean, or that a locked gate cannot take,
// is logged as an error and the default kept.
func Install(logger klog.Logger) error {
	g, err := fromEnvironment(logger, os.LookupEnv)
	if err != nil {
		return err
	}
	features.ReplaceFeatureGates(g)
	return nil
}

func fromEnvironment(logger klog.Logger, lookup func(string) (string, bool)) (*gates, error) {
	known := registry{}
	if err := features.AddFeaturesToExistingFeatureGates(known); err != nil {
		return nil, fmt.Errorf("client-go's feature gates: %w", err)
	}
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, string(k))
	}
	sort.Strings(names)
	g := &gates{enabled: make(map[features.Feature]bool, len(known))}
	for _, name := range names {
		key := features.Feature(name)
		spec := known[key]
		g.enabled[key] = spec.Default
		env := "KUBE_FEATURE_" + name
		raw, set := lookup(env)
		if !set {
			continue
		}
		v, err := strconv.ParseBool(raw)
		switch {
		case err != nil:
			logger.Error(err, "Ignoring a client-go feature gate's environment variable", "variable", env, "value", raw)
		case spec.LockToDefault && v != spec.Default:
			logger.Error(nil, "Ignoring a client-go feature gate's environment variable: the gate is locked", "variable", env, "value", raw, "locked", spec.Default)
		default:
			g.enabled[key] = v
			logger.V(2).Info("Client-go feature gate set from the environment", "feature", name, "enabled", v)
		}
	}
	return g, nil
}

// Off turns client-go's feature key off from here on, unless its
// KUBE_FEATURE_<name> environment variable is set: the operator's word
// stands. It reports whether the feature was on and is off now.
func Off(key features.Feature) bool {
	if _, set := os.LookupEnv("KUBE_FEATURE_" + string(key)); set {
		return false
	}
	current := features.FeatureGates()
	if !current.Enabled(key) {
		return false
	}
	features.ReplaceFeatureGates(without{Gates: current, off: key})
	return true
}

// without is gates with one feature off.
type without struct {
	features.Gates
	off features.Feature
}

func (w without) Enabled(key features.Feature) bool {
	return key != w.off && w.Gates.Enabled(key)
}
