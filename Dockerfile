# podjanitor container image: a static binary with no base image, run as a non-root user.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) \
#                --build-arg COMMIT=$(git rev-parse --short HEAD) -t podjanitor:dev .
#
# or `make image`. Multi-platform: docker buildx build --platform linux/amd64,linux/arm64 .

# The build runs on the builder's own platform and cross-compiles (no emulation).
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
ARG COMMIT=unknown
WORKDIR /src
# Modules first, so that the download is a cached layer while only code changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" \
    -o /out/podjanitor .

# No base image: the static binary, CA certificates and the non-root user
# 65532 that the Deployment runs as (passwd and group from hack/image), and
# nothing else: no shell, no package manager. hack/image writes the same image
# as an OCI archive without Docker (`make image-archive`); its test checks
# that the two agree.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY hack/image/passwd /etc/passwd
COPY hack/image/group /etc/group
COPY --from=build /out/podjanitor /podjanitor
USER 65532:65532
ENTRYPOINT ["/podjanitor"]
