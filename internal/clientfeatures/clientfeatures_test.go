package clientfeatures

import (
	"bytes"
	"flag"
	"strings"
	"testing"

	"k8s.io/client-go/features"
	"k8s.io/klog/v2"
)

// verbose2 sends klog's output at -v=2 (hack/run.sh's) to a buffer.
func verbose2(t *testing.T) *bytes.Buffer {
	t.Helper()
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Parse([]string{"-v=2", "-logtostderr=false", "-alsologtostderr=false", "-stderrthreshold=FATAL"}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		klog.Flush()
		klog.SetOutput(nil)
		_ = fs.Parse([]string{"-v=0", "-logtostderr=true"})
	})
	return &buf
}

// TestInstallSilencesTheDefaults is make run's first screen: after Install,
// reading client-go's gates at -v=2 (as the reflector does at start-up) prints
// no "Feature gate default state" lines. Without Install client-go's own gates
// print one line per feature on that first read.
func TestInstallSilencesTheDefaults(t *testing.T) {
	buf := verbose2(t)
	t.Setenv("KUBE_FEATURE_ClientsPreferCBOR", "true")
	if err := Install(klog.Background()); err != nil {
		t.Fatal(err)
	}
	if !features.FeatureGates().Enabled(features.ClientsPreferCBOR) {
		t.Error("KUBE_FEATURE_ClientsPreferCBOR=true: ClientsPreferCBOR is off, want on")
	}
	_ = features.FeatureGates().Enabled(features.WatchListClient)
	klog.Flush()
	out := buf.String()
	if strings.Contains(out, "Feature gate default state") {
		t.Errorf("client-go's default feature gate states were logged:\n%s", out)
	}
	if n := strings.Count(out, "Client-go feature gate set from the environment"); n != 1 || !strings.Contains(out, `feature="ClientsPreferCBOR" enabled=true`) {
		t.Errorf("want one line for KUBE_FEATURE_ClientsPreferCBOR=true, got %d:\n%s", n, out)
	}
}

func TestFromEnvironment(t *testing.T) {
	known := registry{}
	if err := features.AddFeaturesToExistingFeatureGates(known); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"KUBE_FEATURE_WatchListClient":         "false",
		"KUBE_FEATURE_ClientsAllowCBOR":        "maybe", // not a boolean: the default stays
		"KUBE_FEATURE_NoSuchClientGate":        "true",  // not a gate: ignored
		"KUBE_FEATURE_InformerResourceVersion": "true",
	}
	g, err := fromEnvironment(klog.Background(), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if len(g.enabled) != len(known) {
		t.Errorf("%d gates, want client-go's %d", len(g.enabled), len(known))
	}
	for k, spec := range known {
		want := spec.Default
		switch {
		case k == features.WatchListClient && !spec.LockToDefault:
			want = false
		case k == features.InformerResourceVersion && !spec.LockToDefault:
			want = true
		}
		if got := g.Enabled(k); got != want {
			t.Errorf("%s: %v, want %v", k, got, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("an unknown feature did not panic")
		}
	}()
	g.Enabled("NoSuchClientGate")
}

// TestOff turns WatchListClient off (on by default since client-go 1.35), once;
// KUBE_FEATURE_WatchListClient keeps it as the operator set it.
func TestOff(t *testing.T) {
	for _, tc := range []struct {
		env     string // KUBE_FEATURE_WatchListClient; "" unset
		wantOff bool   // Off's answer
		wantOn  bool   // the gate afterwards
	}{
		{env: "", wantOff: true, wantOn: false},
		{env: "true", wantOff: false, wantOn: true},
		{env: "false", wantOff: false, wantOn: false},
	} {
		t.Run("env="+tc.env, func(t *testing.T) {
			saved := features.FeatureGates()
			t.Cleanup(func() { features.ReplaceFeatureGates(saved) })
			if tc.env != "" {
				t.Setenv("KUBE_FEATURE_WatchListClient", tc.env)
			}
			if err := Install(klog.Background()); err != nil {
				t.Fatal(err)
			}
			if got := Off(features.WatchListClient); got != tc.wantOff {
				t.Errorf("Off = %v, want %v", got, tc.wantOff)
			}
			if got := features.FeatureGates().Enabled(features.WatchListClient); got != tc.wantOn {
				t.Errorf("WatchListClient on = %v, want %v", got, tc.wantOn)
			}
			if Off(features.WatchListClient) {
				t.Error("a second Off = true, want false: the feature was off already")
			}
			if !features.FeatureGates().Enabled(features.InformerResourceVersion) {
				t.Error("InformerResourceVersion went off with WatchListClient")
			}
		})
	}
}
