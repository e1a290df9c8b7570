//go:build tools

// Package devtools pins the release and chart tools that are not part of the
// local cluster: helm (chart lint, template and install tests) and
// cyclonedx-gomod (the SBOM of `make release`). hack/build-devtools.sh builds
// them into _output/bin. A module of its own, so that their Kubernetes
// libraries do not move the daemon's or the local cluster's pins.
package devtools

import (
	_ "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod"
	_ "helm.sh/helm/v3/cmd/helm"
)
