package main

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
	errorTimeout          = "timeout"           // no answer within --write-timeout
	errorUnavailable      = "unavailable"       // connection failed, or a 5xx answer
	errorThrottled        = "throttled"         // 429 from the API server's flow control
	errorNotFound         = "not_found"         // 404 for a pod the informer still has
	errorDisruptionBudget = "disruption_budget" // eviction refused by a PodDisruptionBudget
	errorMultipleBudgets  = "multiple_budgets"  // eviction of a pod that more than one PodDisruptionBudget selects
	errorAdmissionDenied  = "admission_denied"  // denied by an admission webhook or a ValidatingAdmissionPolicy
	errorRefused          = "refused"           // another 4xx that retrying soon cannot fix (RBAC, an invalid request)
	errorOther            = "other"
)

var removalErrorKinds = []string{errorTimeout, errorUnavailable, errorThrottled, errorNotFound,
	errorDisruptionBudget, errorMultipleBudgets, errorAdmissionDenied, errorRefused, errorOther}

// refusalKinds are the kinds that retrying soon cannot fix: the API server
// looked at the request and said no, without removing anything. They wait
// for the slow refusal backoff (refusalBackoff), are reported once per pod
// and kind, and their retries take no removal token a due pod waits for
// (podStates.reserve). The order is that of podMarks.reported's bits.
var refusalKinds = []string{errorDisruptionBudget, errorMultipleBudgets, errorAdmissionDenied, errorRefused}

// isRefusal reports whether a kind of removalErrorKind is a refusal.
func isRefusal(kind string) bool { return slices.Contains(refusalKinds, kind) }

// removalErrorKind sorts the error of a delete or eviction call. The
// refusalKinds wait for the slow refusal backoff; the other kinds are
// transient and retry within transientBackoffMax.
func removalErrorKind(err error) string {
	var status apierrors.APIStatus
	switch {
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return errorTimeout
	case isMultipleBudgetsRefusal(err):
		return errorMultipleBudgets
	case isAdmissionDenial(err):
		return errorAdmissionDenied
	case apierrors.IsTooManyRequests(err) && isDisruptionBudgetRefusal(err):
		return errorDisruptionBudget
	case apierrors.IsTooManyRequests(err):
		return errorThrottled
	case apierrors.IsNotFound(err):
		return errorNotFound
	case errors.As(err, &status):
		code := int(status.Status().Code)
		switch {
		case code >= http.StatusInternalServerError:
			return errorUnavailable
		case code == http.StatusUnauthorized:
			return errorUnavailable // credentials being rotated, or an API server still starting
		case code >= http.StatusBadRequest:
			return errorRefused
		}
		return errorOther
	}
	return errorUnavailable // no answer from the API server: connection refused, reset, DNS
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

// withoutDisruptionBudgetRetryAfter keeps client-go from retrying an eviction
// that a PodDisruptionBudget refused. The API server sends such a 429 with
// Retry-After: 10, and client-go honours Retry-After by sleeping and retrying
// up to ten times inside the call, holding a worker for ~100 s per pod.
// Without the header the refusal returns at once and the controller retries
// on its own, slower schedule (refusalBackoff). Other 429s (flow control) and
// 5xx keep their Retry-After: waiting inside the call is the backpressure the
// API server asks for, bounded by --write-timeout.
func withoutDisruptionBudgetRetryAfter(rt http.RoundTripper) http.RoundTripper {
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
