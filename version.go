package main

import "fmt"

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

// printVersion is the output of --version.
func printVersion() {
	fmt.Printf("podjanitor %s (commit %s)\n", version, commit)
}
