// Package secureserving serves a handler over HTTPS to callers that the API
// server vouches for: each request's bearer token is authenticated by a
// TokenReview and the request authorized by a SubjectAccessReview (the
// request's verb on the non-resource URL, e.g. get /metrics), as
// kube-apiserver's delegated authentication and authorization (and
// controller-runtime's metrics filters, kube-rbac-proxy) do. Both answers are
// cached, so that a scraper costs the API server a TokenReview per TokenTTL
// and a SubjectAccessReview per AllowTTL, not a request per scrape.
//
// It holds against hostile callers: a request's path is cleaned first, and
// one no handler serves is answered 404 before any review; the caches keep
// hashes, not what callers sent, and are bounded in entries and bytes; the
// reviews of callers and requests not allowed lately never queue (past the
// rate limit they are refused at once, 429), while a token allowed lately
// has a lane of its own for the requests it was allowed and is reviewed
// again ahead of its expiry; one review runs per token (or request) at a
// time. NewServer bounds each connection (timeouts, header bytes) and logs
// through klog; SourceLimiter bounds each source address's connections
// (their TLS handshakes before a token is shown among them) and requests.
//
// It is written on client-go alone: k8s.io/apiserver's delegating
// authenticator and authorizer would do the same, and cost the binary 38 MB
// and every podjanitor ~25 MiB of RSS for the API server they bring along.
package secureserving

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path"
	"slices"
	"strconv"
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
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
)

// How long the answers of the API server are cached, per token (a hash of it)
// and per user and request attributes. A revoked token or a removed
// RoleBinding is honoured within these times; the values are
// controller-runtime's. A token the API server does not authenticate is
// remembered for DenyTTL, so that a caller with a bad token does not cost a
// TokenReview per request. A token allowed a request within RecentTTL has
// reviews of its own lane, and its cached answers are reviewed again in the
// last quarter of their time.
const (
	TokenTTL  = time.Minute      // a TokenReview that authenticated the token
	AllowTTL  = 5 * time.Minute  // a SubjectAccessReview that allowed the request
	DenyTTL   = 30 * time.Second // one that did not, or a TokenReview that did not authenticate
	RecentTTL = 10 * time.Minute // a token allowed a request
)

// The bounds of each cache (tokens, access answers, tokens allowed lately):
// past one, the entries closest to expiry go (Options.Evicted).
const (
	maxCached      = 4096
	maxCachedBytes = 4 << 20
	maxRecent      = 1024
)

// Defaults of Options: the rate of the reviews of callers not allowed lately.
const (
	DefaultReviewQPS   = 5
	DefaultReviewBurst = 10
)

// Why a request was refused: the values Options.Refused is given.
const (
	RefusedUnknownPath     = "unknown_path"     // 404: no handler serves the path; nothing reviewed
	RefusedUnauthenticated = "unauthenticated"  // 401: no bearer token, or one the API server does not authenticate
	RefusedThrottled       = "review_throttled" // 429: the review it needs is past the reviews' rate limit
	RefusedForbidden       = "forbidden"        // 403: the user may not use the verb on the path
	RefusedReviewFailed    = "review_failed"    // 401 or 500: the API server did not answer the review
)

// RefusalReasons are the Refused* values.
var RefusalReasons = []string{RefusedUnknownPath, RefusedUnauthenticated, RefusedThrottled, RefusedForbidden, RefusedReviewFailed}

// The caches, as Options.Evicted names them.
const (
	CacheTokens = "tokens"
	CacheAccess = "access"
)

// reviewTimeout bounds each TokenReview and SubjectAccessReview call.
const reviewTimeout = 10 * time.Second

// reviewBackoff retries a review that failed for a reason that may pass (the
// API server unreachable, overloaded or throttling);
// k8s.io/apiserver's DefaultAuthWebhookRetryBackoff.
var reviewBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// failureLogEvery is how often a failed review is logged at most; the
// failures between are counted in the next line.
const failureLogEvery = 10 * time.Second

// Options of WithAuth; a zero field is its default.
type Options struct {
	// Audiences the TokenReview asks the token to be valid for (one of
	// them); none: the API server's own.
	Audiences []string
	// ReviewQPS and ReviewBurst limit the reviews of tokens not allowed a
	// request within RecentTTL (DefaultReviewQPS, DefaultReviewBurst); a
	// request whose review is past the limit is refused at once (429).
	ReviewQPS   float32
	ReviewBurst int
	// Refused is told why each refused request was refused (a Refused*).
	Refused func(reason string)
	// Evicted is told of each live answer dropped from a full cache (a Cache*).
	Evicted func(cache string)
	// Allowed is told the remote address (host:port) of each request
	// allowed, before it is served (SourceLimiter.Vouch).
	Allowed func(remoteAddr string)
}

// WithAuth returns mux behind authentication and authorization: a request
// for a path mux has no handler for is answered 404 (nothing reviewed); one
// without a bearer token, or with one that the TokenReview does not
// authenticate (or that could not be reviewed), 401; one whose user may not
// use its verb on its path (a SubjectAccessReview of the non-resource URL)
// 403; one the API server could not authorize for 500; one whose review is
// past the rate limit 429, with Retry-After. Anonymous requests are never
// allowed. The handler never sees the token.
func WithAuth(mux *http.ServeMux, authn authenticationv1.AuthenticationV1Interface, authz authorizationv1.AuthorizationV1Interface, opts Options) (http.Handler, error) {
	return newAuth(mux, authn, authz, opts)
}

func newAuth(mux *http.ServeMux, authn authenticationv1.AuthenticationV1Interface, authz authorizationv1.AuthorizationV1Interface, opts Options) (*auth, error) {
	if mux == nil || authn == nil || authz == nil {
		return nil, errors.New("secure serving needs a handler and TokenReview and SubjectAccessReview clients")
	}
	qps, burst := opts.ReviewQPS, opts.ReviewBurst
	if qps <= 0 {
		qps = DefaultReviewQPS
	}
	if burst <= 0 {
		burst = DefaultReviewBurst
	}
	evicted := func(cache string) func() {
		if opts.Evicted == nil {
			return nil
		}
		return func() { opts.Evicted(cache) }
	}
	refused := opts.Refused
	if refused == nil {
		refused = func(string) {}
	}
	allowed := opts.Allowed
	if allowed == nil {
		allowed = func(string) {}
	}
	return &auth{mux: mux, authn: authn, authz: authz, audiences: slices.Clone(opts.Audiences), now: time.Now,
		tokens:       newTTLCache(maxCached, maxCachedBytes, userBytes, evicted(CacheTokens)),
		access:       newTTLCache(maxCached, maxCachedBytes, func(bool) int { return 0 }, evicted(CacheAccess)),
		recent:       newTTLCache(maxRecent, maxRecent*entryOverhead, func(struct{}) int { return 0 }, nil),
		recentAccess: newTTLCache(maxRecent, maxRecent*entryOverhead, func(struct{}) int { return 0 }, nil),
		newcomers:    flowcontrol.NewTokenBucketRateLimiter(qps, burst),
		retryAfter:   strconv.Itoa(int(math.Ceil(1 / float64(qps)))),
		refused:      refused,
		allowed:      allowed,
	}, nil
}

type auth struct {
	mux          *http.ServeMux
	authn        authenticationv1.AuthenticationV1Interface
	authz        authorizationv1.AuthorizationV1Interface
	audiences    []string
	now          func() time.Time
	tokens       *ttlCache[*authnv1.UserInfo] // nil: not authenticated
	access       *ttlCache[bool]
	recent       *ttlCache[struct{}] // tokens allowed a request lately
	recentAccess *ttlCache[struct{}] // users' requests allowed lately
	newcomers    flowcontrol.RateLimiter
	retryAfter   string // seconds, of a 429
	tokenFlight  flight[*authnv1.UserInfo]
	accessFlight flight[bool]
	refused      func(reason string)
	allowed      func(remoteAddr string)
	failures     failureLog
}

// errThrottled: the review is past the rate limit of reviews.
var errThrottled = errors.New("past the rate limit of reviews")

func (a *auth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = cleaned(r)
	_, pattern := a.mux.Handler(r)
	if pattern == "" {
		a.refuse(w, RefusedUnknownPath, http.StatusNotFound, metav1.StatusReasonNotFound, "the server could not find the requested resource")
		return
	}
	token, ok := bearerToken(r.Header)
	if !ok {
		a.refuse(w, RefusedUnauthenticated, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	}
	tokenKey := a.tokenKey(token)
	_, expires, known := a.recent.get(tokenKey, a.now())
	user, err := a.authenticate(r.Context(), tokenKey, token, known)
	switch {
	case errors.Is(err, errThrottled):
		a.throttled(w)
		return
	case err != nil:
		a.failures.log(r.Context(), err, "Unable to authenticate the request", "pattern", pattern)
		a.refuse(w, RefusedReviewFailed, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	case user == nil:
		a.refuse(w, RefusedUnauthenticated, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized")
		return
	}
	r.Header.Del("Authorization")
	// A non-resource request's verb is its method, lower-cased, as the API
	// server's RequestInfo makes it.
	verb, path := strings.ToLower(r.Method), r.URL.Path
	allowed, err := a.authorize(r.Context(), user, verb, path)
	switch {
	case errors.Is(err, errThrottled):
		a.throttled(w)
		return
	case err != nil:
		a.failures.log(r.Context(), err, "Unable to authorize the request", "user", user.Username, "verb", verb, "pattern", pattern)
		a.refuse(w, RefusedReviewFailed, http.StatusInternalServerError, metav1.StatusReasonInternalError,
			"Internal error: the API server could not authorize the request")
		return
	case !allowed:
		a.refuse(w, RefusedForbidden, http.StatusForbidden, metav1.StatusReasonForbidden,
			fmt.Sprintf("forbidden: User %q cannot %s path %q", user.Username, verb, cut(path, 256)))
		return
	}
	if now := a.now(); !known || expires.Sub(now) < RecentTTL/2 {
		a.recent.put(tokenKey, struct{}{}, now.Add(RecentTTL), now)
	}
	a.allowed(r.RemoteAddr)
	a.mux.ServeHTTP(w, r)
}

// cleaned is r with its path as the mux matches it and the review asks
// about: decoded, without . and .. elements or repeated slashes, like
// ServeMux's own cleaning (which would answer a redirect to it). Each
// spelling of a path is then one path, reviewed once.
func cleaned(r *http.Request) *http.Request {
	p := cleanPath(r.URL.Path)
	if p == r.URL.Path && r.URL.RawPath == "" {
		return r
	}
	r2 := new(http.Request)
	*r2 = *r
	u := *r.URL
	u.Path, u.RawPath = p, ""
	r2.URL = &u
	return r2
}

// cleanPath is ServeMux's: path.Clean's, rooted, with a trailing slash kept.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		np += "/"
	}
	return np
}

func (a *auth) refuse(w http.ResponseWriter, reason string, code int, status metav1.StatusReason, message string) {
	a.refused(reason)
	writeStatus(w, code, status, message)
}

func (a *auth) throttled(w http.ResponseWriter) {
	w.Header().Set("Retry-After", a.retryAfter)
	a.refuse(w, RefusedThrottled, http.StatusTooManyRequests, metav1.StatusReasonTooManyRequests,
		"Too many requests: the reviews of new callers are past their rate limit, please try again later")
}

// tokenKey is the cache key of a token, with the audiences it is reviewed for.
func (a *auth) tokenKey(token string) cacheKey {
	h := sha256.New()
	for _, aud := range a.audiences {
		h.Write([]byte(aud))
		h.Write([]byte{0})
	}
	h.Write([]byte{0})
	h.Write([]byte(token))
	var key cacheKey
	h.Sum(key[:0])
	return key
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
// does not authenticate it; an error when it could not be asked (or,
// errThrottled, not now). A known token (allowed lately) whose answer
// expires soon is reviewed again in the background.
func (a *auth) authenticate(ctx context.Context, key cacheKey, token string, known bool) (*authnv1.UserInfo, error) {
	now := a.now()
	if user, expires, ok := a.tokens.get(key, now); ok {
		if user != nil && known && expires.Sub(now) < TokenTTL/4 {
			go once(context.WithoutCancel(ctx), &a.tokenFlight, key, func(ctx context.Context) (*authnv1.UserInfo, error) {
				return a.reviewToken(ctx, key, token, known)
			})
		}
		return user, nil
	}
	return once(ctx, &a.tokenFlight, key, func(ctx context.Context) (*authnv1.UserInfo, error) {
		// A flight that ended between the look above and this one's start
		// has cached its answer: no second review for it.
		if user, _, ok := a.tokens.get(key, a.now()); ok {
			return user, nil
		}
		return a.reviewToken(ctx, key, token, known)
	})
}

// once runs f for key unless a call for key is in flight, and returns the
// answer of the call (or ctx's error). f runs without ctx's cancellation: its
// answer is every waiter's.
func once[V any](ctx context.Context, f *flight[V], key cacheKey, review func(context.Context) (V, error)) (V, error) {
	c, leader := f.join(key)
	if leader {
		v, err := review(context.WithoutCancel(ctx))
		f.finish(key, c, v, err)
	}
	select {
	case <-c.done:
		return c.value, c.err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// reviewToken asks the API server who token is and caches the answer.
func (a *auth) reviewToken(ctx context.Context, key cacheKey, token string, known bool) (*authnv1.UserInfo, error) {
	if !known && !a.newcomers.TryAccept() {
		return nil, errThrottled
	}
	var status authnv1.TokenReviewStatus
	err := review(ctx, func(ctx context.Context) error {
		tr, err := a.authn.TokenReviews().Create(ctx, &authnv1.TokenReview{
			Spec: authnv1.TokenReviewSpec{Token: token, Audiences: a.audiences}}, metav1.CreateOptions{})
		if err == nil {
			status = tr.Status
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("TokenReview: %w", err)
	}
	now := a.now()
	if !status.Authenticated || !a.audienceMatches(status.Audiences) {
		a.tokens.put(key, nil, now.Add(DenyTTL), now)
		return nil, nil
	}
	a.tokens.put(key, &status.User, now.Add(TokenTTL), now)
	return &status.User, nil
}

// audienceMatches says whether a TokenReview's audiences include one asked
// for, as the API server's webhook token authenticator requires.
func (a *auth) audienceMatches(got []string) bool {
	if len(a.audiences) == 0 {
		return true
	}
	for _, aud := range got {
		if slices.Contains(a.audiences, aud) {
			return true
		}
	}
	return false
}

// authorize says whether the API server allows user verb on the
// non-resource path. A request allowed lately (within RecentTTL) is reviewed
// in its own lane, its allowed answer again in the background when it
// expires soon; any other request's review takes the newcomers' limit, even
// with a known token: a scraper's token cannot have a review made for each
// path it makes up.
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
	key := cacheKey(sha256.Sum256(k))
	now := a.now()
	_, recently, known := a.recentAccess.get(key, now)
	review := func(ctx context.Context) (bool, error) { return a.reviewAccess(ctx, key, spec, known) }
	allowed, expires, ok := a.access.get(key, now)
	switch {
	case ok && allowed && known && expires.Sub(now) < AllowTTL/4:
		go once(context.WithoutCancel(ctx), &a.accessFlight, key, review)
	case !ok:
		unlessCached := func(ctx context.Context) (bool, error) {
			// As authenticate's: a flight that ended since the look above
			// has cached its answer.
			if allowed, _, ok := a.access.get(key, a.now()); ok {
				return allowed, nil
			}
			return review(ctx)
		}
		if allowed, err = once(ctx, &a.accessFlight, key, unlessCached); err != nil {
			return false, err
		}
	}
	if now := a.now(); allowed && (!known || recently.Sub(now) < RecentTTL/2) {
		a.recentAccess.put(key, struct{}{}, now.Add(RecentTTL), now)
	}
	return allowed, nil
}

// reviewAccess asks the API server whether spec is allowed and caches the answer.
func (a *auth) reviewAccess(ctx context.Context, key cacheKey, spec authzv1.SubjectAccessReviewSpec, known bool) (bool, error) {
	if !known && !a.newcomers.TryAccept() {
		return false, errThrottled
	}
	var status authzv1.SubjectAccessReviewStatus
	err := review(ctx, func(ctx context.Context) error {
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
	now := a.now()
	a.access.put(key, status.Allowed, now.Add(ttl), now)
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

// userBytes is about what a cached user holds.
func userBytes(u *authnv1.UserInfo) int {
	if u == nil {
		return 0
	}
	n := len(u.Username) + len(u.UID) + 64
	for _, g := range u.Groups {
		n += len(g) + 16
	}
	for k, vs := range u.Extra {
		n += len(k) + 48
		for _, v := range vs {
			n += len(v) + 16
		}
	}
	return n
}

// failureLog logs failed reviews at most once per failureLogEvery, with the
// number of failures not logged since.
type failureLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (f *failureLog) log(ctx context.Context, err error, msg string, kv ...any) {
	f.mu.Lock()
	now := time.Now()
	if !f.last.IsZero() && now.Sub(f.last) < failureLogEvery {
		f.suppressed++
		f.mu.Unlock()
		return
	}
	suppressed := f.suppressed
	f.last, f.suppressed = now, 0
	f.mu.Unlock()
	klog.FromContext(ctx).Error(err, msg, append(kv, "notLoggedSinceLast", suppressed)...)
}

// cut returns s, cut to at most n bytes with "..." after.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
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
