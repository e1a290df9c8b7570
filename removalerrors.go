package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
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
	errorRefused          = "refused"           // 4xx that retrying soon cannot fix
	errorOther            = "other"
)

var removalErrorKinds = []string{errorTimeout, errorUnavailable, errorThrottled, errorNotFound,
	errorDisruptionBudget, errorRefused, errorOther}

// removalErrorKind sorts the error of a delete or eviction call. Only
// disruption_budget and refused wait for the slow refusal backoff; the other
// kinds are transient and retry within transientBackoffMax.
func removalErrorKind(err error) string {
	var status apierrors.APIStatus
	switch {
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return errorTimeout
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
