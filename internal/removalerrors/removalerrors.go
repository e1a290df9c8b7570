// Package removalerrors sorts the errors of removal calls (a delete or an
// eviction) into kinds: the values of podjanitor_removal_errors_total's error
// label, and what the controller does next (a refusal, which retrying soon
// cannot fix, waits for the slow backoff; the rest retries soon). It also
// keeps client-go from sleeping inside an eviction call that a
// PodDisruptionBudget refused (WithoutDisruptionBudgetRetryAfter).
//
// It promises that every error has exactly one kind of Kinds, and that the
// kinds and their order do not change within a release: Refusals' order is
// that of the bits the controller keeps per pod.
package removalerrors

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Kinds of failed removals: the values of podjanitor_removal_errors_total's
// error label.
const (
	Timeout          = "timeout"           // no answer within --write-timeout
	Unavailable      = "unavailable"       // connection failed, or a 5xx answer
	Throttled        = "throttled"         // 429 from the API server's flow control
	NotFound         = "not_found"         // 404 for a pod the informer still has
	DisruptionBudget = "disruption_budget" // eviction refused by a PodDisruptionBudget
	MultipleBudgets  = "multiple_budgets"  // eviction of a pod that more than one PodDisruptionBudget selects
	AdmissionDenied  = "admission_denied"  // denied by an admission webhook or a ValidatingAdmissionPolicy
	Refused          = "refused"           // another 4xx that retrying soon cannot fix (RBAC, an invalid request)
	Other            = "other"
)

var Kinds = []string{Timeout, Unavailable, Throttled, NotFound,
	DisruptionBudget, MultipleBudgets, AdmissionDenied, Refused, Other}

// Refusals are the kinds that retrying soon cannot fix: the API server
// looked at the request and said no, without removing anything. They wait
// for the slow refusal backoff (refusalBackoff), are reported once per pod
// and kind, and their retries take no removal token a due pod waits for
// (podStates.reserve). The order is that of podMarks.reported's bits.
var Refusals = []string{DisruptionBudget, MultipleBudgets, AdmissionDenied, Refused}

// IsRefusal reports whether a kind of KindOf is a refusal.
func IsRefusal(kind string) bool { return slices.Contains(Refusals, kind) }

// KindOf sorts the error of a delete or eviction call. The
// Refusals wait for the slow refusal backoff; the other kinds are
// transient and retry within transientBackoffMax.
func KindOf(err error) string {
	var status apierrors.APIStatus
	switch {
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return Timeout
	case isMultipleBudgetsRefusal(err):
		return MultipleBudgets
	case isAdmissionDenial(err):
		return AdmissionDenied
	case apierrors.IsTooManyRequests(err) && isDisruptionBudgetRefusal(err):
		return DisruptionBudget
	case apierrors.IsTooManyRequests(err):
		return Throttled
	case apierrors.IsNotFound(err):
		return NotFound
	case errors.As(err, &status):
		code := int(status.Status().Code)
		switch {
		case code >= http.StatusInternalServerError:
			return Unavailable
		case code == http.StatusUnauthorized:
			return Unavailable // credentials being rotated, or an API server still starting
		case code >= http.StatusBadRequest:
			return Refused
		}
		return Other
	}
	return Unavailable // no answer from the API server: connection refused, reset, DNS
}

// isMultipleBudgetsRefusal reports whether err is the Eviction API's refusal
// of a pod that more than one PodDisruptionBudget selects (k8s.io/kubernetes
// pkg/registry/core/pod/storage/eviction.go, EvictionREST.Create): a Status
// with code 500 and no reason, "This pod has more than one
// PodDisruptionBudget, which the eviction subresource does not support.", so
// only the message tells it from a failure of the API server. No change of
// either budget lets such an eviction pass; only removing the overlap does.
func isMultipleBudgetsRefusal(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) && status.Status().Code == http.StatusInternalServerError &&
		strings.Contains(status.Status().Message, "more than one PodDisruptionBudget")
}

// isAdmissionDenial reports whether err is a denial by a validating admission
// webhook or a ValidatingAdmissionPolicy: the request was valid and allowed
// by RBAC, and a policy of the cluster refuses it. The status code is the
// webhook's or the policy's choice (400 without one, 403 by default for a
// policy, 422 ...; some API server versions wrap a webhook's denial in a
// 500), so the message tells, as the API server words it:
//
//	admission webhook "NAME" denied the request: REASON
//	admission webhook "NAME" denied the request without explanation
//	pods "x" is forbidden: ValidatingAdmissionPolicy 'P' with binding 'B' denied request: REASON
//
// A webhook that could not be called ("failed calling webhook") is not a
// denial: it is transient.
func isAdmissionDenial(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code < http.StatusBadRequest {
		return false
	}
	msg := status.Status().Message
	return strings.Contains(msg, "admission webhook \"") && strings.Contains(msg, "denied the request") ||
		strings.Contains(msg, "ValidatingAdmissionPolicy '") && strings.Contains(msg, "denied request")
}

// isDisruptionBudgetRefusal reports whether a 429 is the Eviction API's refusal
// on behalf of a PodDisruptionBudget, not flow control.
func isDisruptionBudgetRefusal(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, cause := range status.Status().Details.Causes {
		if cause.Type == policyv1.DisruptionBudgetCause {
			return true
		}
	}
	return false
}

// WithoutDisruptionBudgetRetryAfter keeps client-go from retrying an eviction
// that a PodDisruptionBudget refused. The API server sends such a 429 with
// Retry-After: 10, and client-go honours Retry-After by sleeping and retrying
// up to ten times inside the call, holding a worker for ~100 s per pod.
// Without the header the refusal returns at once and the controller retries
// on its own, slower schedule (refusalBackoff). Other 429s (flow control) and
// 5xx keep their Retry-After: waiting inside the call is the backpressure the
// API server asks for, bounded by --write-timeout.
func WithoutDisruptionBudgetRetryAfter(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || req.Method != http.MethodPost ||
			!strings.HasSuffix(req.URL.Path, "/eviction") || resp.Header.Get("Retry-After") == "" {
			return resp, err
		}
		body, readErr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if readErr == nil && bytes.Contains(body, []byte(policyv1.DisruptionBudgetCause)) {
			resp.Header.Del("Retry-After")
		}
		return resp, nil
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
