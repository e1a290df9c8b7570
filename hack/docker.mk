# The container image and kind. `make image-archive` needs no Docker: hack/image
# writes the image the Dockerfile describes, from the binary of `make build`, as
# an OCI archive that the local cluster's real node loads (hack/local-cluster.sh
# load-image; `make test` does) and kind loads (`kind load image-archive`).
# Included by the Makefile, whose VERSION and COMMIT stamp the image.
#
#   make image-archive            _output/images/podjanitor.tar, named local/podjanitor:dev
#   make image                    build the image $(IMAGE) from the Dockerfile (Docker)
#   make kind-up                  the kind cluster KIND_CLUSTER (hack/kind/up.sh); kubeconfig
#                                 _output/kind/$(KIND_CLUSTER).kubeconfig
#   make kind-deploy              kind-up, load the image archive, apply artifacts/deploy
#                                 with that image (nothing else changed), wait for the rollout
#   make test-kind                the kind tests (test/kind): the Deployment and the chart on a fresh
#                                 kind cluster, then `make bench-kind` at a small size
#   make test-kind-crash          hack/kind/test-crash.sh: SIGKILLs during kind-up, a dummy
#                                 process in the pid files, two checkouts at once; host state
#                                 compared before and after
#   make kind-down                delete the cluster and stop the project's dockerd
#   make deploy / undeploy        kubectl apply/delete -k artifacts/deploy on kubectl's
#                                 current context, whatever cluster it is
#
# KIND_NODE_IMAGE (hack/kind/up.sh): auto (default) takes kind's stock image
# when a Docker daemon of your own answers (DOCKER_HOST or /var/run/docker.sock)
# and otherwise builds the offline one (hack/kind/build.sh: Kubernetes v1.37.2
# from Go modules and Debian packages, into a dockerd of the project's own,
# hack/kind/dockerd.sh); offline or stock force one. kind, kubectl and crictl
# are built into _output/bin. The manifests name the image podjanitor:dev;
# deploy with IMAGE=other sets the Deployment's image after applying, and an
# overlay with `images:` does it declaratively (see artifacts/deploy/kustomization.yaml).

IMAGE        ?= podjanitor:dev
KIND_CLUSTER ?= podjanitor
DOCKER       ?= docker
KUBECTL      ?= kubectl
KIND_IMAGE   ?= docker.io/local/podjanitor:dev
VERSION      ?= dev
COMMIT       ?= unknown

IMAGE_ARCHIVE ?= _output/images/podjanitor.tar

.PHONY: image image-archive kind-image kind-up kind-load kind-deploy kind-down test-kind test-kind-crash deploy undeploy

image-archive: build ## Write the image as an OCI archive without Docker (IMAGE_ARCHIVE, local/podjanitor:dev).
	go run ./hack/image -kind podjanitor -binary $(BIN) -name local/podjanitor:dev -o $(IMAGE_ARCHIVE)

image: ## Build the container image IMAGE (default podjanitor:dev), version stamped.
	$(DOCKER) build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE) .

kind-image: ## Build kind and the offline kind node image (hack/kind/build.sh; cached).
	hack/kind/build.sh

kind-up: ## Create the kind cluster KIND_CLUSTER (default podjanitor) unless it exists.
	hack/kind/up.sh up $(KIND_CLUSTER)

kind-load: image-archive ## Load the image archive into the kind cluster (kind load image-archive).
	hack/kind/up.sh load $(KIND_CLUSTER) $(IMAGE_ARCHIVE)

kind-deploy: kind-up kind-load ## Run artifacts/deploy on the kind cluster with the loaded image.
	hack/kind/up.sh deploy $(KIND_CLUSTER) $(KIND_IMAGE)

kind-down: ## Delete the kind cluster KIND_CLUSTER and stop the project's dockerd.
	hack/kind/up.sh down $(KIND_CLUSTER)
	hack/kind/up.sh stop

test-kind: build image-archive helm ## The kind tests (test/kind): artifacts/deploy and the chart on kind, a container kill, bench-kind.
	hack/kind/test.sh

KIND_CRASH_MAX   ?= 90
KIND_CRASH_PARTS ?= dockerd daemons kill two

test-kind-crash: ## The kind path after SIGKILLs and beside a second checkout (hack/kind/test-crash.sh; root).
	KIND_CRASH_MAX=$(KIND_CRASH_MAX) hack/kind/test-crash.sh "$(KIND_CRASH_PARTS)"

deploy: ## kubectl apply -k artifacts/deploy to the current context, wait for the rollout.
	$(KUBECTL) apply -k artifacts/deploy
	$(if $(filter-out podjanitor:dev,$(IMAGE)),$(KUBECTL) -n podjanitor set image deployment/podjanitor podjanitor=$(IMAGE))
	$(KUBECTL) -n podjanitor rollout status deployment/podjanitor --timeout=120s

undeploy: ## kubectl delete -k artifacts/deploy from the current context.
	$(KUBECTL) delete -k artifacts/deploy --ignore-not-found
