// Command kustomize is `kustomize build DIR` from sigs.k8s.io/kustomize/api
// (the library kubectl's -k uses), so that the tests can build the
// kustomizations under artifacts/ as `kubectl apply -k` would.
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
	os.Stdout.Write(out)
}
