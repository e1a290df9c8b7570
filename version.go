package main

import "fmt"

// controllerName is podjanitor's name as a controller: in its events, its
// metrics, its workqueue and its lease.
const controllerName = "podjanitor"

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

// printVersion is the output of --version.
func printVersion() {
	fmt.Printf("podjanitor %s (commit %s)\n", version, commit)
}
