// Command etcd is upstream etcd, built from its Go module for the local cluster.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
