// Command image writes a container image as an OCI archive without a
// container engine or a base image to pull: the image the Dockerfile
// describes (the static podjanitor binary, CA certificates, a non-root user),
// or the local cluster's pause image. `ctr images import` loads the archive
// (hack/local-cluster.sh load-image); `docker load` reads it too.
//
//	go run ./hack/image -kind podjanitor -binary _output/bin/podjanitor -name local/podjanitor:dev -o podjanitor.tar
//	go run ./hack/image -kind pause -binary pause -name local/pause:1 -o pause.tar
//
// The archive names the image both as given and as the container runtime
// interface normalises it (local/x:1 and docker.io/local/x:1). It prints the
// manifest's digest. Same inputs, same digest.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

func main() {
	kind := flag.String("kind", "podjanitor", "podjanitor or pause")
	binary := flag.String("binary", "", "the static binary the image runs (required)")
	name := flag.String("name", "", "image name with a tag, e.g. local/podjanitor:dev (required)")
	out := flag.String("o", "", "output archive (required)")
	arch := flag.String("arch", runtime.GOARCH, "the binary's architecture")
	caCerts := flag.String("ca-certificates", "/etc/ssl/certs/ca-certificates.crt", "podjanitor: the CA certificate bundle to include")
	flag.Parse()
	if *binary == "" || *name == "" || *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "image: -binary, -name and -o are required")
		flag.Usage()
		os.Exit(2)
	}
	var img image
	switch *kind {
	case "podjanitor":
		dir, err := sourceDir()
		if err != nil {
			fmt.Fprintln(os.Stderr, "image:", err)
			os.Exit(1)
		}
		img = podjanitorImage(*binary, *caCerts, dir)
	case "pause":
		img = pauseImage(*binary)
	default:
		fmt.Fprintf(os.Stderr, "image: -kind %q: want podjanitor or pause\n", *kind)
		os.Exit(2)
	}
	digest, err := build(img, *name, *arch, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Println(digest)
}

// sourceDir is hack/image, where passwd and group are, found from the
// working directory (the repository root or hack/image).
func sourceDir() (string, error) {
	for _, d := range []string{"hack/image", "."} {
		if _, err := os.Stat(filepath.Join(d, "passwd")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("hack/image/passwd not found; run from the repository root")
}

// build writes the archive next to out and renames it into place.
func build(img image, name, arch, out string) (string, error) {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".image-*.tar")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	digest, err := writeArchive(tmp, img, name, arch)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return "", err
	}
	return digest, os.Rename(tmp.Name(), out)
}
