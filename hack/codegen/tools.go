//go:build tools

// Package tools pins k8s.io/code-generator, the version matching client-go
// in the main go.mod; hack/update-codegen.sh builds its generators from here.
package tools

import (
	_ "k8s.io/code-generator"
)
