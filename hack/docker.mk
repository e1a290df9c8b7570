# The container image. `make image-archive` needs no Docker: hack/image writes
# the image the Dockerfile describes, from the binary of `make build`, as an OCI
# archive that the local cluster's real node loads (hack/local-cluster.sh
# load-image; `make test` does). The other targets are for users with Docker,
# kind and kubectl on PATH, and are not run in CI. Included by the Makefile,
# whose VERSION and COMMIT stamp the image.
#
#   make image-archive            _output/images/podjanitor.tar, named local/podjanitor:dev
#   make image                    build the image $(IMAGE) from the Dockerfile
#   make kind-up kind-load deploy a kind cluster running podjanitor from artifacts/deploy
#   make undeploy                 remove it again; `kind delete cluster --name podjanitor`
#                                 removes the cluster too
#
# deploy and undeploy act on kubectl's current context, whatever cluster it is.
# The manifests name the image podjanitor:dev; deploy with IMAGE=other sets the
# Deployment's image after applying, and an overlay with `images:` does it
# declaratively (see artifacts/deploy/kustomization.yaml).

IMAGE        ?= podjanitor:dev
KIND_CLUSTER ?= podjanitor
DOCKER       ?= docker
KIND         ?= kind
KUBECTL      ?= kubectl
VERSION      ?= dev
COMMIT       ?= unknown

IMAGE_ARCHIVE ?= _output/images/podjanitor.tar

.PHONY: image image-archive kind-up kind-load deploy undeploy

image-archive: build ## Write the image as an OCI archive without Docker (IMAGE_ARCHIVE, local/podjanitor:dev).
	go run ./hack/image -kind podjanitor -binary $(BIN) -name local/podjanitor:dev -o $(IMAGE_ARCHIVE)

image: ## Build the container image IMAGE (default podjanitor:dev), version stamped.
	$(DOCKER) build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE) .

kind-up: ## Create the kind cluster KIND_CLUSTER (default podjanitor) unless it exists.
	@if $(KIND) get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)'; then \
	  echo "kind cluster $(KIND_CLUSTER) exists"; \
	else \
	  $(KIND) create cluster --name $(KIND_CLUSTER) --wait 120s; \
	fi

kind-load: image ## Build the image and load it into the kind cluster.
	$(KIND) load docker-image $(IMAGE) --name $(KIND_CLUSTER)

deploy: ## kubectl apply -k artifacts/deploy to the current context, wait for the rollout.
	$(KUBECTL) apply -k artifacts/deploy
	$(if $(filter-out podjanitor:dev,$(IMAGE)),$(KUBECTL) -n podjanitor set image deployment/podjanitor podjanitor=$(IMAGE))
	$(KUBECTL) -n podjanitor rollout status deployment/podjanitor --timeout=120s

undeploy: ## kubectl delete -k artifacts/deploy from the current context.
	$(KUBECTL) delete -k artifacts/deploy --ignore-not-found
