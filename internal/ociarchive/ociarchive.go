// Package ociarchive reads image archives in the OCI image layout (a tar of
// oci-layout, index.json and blobs/sha256/<hex>), as hack/image writes them,
// for the tests that check such archives.
package ociarchive

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Files are an archive's files by path.
type Files map[string][]byte

// Read reads the files of an archive; keep (nil: every file) says which to hold.
func Read(r io.Reader, keep func(*tar.Header) bool) (Files, error) {
	files := Files{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if keep != nil && !keep(hdr) {
			continue
		}
		if files[hdr.Name], err = io.ReadAll(tr); err != nil {
			return nil, fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
}

// Blob is the blob of digest ("sha256:<hex>"): an error when it is missing
// or its content has another digest.
func (f Files) Blob(digest string) ([]byte, error) {
	b, ok := f["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		return nil, fmt.Errorf("blob %s missing", digest)
	}
	sum := sha256.Sum256(b)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return nil, fmt.Errorf("blob %s has digest %s", digest, got)
	}
	return b, nil
}

// ImageDigests identify the archive's first image: its manifest's digest (a
// repository digest names it) and its config's (the image ID).
func (f Files) ImageDigests() (manifest, config string, err error) {
	var idx struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(f["index.json"], &idx); err != nil {
		return "", "", fmt.Errorf("index.json: %w", err)
	}
	if len(idx.Manifests) == 0 {
		return "", "", errors.New("index.json: no manifest")
	}
	manifest = idx.Manifests[0].Digest
	b, err := f.Blob(manifest)
	if err != nil {
		return "", "", err
	}
	var man struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	if err := json.Unmarshal(b, &man); err != nil || man.Config.Digest == "" {
		return "", "", fmt.Errorf("manifest %s: no config digest (%v)", manifest, err)
	}
	return manifest, man.Config.Digest, nil
}
