package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// kubeVersion is a line of hack/k8s/versions: a supported Kubernetes minor,
// the release the local cluster runs for it, and the Go module pinning it.
type kubeVersion struct {
	minor, release, module string
}

func kubeVersions(t *testing.T) []kubeVersion {
	t.Helper()
	data, err := os.ReadFile("hack/k8s/versions")
	if err != nil {
		t.Fatal(err)
	}
	var vs []kubeVersion
	for i, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) != 3 {
			t.Fatalf("hack/k8s/versions:%d: %q: want minor, release, module", i+1, line)
		}
		vs = append(vs, kubeVersion{f[0], f[1], f[2]})
	}
	if len(vs) == 0 {
		t.Fatal("hack/k8s/versions lists no minor")
	}
	return vs
}

// TestKubeVersions: hack/k8s/versions lists minors oldest first, each with a
// release of its own minor, pinned by its module's go.mod (k8s.io/kubernetes
// at the release, its staging modules at v0.MINOR.PATCH); one is the tools
// module's (hack/tools), whose binaries land in _output/bin.
func TestKubeVersions(t *testing.T) {
	vs := kubeVersions(t)
	prev, tools := 0, 0
	for _, v := range vs {
		var major, minor, patch int
		if _, err := fmt.Sscanf(v.release, "v%d.%d.%d", &major, &minor, &patch); err != nil || major != 1 {
			t.Errorf("%s: release %q, want v1.MINOR.PATCH", v.minor, v.release)
			continue
		}
		if v.minor != fmt.Sprintf("1.%d", minor) {
			t.Errorf("minor %s: release %s is of another minor", v.minor, v.release)
		}
		if minor <= prev {
			t.Errorf("minor %s: after 1.%d, want oldest first", v.minor, prev)
		}
		prev = minor
		if v.module == "hack/tools" {
			tools++
		}
		if v.module != "hack/tools" && v.module != "hack/k8s/"+v.minor {
			t.Errorf("minor %s: module %s, want hack/k8s/%s", v.minor, v.module, v.minor)
		}
		gomod, err := os.ReadFile(filepath.Join(v.module, "go.mod"))
		if err != nil {
			t.Errorf("minor %s: %v (KUBE_VERSION=%s hack/build-tools.sh writes it)", v.minor, err, v.minor)
			continue
		}
		if !regexp.MustCompile(`(?m)^\s*(require\s+)?k8s\.io/kubernetes ` + regexp.QuoteMeta(v.release) + `$`).Match(gomod) {
			t.Errorf("%s/go.mod does not require k8s.io/kubernetes %s", v.module, v.release)
		}
		staging := fmt.Sprintf("v0.%d.%d", minor, patch)
		replaces := regexp.MustCompile(`(?m)^\s*(k8s\.io/[a-z0-9-]+) => k8s\.io/[a-z0-9-]+ (\S+)$`).FindAllSubmatch(gomod, -1)
		if len(replaces) < 20 {
			t.Errorf("%s/go.mod replaces %d staging modules, want them all", v.module, len(replaces))
		}
		for _, r := range replaces {
			if string(r[2]) != staging {
				t.Errorf("%s/go.mod: %s at %s, want %s", v.module, r[1], r[2], staging)
			}
		}
	}
	if tools != 1 {
		t.Errorf("%d minors are the tools module's (hack/tools), want one: kind's node and the default cluster", tools)
	}
}

// TestReadmeSupportedVersions: README's supported versions name every minor
// of hack/k8s/versions and the floors podjanitor checks at start.
func TestReadmeSupportedVersions(t *testing.T) {
	rows := sectionTable(t, "README.md", "Supported Kubernetes versions")
	text := ""
	for _, r := range rows {
		text += strings.Join(r, " | ") + "\n"
	}
	for _, v := range kubeVersions(t) {
		if !strings.Contains(text, v.minor) {
			t.Errorf("README's supported versions do not name %s", v.minor)
		}
	}
	for part, minor := range map[string]int{"WatchList": watchListMinMinor, "x-kubernetes-validations": tenantPoliciesMinMinor} {
		found := false
		for _, r := range rows {
			if strings.Contains(r[0], part) && strings.Contains(strings.Join(r[1:], " "), fmt.Sprintf("1.%d", minor)) {
				found = true
			}
		}
		if !found {
			t.Errorf("README's supported versions: no row for %s at 1.%d", part, minor)
		}
	}
}
