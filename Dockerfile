# podjanitor container image: a static binary on a distroless, non-root base.
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

# No shell, no package manager; user nonroot (65532), as the Deployment expects.
FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/podjanitor /podjanitor
USER 65532:65532
ENTRYPOINT ["/podjanitor"]
