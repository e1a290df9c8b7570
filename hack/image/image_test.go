package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/podjanitor/podjanitor/internal/ociarchive"
)

// TestDockerfileDescribesTheSameImage reads the Dockerfile's final stage and
// checks it against podjanitorImage: the same files at the same paths (the
// ones copied from the build context from the same sources), the same user and
// the same entrypoint, and no base image.
func TestDockerfileDescribesTheSameImage(t *testing.T) {
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var from string
	var copies [][]string // arguments of each COPY of the final stage
	var user string
	var entrypoint []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			from, copies, user, entrypoint = f[len(f)-1], nil, "", nil
			if len(f) >= 4 && strings.EqualFold(f[len(f)-2], "AS") {
				from = f[len(f)-3]
			}
		case "COPY":
			copies = append(copies, f[1:])
		case "USER":
			user = f[1]
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(sc.Text(), f[0]))), &entrypoint); err != nil {
				t.Fatalf("Dockerfile ENTRYPOINT: want the JSON form: %v", err)
			}
		}
	}
	if from != "scratch" {
		t.Errorf("Dockerfile final stage is FROM %s, want scratch (the image has no base)", from)
	}
	img := podjanitorImage("/out/podjanitor", "/etc/ssl/certs/ca-certificates.crt", "hack/image")
	want := map[string]file{}
	for _, f := range img.Files {
		want[f.Path] = f
	}
	got := map[string]bool{}
	for _, c := range copies {
		fromStage := strings.HasPrefix(c[0], "--from=")
		if fromStage {
			c = c[1:]
		}
		if len(c) != 2 {
			t.Errorf("Dockerfile: COPY %s: want one source and one destination", strings.Join(c, " "))
			continue
		}
		src, dst := c[0], c[1]
		got[dst] = true
		f, ok := want[dst]
		switch {
		case !ok:
			t.Errorf("Dockerfile copies %s to %s; hack/image's image has no such file", src, dst)
		case !fromStage && src != f.Source:
			t.Errorf("Dockerfile copies %s from %s; hack/image takes it from %s", dst, src, f.Source)
		case fromStage && filepath.Base(src) != filepath.Base(f.Source):
			t.Errorf("Dockerfile copies %s from the build stage's %s; hack/image takes it from a file named %s", dst, src, f.Source)
		}
	}
	for p := range want {
		if !got[p] {
			t.Errorf("hack/image's image has %s; the Dockerfile does not copy it", p)
		}
	}
	if user != img.User {
		t.Errorf("Dockerfile USER %q, hack/image %q", user, img.User)
	}
	if !slices.Equal(entrypoint, img.Entrypoint) {
		t.Errorf("Dockerfile ENTRYPOINT %q, hack/image %q", entrypoint, img.Entrypoint)
	}
	for _, f := range img.Files {
		if strings.HasPrefix(f.Source, "hack/image/") {
			if _, err := os.Stat(filepath.Join("../..", f.Source)); err != nil {
				t.Errorf("image file %s: %v", f.Path, err)
			}
		}
	}
}

// TestPasswdNamesTheUser: the user the image runs as has an entry in its
// passwd and group files, and it is not root.
func TestPasswdNamesTheUser(t *testing.T) {
	img := podjanitorImage("", "", ".")
	uid, gid, _ := strings.Cut(img.User, ":")
	if uid == "0" || gid == "0" {
		t.Fatalf("the image runs as %s, want a non-root user and group", img.User)
	}
	for file, id := range map[string]string{"passwd": uid, "group": gid} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Split(line, ":"); len(f) >= 3 && f[2] == id {
				found = true
			}
		}
		if !found {
			t.Errorf("%s has no entry with id %s", file, id)
		}
	}
}

func TestImageNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"local/podjanitor:dev", []string{"local/podjanitor:dev", "docker.io/local/podjanitor:dev"}},
		{"podjanitor:dev", []string{"podjanitor:dev", "docker.io/library/podjanitor:dev"}},
		{"docker.io/local/x:1", []string{"docker.io/local/x:1"}},
		{"registry.example.com:5000/x/y:1", []string{"registry.example.com:5000/x/y:1"}},
		{"localhost/x:1", []string{"localhost/x:1"}},
	} {
		got, err := imageNames(tc.name)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("imageNames(%q) = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "local/x", "x:", "registry:5000/x", "x@sha256:00", "a b:1"} {
		if got, err := imageNames(bad); err == nil {
			t.Errorf("imageNames(%q) = %q, want an error", bad, got)
		}
	}
}

// TestArchive writes an image and reads it back as an importer would: every
// blob matches its digest, the index names the manifest twice, the config
// carries the user and entrypoint and the layer's diff ID, and the layer holds
// exactly the files, with their modes, owned by root.
func TestArchive(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "podjanitor")
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(bin, []byte("\x7fELF binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, []byte("certificates"), 0o600); err != nil {
		t.Fatal(err)
	}
	img := podjanitorImage(bin, ca, ".")
	var buf bytes.Buffer
	digest, err := writeArchive(&buf, img, "local/podjanitor:dev", "amd64")
	if err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if d2, err := writeArchive(&again, img, "local/podjanitor:dev", "amd64"); err != nil || d2 != digest || !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Errorf("a second archive of the same inputs differs (digest %s, then %s, %v)", digest, d2, err)
	}

	files, err := ociarchive.Read(&buf, nil)
	if err != nil {
		t.Fatal(err)
	}
	blobOf := func(d string) []byte {
		t.Helper()
		b, err := files.Blob(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", files["oci-layout"])
	}
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range idx.Manifests {
		if m.Digest != digest || m.MediaType != mediaTypeManifest || m.Platform == nil || m.Platform.OS != "linux" || m.Platform.Architecture != "amd64" {
			t.Errorf("index entry %+v, want manifest %s for linux/amd64", m, digest)
		}
		names = append(names, m.Annotations[annotationImageName])
	}
	if want := []string{"local/podjanitor:dev", "docker.io/local/podjanitor:dev"}; !slices.Equal(names, want) {
		t.Errorf("index names %q, want %q", names, want)
	}
	var man manifest
	if err := json.Unmarshal(blobOf(digest), &man); err != nil {
		t.Fatal(err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(blobOf(man.Config.Digest), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65532:65532" || !slices.Equal(cfg.Config.Entrypoint, []string{"/podjanitor"}) || cfg.OS != "linux" {
		t.Errorf("config %+v", cfg)
	}
	if len(man.Layers) != 1 || man.Layers[0].MediaType != mediaTypeLayer {
		t.Fatalf("layers %+v, want one gzipped tar", man.Layers)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blobOf(man.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != digestOf(layer) {
		t.Errorf("diff IDs %q, want the uncompressed layer's digest %s", cfg.RootFS.DiffIDs, digestOf(layer))
	}
	var entries []string
	lr := tar.NewReader(bytes.NewReader(layer))
	for {
		hdr, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", hdr.Name, hdr.Uid, hdr.Gid)
		}
		entries = append(entries, hdr.Name+" "+strings.TrimPrefix(os.FileMode(hdr.Mode).String(), "-"))
		if hdr.Name == "podjanitor" {
			if b, _ := io.ReadAll(lr); string(b) != "\x7fELF binary" {
				t.Errorf("podjanitor holds %q", b)
			}
		}
	}
	want := []string{"etc/ rwxr-xr-x", "etc/group rw-r--r--", "etc/passwd rw-r--r--", "etc/ssl/ rwxr-xr-x",
		"etc/ssl/certs/ rwxr-xr-x", "etc/ssl/certs/ca-certificates.crt rw-r--r--", "podjanitor rwxr-xr-x"}
	sort.Strings(entries)
	if !slices.Equal(entries, want) {
		t.Errorf("layer entries\n%q\nwant\n%q", entries, want)
	}
}

func TestArchiveMissingFile(t *testing.T) {
	img := pauseImage(filepath.Join(t.TempDir(), "no-such-binary"))
	if _, err := writeArchive(io.Discard, img, "local/pause:1", "amd64"); err == nil || !strings.Contains(err.Error(), "/pause") {
		t.Errorf("err = %v, want one naming the image file /pause", err)
	}
}
