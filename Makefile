# podjanitor — see README.md. Run `make help` for the targets.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := build

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BIN     := _output/bin/podjanitor

include hack/docker.mk
include hack/bench.mk

.PHONY: help build tools devtools helm codegen verify-codegen cluster-up cluster-down cluster-status run demo test unit e2e test-versions vet fuzz release clean

# The Kubernetes minor of the local cluster (tools, cluster-up, run, e2e): one
# of hack/k8s/versions, e.g. KUBE_VERSION=1.35; default the newest.
KUBE_VERSION ?=
export KUBE_VERSION
# The minors test-versions runs on (1.35 1.36, oldest, newest); default every one.
KUBE_VERSIONS ?=

help: ## Show the targets.
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 16

build: ## Build the podjanitor binary into _output/bin/ (static, release flags).
	CGO_ENABLED=0 go build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) .

tools: ## Build the local cluster's binaries (etcd, kube-apiserver, kube-controller-manager, kwok; kubelet, kube-scheduler, kustomize).
	hack/build-tools.sh

devtools: ## Build helm and cyclonedx-gomod (hack/devtools/go.mod) and kustomize (hack/tools) into _output/bin/.
	hack/build-devtools.sh

helm: ## Build helm (chart tests) into _output/bin/.
	hack/build-devtools.sh helm

codegen: ## Generate the podjanitor.io API's code (deepcopy, clientset, informers, listers; k8s.io/code-generator) and its CRD (hack/crdgen).
	hack/update-codegen.sh

verify-codegen: ## Fail when the generated code or the CRD is stale (part of vet).
	hack/verify-codegen.sh

cluster-up: tools ## Start the local cluster (kubeconfig: _output/local/kubeconfig).
	hack/local-cluster.sh up

cluster-down: ## Stop the local cluster and remove its state.
	hack/local-cluster.sh down

cluster-status: ## Show whether the local cluster runs.
	hack/local-cluster.sh status

demo: ## Create the demo pods in the running local cluster.
	hack/demo/create.sh

run: ## Build everything, start the local cluster with demo pods, run podjanitor in the foreground.
	hack/run.sh

test: unit e2e ## All tests: vet, unit tests, end-to-end tests against a fresh local cluster.

vet: verify-codegen
	go vet ./...
	go vet -tags e2e ./test/e2e/
	cd test/promql && go vet ./...

# The chart and kustomize tests need helm and kustomize (hack/build-devtools.sh);
# PODJANITOR_REQUIRE_DEVTOOLS makes them fail, not skip, without them.
unit: vet ## Unit tests (no cluster needed): Go, chart (helm lint/template), kustomize builds, PromQL of the monitoring kit.
	hack/build-devtools.sh helm kustomize
	PODJANITOR_REQUIRE_DEVTOOLS=1 go test -race -count=1 ./...
	cd test/promql && go test -count=1 ./...

e2e: build tools helm image-archive ## End-to-end tests: brings a local cluster with a real node up in _output/e2e and down again (root).
	hack/e2e.sh

test-versions: build image-archive ## The e2e suite's version-sensitive core on each supported Kubernetes minor (hack/test-versions.sh).
	hack/test-versions.sh $(KUBE_VERSIONS)

fuzz: ## Run each fuzz target for FUZZTIME (default 30s).
	go test -run='^$$' -fuzz=FuzzParseDuration -fuzztime=$${FUZZTIME:-30s} ./policy/
	go test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$${FUZZTIME:-30s} ./policy/
	go test -run='^$$' -fuzz='^FuzzParking$$' -fuzztime=$${FUZZTIME:-30s} .

RELEASE_DIR      := _output/release
RELEASE_PLATFORMS := linux/amd64 linux/arm64

release: ## Static binaries for $(RELEASE_PLATFORMS), SHA-256 checksums and a CycloneDX SBOM in _output/release/.
	hack/release.sh "$(VERSION)" "$(COMMIT)" "$(RELEASE_DIR)" $(RELEASE_PLATFORMS)

clean: ## Remove build output (stops every local cluster, kind cluster and the project's dockerd under _output first).
	@for marker in _output/*/.podjanitor-local-cluster _output/*/*/.podjanitor-local-cluster; do \
	  [ -e "$$marker" ] && CLUSTER_DIR=$$(dirname "$$marker") hack/local-cluster.sh down || true; \
	done
	@if [ -x _output/bin/kind ]; then for k in _output/kind/*.kubeconfig; do \
	  [ -e "$$k" ] && hack/kind/up.sh down "$$(basename "$$k" .kubeconfig)" || true; \
	done; fi
	@if [ -d _output/kind/docker ]; then hack/kind/dockerd.sh down; fi
	rm -rf _output
