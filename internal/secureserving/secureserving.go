// Package secureserving serves a handler over HTTPS to callers that the API
// server vouches for: each request's bearer token is authenticated by a
// TokenReview and the request authorized by a SubjectAccessReview (verb get on
// the non-resource URL, e.g. /metrics), with the delegating authenticator and
// authorizer and the request filters of k8s.io/apiserver, as
// controller-runtime's metrics filters and kube-rbac-proxy do. Both answers are
// cached, so that a scraper costs the API server a TokenReview per TokenTTL
// and a SubjectAccessReview per AllowTTL, not a request per scrape.
package secureserving

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/endpoints/filters"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	authenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
)

// How long the answers of the API server are cached, per token (a hash of it)
// and per user and request attributes. A revoked token or a removed
// RoleBinding is honoured within these times; the values are
// controller-runtime's.
const (
	TokenTTL = time.Minute      // a TokenReview that authenticated the token
	AllowTTL = 5 * time.Minute  // a SubjectAccessReview that allowed the request
	DenyTTL  = 30 * time.Second // one that did not
)

// Cert and key file names in the certificate directory: those of a
// kubernetes.io/tls Secret (cert-manager's among them).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// reviewTimeout bounds each TokenReview and SubjectAccessReview call.
const reviewTimeout = 10 * time.Second

// reviewBackoff retries a review that failed (the API server unreachable or
// overloaded); k8s.io/apiserver's DefaultAuthWebhookRetryBackoff.
var reviewBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// WithAuth returns handler behind authentication and authorization: a request
// without a token, or with a token that the TokenReview does not
// authenticate, is answered 401; one whose user may not get its path
// (SubjectAccessReview of the non-resource URL and the request's verb) 403;
// one the API server could not answer for 500. Anonymous requests are never
// allowed.
func WithAuth(handler http.Handler, authn authenticationv1.AuthenticationV1Interface, authz authorizationv1.AuthorizationV1Interface) (http.Handler, error) {
	authenticator, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: false},
		TokenAccessReviewClient:  authn,
		TokenAccessReviewTimeout: reviewTimeout,
		WebhookRetryBackoff:      &reviewBackoff,
		CacheTTL:                 TokenTTL,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("authenticator: %w", err)
	}
	authorizer, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: authz,
		AllowCacheTTL:             AllowTTL,
		DenyCacheTTL:              DenyTTL,
		WebhookRetryBackoff:       &reviewBackoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("authorizer: %w", err)
	}
	codecs := statusCodecs()
	h := filters.WithAuthorization(handler, authorizer, codecs)
	h = filters.WithAuthentication(h, authenticator, filters.Unauthorized(codecs), nil, nil)
	// The request's verb (get) and path, the attributes of the review; no
	// path here is a resource request (that is /api and /apis only).
	h = filters.WithRequestInfo(h, &request.RequestInfoFactory{
		APIPrefixes:          sets.NewString("api", "apis"),
		GrouplessAPIPrefixes: sets.NewString("api"),
	})
	return h, nil
}

// statusCodecs encode the metav1.Status of a 401 or 403 answer.
func statusCodecs() runtime.NegotiatedSerializer {
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	return serializer.NewCodecFactory(scheme).WithoutConversion()
}

// TLSConfig is the serving configuration. With certDir, the certificate and
// key are its tls.crt and tls.key, read again whenever the files change (a
// Secret's mount updated by the kubelet, cert-manager renewing it) until ctx
// is done; a pair that does not load (the key not matching the cert while one
// of them is being replaced) leaves the current one served. Without certDir,
// a self-signed certificate made at start, in memory, for hosts (and
// localhost), valid for a year.
func TLSConfig(ctx context.Context, certDir string, hosts ...string) (*tls.Config, error) {
	logger := klog.FromContext(ctx)
	var content dynamiccertificates.CertKeyContentProvider
	watch := func() {}
	if certDir != "" {
		files, err := dynamiccertificates.NewDynamicServingContentFromFiles("metrics",
			filepath.Join(certDir, CertFile), filepath.Join(certDir, KeyFile))
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		content, watch = files, func() { files.Run(ctx, 1) }
		logger.Info("Serving certificate from files, reloaded when they change", "dir", certDir)
	} else {
		pem, key, err := selfSigned(hosts)
		if err != nil {
			return nil, err
		}
		if content, err = dynamiccertificates.NewStaticCertKeyContent("self-signed", pem, key); err != nil {
			return nil, err
		}
		logger.Info("Serving a self-signed certificate made at start", "hosts", hosts)
	}
	controller := dynamiccertificates.NewDynamicServingCertificateController(
		&tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}, nil, content, nil, nil)
	content.AddListener(controller)
	if err := controller.RunOnce(); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	go controller.Run(1, ctx.Done())
	go watch()
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: controller.GetConfigForClient}, nil
}

// selfSigned makes a certificate (signed by a CA made for it and discarded)
// for hosts, localhost, 127.0.0.1 and ::1; the first name is the subject.
func selfSigned(hosts []string) (pem, key []byte, err error) {
	var dns []string
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, h := range append(hosts, "localhost") {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else if h != "" {
			dns = append(dns, h)
		}
	}
	pem, key, err = cert.GenerateSelfSignedCertKey(dns[0], ips, dns[1:])
	if err != nil {
		return nil, nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	return pem, key, nil
}

// Hosts are the names a self-signed certificate is made for: the host name
// (in a pod, the pod's name).
func Hosts() []string {
	name, err := os.Hostname()
	if err != nil || name == "" {
		return nil
	}
	return []string{name}
}
