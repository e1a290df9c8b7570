package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// An image is a single-layer image with no base: its files and its config.
type image struct {
	Files      []file
	User       string
	Entrypoint []string
	Env        []string
}

// A file of the image: its path in the image, where its content comes from
// on this machine, and its mode. Files belong to root; directories are added.
type file struct {
	Path   string
	Source string
	Mode   int64
}

// defaultPath is the PATH a Dockerfile build gives an image with no base.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// podjanitorImage is the image the Dockerfile describes: the static binary, CA
// certificates, and passwd/group files naming the non-root user 65532 that it
// runs as. hack/image/image_test.go checks that the Dockerfile's final stage
// copies the same paths and sets the same user and entrypoint.
func podjanitorImage(binary, caCerts, dir string) image {
	return image{
		Files: []file{
			{Path: "/etc/group", Source: path.Join(dir, "group"), Mode: 0o644},
			{Path: "/etc/passwd", Source: path.Join(dir, "passwd"), Mode: 0o644},
			{Path: "/etc/ssl/certs/ca-certificates.crt", Source: caCerts, Mode: 0o644},
			{Path: "/podjanitor", Source: binary, Mode: 0o755},
		},
		User:       "65532:65532",
		Entrypoint: []string{"/podjanitor"},
		Env:        []string{defaultPath},
	}
}

// pauseImage is the pod sandbox image of the local cluster's real node: the
// static program of hack/node/pause.c, as user 65535 like the upstream one.
func pauseImage(binary string) image {
	return image{
		Files:      []file{{Path: "/pause", Source: binary, Mode: 0o755}},
		User:       "65535:65535",
		Entrypoint: []string{"/pause"},
		Env:        []string{defaultPath},
	}
}

// epoch is every file's and the image's time, so that the same inputs give
// the same digests.
var epoch = time.Unix(0, 0).UTC()

// OCI media types and annotations.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
	// annotationImageName is the name containerd's import gives the image.
	annotationImageName = "io.containerd.image.name"
	// annotationRefName is the OCI layout's own name of a manifest.
	annotationRefName = "org.opencontainers.image.ref.name"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type imageConfig struct {
	Created      time.Time      `json:"created"`
	Architecture string         `json:"architecture"`
	OS           string         `json:"os"`
	Config       runtimeConfig  `json:"config"`
	RootFS       rootFS         `json:"rootfs"`
	History      []historyEntry `json:"history"`
}

type runtimeConfig struct {
	User       string   `json:"User"`
	Env        []string `json:"Env"`
	Entrypoint []string `json:"Entrypoint"`
	WorkingDir string   `json:"WorkingDir"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type historyEntry struct {
	Created   time.Time `json:"created"`
	CreatedBy string    `json:"created_by"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

// imageNames returns name and, if it differs, the name the container runtime
// interface resolves it to (docker.io/library/x, docker.io/local/x): the CRI
// looks an image up by that normalised name only, so an image imported
// without it would be pulled.
func imageNames(name string) ([]string, error) {
	if name == "" || strings.ContainsAny(name, " @") || strings.HasSuffix(name, ":") {
		return nil, fmt.Errorf("image name %q: want [registry/]repository:tag", name)
	}
	repo := name
	if i := strings.LastIndexByte(name, ':'); i > strings.LastIndexByte(name, '/') {
		repo = name[:i]
	} else {
		return nil, fmt.Errorf("image name %q has no tag", name)
	}
	first, _, hasSlash := strings.Cut(repo, "/")
	if hasSlash && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return []string{name}, nil // names its registry already
	}
	full := "docker.io/" + name
	if !hasSlash {
		full = "docker.io/library/" + name
	}
	return []string{name, full}, nil
}

// layerTar returns the image's filesystem as an uncompressed tar: parent
// directories first, then the files, in path order.
func layerTar(img image) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	files := append([]file(nil), img.Files...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	dirs := map[string]bool{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("image file %q: want a clean absolute path", f.Path)
		}
		var parents []string
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			hdr := &tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(f.Source)
		if err != nil {
			return nil, fmt.Errorf("image file %s: %w", f.Path, err)
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.Path[1:], Mode: f.Mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// blob is one file of the OCI layout's blobs/sha256/.
type blob struct {
	digest string
	data   []byte
}

// writeArchive writes img as an OCI image layout in a tar archive (what
// `ctr images import` and `docker load` read), named name and its normalised
// form, for linux/arch. It returns the manifest's digest.
func writeArchive(w io.Writer, img image, name, arch string) (string, error) {
	names, err := imageNames(name)
	if err != nil {
		return "", err
	}
	layer, err := layerTar(img)
	if err != nil {
		return "", err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return "", err
	}
	zw.ModTime = epoch
	if _, err := zw.Write(layer); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	layerBlob := blob{digestOf(gz.Bytes()), gz.Bytes()}

	cfg, err := json.Marshal(imageConfig{
		Created: epoch, Architecture: arch, OS: "linux",
		Config:  runtimeConfig{User: img.User, Env: img.Env, Entrypoint: img.Entrypoint, WorkingDir: "/"},
		RootFS:  rootFS{Type: "layers", DiffIDs: []string{digestOf(layer)}},
		History: []historyEntry{{Created: epoch, CreatedBy: "hack/image"}},
	})
	if err != nil {
		return "", err
	}
	cfgBlob := blob{digestOf(cfg), cfg}

	man, err := json.Marshal(manifest{
		SchemaVersion: 2, MediaType: mediaTypeManifest,
		Config: descriptor{MediaType: mediaTypeConfig, Digest: cfgBlob.digest, Size: int64(len(cfg))},
		Layers: []descriptor{{MediaType: mediaTypeLayer, Digest: layerBlob.digest, Size: int64(len(layerBlob.data))}},
	})
	if err != nil {
		return "", err
	}
	manBlob := blob{digestOf(man), man}

	idx := index{SchemaVersion: 2, MediaType: mediaTypeIndex}
	for _, n := range names {
		idx.Manifests = append(idx.Manifests, descriptor{
			MediaType: mediaTypeManifest, Digest: manBlob.digest, Size: int64(len(man)),
			Platform:    &platform{Architecture: arch, OS: "linux"},
			Annotations: map[string]string{annotationImageName: n, annotationRefName: n},
		})
	}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return "", err
	}

	tw := tar.NewWriter(w)
	add := func(name string, data []byte, mode int64) error {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return "", err
		}
	}
	for _, b := range []blob{layerBlob, cfgBlob, manBlob} {
		if err := add("blobs/sha256/"+strings.TrimPrefix(b.digest, "sha256:"), b.data, 0o644); err != nil {
			return "", err
		}
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return "", err
	}
	if err := add("index.json", idxJSON, 0o644); err != nil {
		return "", err
	}
	return manBlob.digest, tw.Close()
}
