package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestSpecOf(t *testing.T) {
	wd, _ := os.Getwd()
	for _, c := range []struct {
		args      []string
		want      string
		inProcess bool
	}{
		{[]string{"--root", "/run/x", "--log", "l.json", "--log-format", "json", "create", "--bundle", "/b", "--pid-file", "p", "id"}, "/b/config.json", true},
		{[]string{"create", "-b", "/b2", "id"}, "/b2/config.json", true},
		{[]string{"--systemd-cgroup", "run", "--bundle=/b3", "id"}, "/b3/config.json", true},
		{[]string{"create", "id"}, wd + "/config.json", true},
		{[]string{"--root", "/run/x", "exec", "--process", "/tmp/p.json", "--detach", "id"}, "/tmp/p.json", false},
		{[]string{"exec", "-p", "/tmp/p2.json", "id"}, "/tmp/p2.json", false},
		{[]string{"exec", "--bundle", "/b", "id", "sh"}, "", false}, // exec has no bundle
		{[]string{"--root", "/run/x", "start", "id"}, "", false},
		{[]string{"--root", "create", "start", "id"}, "", false}, // "create" is --root's value
		{[]string{"delete", "--force", "id"}, "", false},
	} {
		got, inProcess := specOf(c.args)
		if got != c.want || inProcess != c.inProcess {
			t.Errorf("specOf(%q) = %q, %v; want %q, %v", c.args, got, inProcess, c.want, c.inProcess)
		}
	}
}

func TestFilterBundle(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.json")
	spec := `{"ociVersion":"1.0.2","process":{"args":["/sbin/init"],"capabilities":{` +
		`"bounding":["CAP_CHOWN","CAP_SYS_RESOURCE","CAP_SYS_ADMIN","CAP_FUTURE"],` +
		`"effective":["CAP_SYS_RESOURCE"],"permitted":["CAP_CHOWN","CAP_SYS_RESOURCE"]}},"root":{"path":"rootfs"}}`
	if err := os.WriteFile(path, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	// Everything but CAP_SYS_RESOURCE (24), as on the project's machines.
	bounding := uint64(0x1fffeffffff)
	if err := filterFile(path, true, bounding); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	var got struct {
		OCIVersion string `json:"ociVersion"`
		Process    struct {
			Args         []string            `json:"args"`
			Capabilities map[string][]string `json:"capabilities"`
		} `json:"process"`
		Root struct {
			Path string `json:"path"`
		} `json:"root"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"bounding":  {"CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_FUTURE"},
		"effective": {},
		"permitted": {"CAP_CHOWN"},
	}
	if !reflect.DeepEqual(got.Process.Capabilities, want) {
		t.Errorf("capabilities = %v, want %v", got.Process.Capabilities, want)
	}
	if got.OCIVersion != "1.0.2" || got.Root.Path != "rootfs" || !reflect.DeepEqual(got.Process.Args, []string{"/sbin/init"}) {
		t.Errorf("other fields changed: %s", raw)
	}

	// Nothing to drop: the file is left as it was, byte for byte.
	if err := os.WriteFile(path, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := filterFile(path, true, ^uint64(0)); err != nil {
		t.Fatal(err)
	}
	if raw, _ := os.ReadFile(path); string(raw) != spec {
		t.Errorf("rewritten with nothing to drop: %s", raw)
	}
}

func TestFilterExecProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "process.json")
	proc := `{"args":["cat","/kind/version"],"capabilities":{"bounding":["CAP_SYS_RESOURCE","CAP_KILL"],"effective":["CAP_KILL"]}}`
	if err := os.WriteFile(path, []byte(proc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := filterFile(path, false, 0x1fffeffffff); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	var got struct {
		Args         []string            `json:"args"`
		Capabilities map[string][]string `json:"capabilities"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"bounding": {"CAP_KILL"}, "effective": {"CAP_KILL"}}
	if !reflect.DeepEqual(got.Capabilities, want) || len(got.Args) != 2 {
		t.Errorf("process = %s", raw)
	}
}

func TestBoundingSet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "status")
	os.WriteFile(path, []byte("Name:\tx\nCapEff:\t0000000000000000\nCapBnd:\t000001fffeffffff\n"), 0o600)
	got, err := boundingSet(path)
	if err != nil || got != 0x1fffeffffff {
		t.Fatalf("boundingSet = %x, %v", got, err)
	}
}

func TestRecordTask(t *testing.T) {
	log := filepath.Join(t.TempDir(), "tasks")
	for _, b := range []string{"/s/io.containerd.runtime.v2.task/moby/abc", "/s/io.containerd.runtime.v2.task/moby/def/"} {
		if err := recordTask(log, filepath.Clean(b)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if want := "moby/abc\nmoby/def\n"; string(got) != want {
		t.Errorf("log = %q, want %q", got, want)
	}
}
