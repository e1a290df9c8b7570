// Command kustomize renders a kustomization to stdout as `kustomize build DIR`
// and `kubectl kustomize DIR` do, with the same engine
// (sigs.k8s.io/kustomize/api, the library kubectl's -k uses) and its default
// load restrictions. The unit tests build the kustomizations under artifacts/
// with it (hack/build-devtools.sh kustomize); the e2e tests render
// artifacts/deploy through the local cluster's overlay (hack/local-cluster.sh
// writes the overlay to $CLUSTER_DIR/deploy).
//
//	kustomize build DIR
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

func main() {
	if len(os.Args) != 3 || os.Args[1] != "build" {
		fmt.Fprintln(os.Stderr, "usage: kustomize build DIR")
		os.Exit(2)
	}
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kustomize:", err)
		os.Exit(1)
	}
	out, err := resources.AsYaml()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kustomize:", err)
		os.Exit(1)
	}
	if _, err := os.Stdout.Write(out); err != nil {
		fmt.Fprintln(os.Stderr, "kustomize:", err)
		os.Exit(1)
	}
}
