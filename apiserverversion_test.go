package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/runtime"
	kubeversion "k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/podjanitor/podjanitor/internal/clientfeatures"
)

// TestCheckAPIServer: on an API server older than a part's floor, podjanitor
// says so in one line naming the version and the part, and goes on without
// streaming lists, or stops when --tenant-policies asked for tenant policies.
func TestCheckAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name           string
		info           kubeversion.Info
		tenantPolicies bool
		wantErr        string // "" no error
		wantLine       string // "" no line
		wantWatchList  bool
	}{
		{name: "1.35, every part", info: kubeversion.Info{Major: "1", Minor: "35", GitVersion: "v1.35.4"}, tenantPolicies: true, wantWatchList: true},
		{name: "1.34 on a provider, every part", info: kubeversion.Info{Major: "1", Minor: "34+", GitVersion: "v1.34.2-gke.1"}, tenantPolicies: true, wantWatchList: true},
		{name: "1.33, no streaming lists", info: kubeversion.Info{Major: "1", Minor: "33", GitVersion: "v1.33.5"}, tenantPolicies: true,
			wantLine: "API server v1.33.5 is older than 1.34, which streaming lists (WatchList) need: the informers list instead"},
		{name: "1.32 with --tenant-policies", info: kubeversion.Info{Major: "1", Minor: "32", GitVersion: "v1.32.9"}, tenantPolicies: true,
			wantErr: "API server v1.32.9 is older than 1.33, which tenant policies (--tenant-policies) need", wantWatchList: true},
		{name: "1.32 without tenant policies", info: kubeversion.Info{Major: "1", Minor: "32", GitVersion: "v1.32.9"},
			wantLine: "API server v1.32.9 is older than 1.34, which streaming lists (WatchList) need"},
		{name: "no major and minor, the git version's", info: kubeversion.Info{GitVersion: "v1.31.0"},
			wantLine: "API server v1.31.0 is older than 1.34, which streaming lists (WatchList) need"},
		{name: "unparsable version", info: kubeversion.Info{GitVersion: "v0.0.0-master+$Format:%H$"}, tenantPolicies: true,
			wantLine: "Unknown API server version", wantWatchList: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			installClientFeatures(t)
			disco := fake.NewClientset().Discovery().(*fakediscovery.FakeDiscovery)
			disco.FakedServerVersion = &tc.info
			var out bytes.Buffer
			logger := funcr.New(func(prefix, args string) { out.WriteString(args + "\n") }, funcr.Options{})

			err := checkAPIServer(logger, disco, tc.tenantPolicies)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one with %q", err, tc.wantErr)
			}
			lines := strings.Count(out.String(), "\n")
			switch {
			case tc.wantLine == "" && lines != 0:
				t.Errorf("logged %q, want nothing", out.String())
			case tc.wantLine != "" && (lines != 1 || !strings.Contains(out.String(), tc.wantLine)):
				t.Errorf("logged %q, want one line with %q", out.String(), tc.wantLine)
			}
			if got := features.FeatureGates().Enabled(features.WatchListClient); got != tc.wantWatchList {
				t.Errorf("WatchListClient on = %v, want %v", got, tc.wantWatchList)
			}
		})
	}
}

// TestCheckAPIServerUnreadable: a version that cannot be read is logged and
// podjanitor goes on with every part.
func TestCheckAPIServerUnreadable(t *testing.T) {
	installClientFeatures(t)
	client := fake.NewClientset()
	client.PrependReactor("get", "version", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	var out bytes.Buffer
	logger := funcr.New(func(prefix, args string) { out.WriteString(args + "\n") }, funcr.Options{})
	if err := checkAPIServer(logger, client.Discovery(), true); err != nil {
		t.Fatalf("error %v, want none", err)
	}
	if !strings.Contains(out.String(), "connection refused") {
		t.Errorf("logged %q, want the error", out.String())
	}
	if !features.FeatureGates().Enabled(features.WatchListClient) {
		t.Error("WatchListClient went off")
	}
}

// installClientFeatures installs podjanitor's client-go feature gates, as
// connect does before checkAPIServer, until the test ends.
func installClientFeatures(t *testing.T) {
	t.Helper()
	saved := features.FeatureGates()
	t.Cleanup(func() { features.ReplaceFeatureGates(saved) })
	if err := clientfeatures.Install(logr.Discard()); err != nil {
		t.Fatal(err)
	}
}
