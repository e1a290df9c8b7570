// Package secureserving serves a handler over HTTPS to callers that the API
// server vouches for: each request's bearer token is authenticated by a
// TokenReview and the request authorized by a SubjectAccessReview (the
// request's verb on the non-resource URL, e.g. get /metrics), as
// kube-apiserver's delegated authentication and authorization (and
// controller-runtime's metrics filters, kube-rbac-proxy) do. Both answers are
// cached, so that a scraper costs the API server a TokenReview per TokenTTL
// and a SubjectAccessReview per AllowTTL, not a request per scrape.
//
// It is written on client-go alone: k8s.io/apiserver's delegating
// authenticator and authorizer would do the same, and cost the binary 38 MB
// and every podjanitor ~25 MiB of RSS for the API server they bring along.
package secureserving

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	authenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
)

// How long the answers of the API server are cached, per token (a hash of it)
// and per user and request attributes. A revoked token or a removed
// RoleBinding is honoured within these times; the values are
// controller-runtime's. A token the API server does not authenticate is
// remembered for DenyTTL, so that a caller with a bad token does not cost a
// TokenReview per request.
const (
	TokenTTL = time.Minute      // a TokenReview that authenticated the token
	AllowTTL = 5 * time.Minute  // a SubjectAccessReview that allowed the request
	DenyTTL  = 30 * time.Second // one that did not, or a TokenReview that did not authenticate
)

// maxCached bounds each cache (tokens, access answers): past it, the expired
// entries go, and then any.
const maxCached = 4096

// Cert and key file names in the certificate directory: those of a
// kubernetes.io/tls Secret (cert-manager's among them).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// CertPoll is how often the certificate files are read again.
const CertPoll = 10 * time.Second

// reviewTimeout bounds each TokenReview and SubjectAccessReview call.
const reviewTimeout = 10 * time.Second

// reviewBackoff retries a review that failed for a reason that may pass (the
// API server unreachable, overloaded or throttling);
// k8s.io/apiserver's DefaultAuthWebhookRetryBackoff.
var reviewBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// WithAuth returns handler behind authentication and authorization: a request
// without a bearer token, or with one that the TokenReview does not
// authenticate (or that could not be reviewed), is answered 401; one whose
// user may not use its verb on its path (a SubjectAccessReview of the
// non-resource URL) 403; one the API server could not authorize for 500.
// Anonymous requests are never allowed. The handler never sees the token.
func WithAuth(handler http.Handler, authn authenticationv1.AuthenticationV1Interface, authz authorizationv1.AuthorizationV1Interface) (http.Handler, error) {
	if authn == nil || authz == nil {
		return nil, errors.New("secure serving needs TokenReview and SubjectAccessReview clients")
	}
	a := &auth{authn: authn, authz: authz, now: time.Now,
		tokens: newTTLCache[*authnv1.UserInfo](), access: newTTLCache[bool]()}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { a.serve(handler, w, r) }), nil
}

type auth struct {
	authn  authenticationv1.AuthenticationV1Interface
	authz  authorizationv1.AuthorizationV1Interface
	now    func() time.Time
	tokens *ttlCache[*authnv1.UserInfo] // nil: not authenticated
	access *ttlCache[bool]
}

func (a *auth) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context())
	token, ok := bearerToken(r.Header)
	if !ok {
		writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	}
	user, err := a.authenticate(r.Context(), token)
	if err != nil {
		logger.Error(err, "Unable to authenticate the request", "path", r.URL.Path)
	}
	if user == nil {
		writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	}
	r.Header.Del("Authorization")
	// A non-resource request's verb is its method, lower-cased, as the API
	// server's RequestInfo makes it.
	verb, path := strings.ToLower(r.Method), r.URL.Path
	allowed, err := a.authorize(r.Context(), user, verb, path)
	if err != nil {
		logger.Error(err, "Unable to authorize the request", "user", user.Username, "verb", verb, "path", path)
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError,
			"Internal error: the API server could not authorize the request")
		return
	}
	if !allowed {
		writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden,
			fmt.Sprintf("forbidden: User %q cannot %s path %q", user.Username, verb, path))
		return
	}
	next.ServeHTTP(w, r)
}

// bearerToken is the token of an "Authorization: Bearer <token>" header, as
// the API server reads it.
func bearerToken(h http.Header) (string, bool) {
	parts := strings.SplitN(strings.TrimSpace(h.Get("Authorization")), " ", 3)
	if len(parts) < 2 || !strings.EqualFold(parts[0], "bearer") || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}

// authenticate returns the user the API server says token is, nil when it
// does not authenticate it; an error when it could not be asked.
func (a *auth) authenticate(ctx context.Context, token string) (*authnv1.UserInfo, error) {
	key := sha256.Sum256([]byte(token))
	if user, ok := a.tokens.get(string(key[:]), a.now()); ok {
		return user, nil
	}
	var status authnv1.TokenReviewStatus
	err := review(ctx, func(ctx context.Context) error {
		tr, err := a.authn.TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err == nil {
			status = tr.Status
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("TokenReview: %w", err)
	}
	if !status.Authenticated {
		a.tokens.put(string(key[:]), nil, a.now().Add(DenyTTL))
		return nil, nil
	}
	a.tokens.put(string(key[:]), &status.User, a.now().Add(TokenTTL))
	return &status.User, nil
}

// authorize says whether the API server allows user verb on the non-resource path.
func (a *auth) authorize(ctx context.Context, user *authnv1.UserInfo, verb, path string) (bool, error) {
	spec := authzv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: verb},
	}
	if len(user.Extra) > 0 {
		spec.Extra = make(map[string]authzv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			spec.Extra[k] = authzv1.ExtraValue(v)
		}
	}
	k, err := json.Marshal(spec) // map keys sorted: one key per user and request
	if err != nil {
		return false, err
	}
	key := string(k)
	if allowed, ok := a.access.get(key, a.now()); ok {
		return allowed, nil
	}
	var status authzv1.SubjectAccessReviewStatus
	err = review(ctx, func(ctx context.Context) error {
		sar, err := a.authz.SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		if err == nil {
			status = sar.Status
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("SubjectAccessReview: %w", err)
	}
	ttl := DenyTTL
	if status.Allowed {
		ttl = AllowTTL
	}
	a.access.put(key, status.Allowed, a.now().Add(ttl))
	return status.Allowed, nil
}

// review calls f, each call bounded by reviewTimeout, again with
// reviewBackoff while it fails for a reason that may pass: no answer, 429,
// or a 5xx. Other errors (403: podjanitor may not create reviews) are final.
func review(ctx context.Context, f func(context.Context) error) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, reviewBackoff, func(ctx context.Context) (bool, error) {
		callCtx, cancel := context.WithTimeout(ctx, reviewTimeout)
		defer cancel()
		if last = f(callCtx); last == nil {
			return true, nil
		}
		var status apierrors.APIStatus
		if errors.As(last, &status) {
			if code := status.Status().Code; code != http.StatusTooManyRequests && code < 500 {
				return false, last
			}
		}
		return false, nil
	})
	if err != nil && last != nil {
		return last
	}
	return err
}

// writeStatus answers with a metav1.Status, as the API server does.
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, message string) {
	body, _ := json.Marshal(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Message: message, Reason: reason, Code: int32(code),
	})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write(body)
}

// ttlCache is a map whose entries expire, bounded by maxCached.
type ttlCache[V any] struct {
	mu      sync.Mutex
	entries map[string]ttlEntry[V]
}

type ttlEntry[V any] struct {
	value   V
	expires time.Time
}

func newTTLCache[V any]() *ttlCache[V] {
	return &ttlCache[V]{entries: map[string]ttlEntry[V]{}}
}

func (c *ttlCache[V]) get(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || !now.Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.value, true
}

func (c *ttlCache[V]) put(key string, value V, expires time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= maxCached {
		now := time.Now()
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < maxCached {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = ttlEntry[V]{value: value, expires: expires}
}

// TLSConfig is the serving configuration. With certDir, the certificate and
// key are its tls.crt and tls.key, read again every CertPoll (a Secret's
// mount updated by the kubelet, cert-manager renewing it) until ctx is done;
// a pair that does not load (the key not matching the cert while one of them
// is being replaced) leaves the current one served. Without certDir, a
// self-signed certificate made at start, in memory, for hosts (and
// localhost), valid for a year.
func TLSConfig(ctx context.Context, certDir string, hosts ...string) (*tls.Config, error) {
	logger := klog.FromContext(ctx)
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	if certDir == "" {
		pem, key, err := selfSigned(hosts)
		if err != nil {
			return nil, err
		}
		pair, err := tls.X509KeyPair(pem, key)
		if err != nil {
			return nil, fmt.Errorf("self-signed certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		logger.Info("Serving a self-signed certificate made at start", "hosts", hosts)
		return cfg, nil
	}
	files := &certFiles{cert: filepath.Join(certDir, CertFile), key: filepath.Join(certDir, KeyFile)}
	if _, err := files.load(); err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	go files.watch(ctx)
	cfg.GetCertificate = files.get
	logger.Info("Serving certificate from files, read again when they change", "dir", certDir, "every", CertPoll)
	return cfg, nil
}

// certFiles serves the last pair of cert and key files that loaded.
type certFiles struct {
	cert, key string

	mu      sync.Mutex
	pair    *tls.Certificate
	certPEM []byte
	keyPEM  []byte
}

func (f *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pair, nil
}

// load reads the files and, when they changed and load as a pair, serves
// them; changed says whether it took a new pair.
func (f *certFiles) load() (changed bool, err error) {
	certPEM, err := os.ReadFile(f.cert)
	if err != nil {
		return false, err
	}
	keyPEM, err := os.ReadFile(f.key)
	if err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pair != nil && string(certPEM) == string(f.certPEM) && string(keyPEM) == string(f.keyPEM) {
		return false, nil
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("%s and %s: %w", f.cert, f.key, err)
	}
	f.pair, f.certPEM, f.keyPEM = &pair, certPEM, keyPEM
	return true, nil
}

func (f *certFiles) watch(ctx context.Context) {
	logger := klog.FromContext(ctx)
	lastErr := "" // logged once, not at every poll
	wait.Until(func() {
		changed, err := f.load()
		switch {
		case err != nil && err.Error() != lastErr:
			lastErr = err.Error()
			logger.Error(err, "Not taking the changed serving certificate; serving the previous one")
		case err == nil:
			lastErr = ""
			if changed {
				logger.Info("Serving the changed certificate", "file", f.cert)
			}
		}
	}, CertPoll, ctx.Done())
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
