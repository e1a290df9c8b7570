package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/podjanitor/podjanitor/policy"
)

func TestRemovalErrorKinds(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	tests := map[string]struct {
		err  error
		want string
	}{
		"deadline":             {fmt.Errorf("call: %w", context.DeadlineExceeded), errorTimeout},
		"server timeout":       {apierrors.NewServerTimeout(gr, "delete", 1), errorTimeout},
		"connection refused":   {errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"), errorUnavailable},
		"503":                  {apierrors.NewServiceUnavailable("shutting down"), errorUnavailable},
		"500":                  {apierrors.NewInternalError(errors.New("etcd")), errorUnavailable},
		"401":                  {apierrors.NewUnauthorized("token expired"), errorUnavailable},
		"flow control 429":     {apierrors.NewTooManyRequests("too many requests", 1), errorThrottled},
		"budget 429":           {pdbRefusal(), errorDisruptionBudget},
		"404":                  {apierrors.NewNotFound(gr, "web"), errorNotFound},
		"403":                  {apierrors.NewForbidden(gr, "web", errors.New("RBAC")), errorRefused},
		"422":                  {apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "web", nil), errorRefused},
		"conflict stays a 4xx": {apierrors.NewConflict(gr, "web", errors.New("uid")), errorRefused},
		"two budgets":          {multipleBudgetsRefusal(), errorMultipleBudgets},
		"webhook denial":       {webhookDenial(), errorAdmissionDenied},
		"webhook denial 403": {apierrors.NewForbidden(gr, "web",
			errors.New(`admission webhook "validation.gatekeeper.sh" denied the request: [no-delete] pods are protected`)), errorAdmissionDenied},
		"webhook without explanation, wrapped in a 500 (older API servers)": {apierrors.NewInternalError(
			errors.New(`admission webhook "deny.example.com" denied the request without explanation`)), errorAdmissionDenied},
		"admission policy": {&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
			Message: `pods "web" is forbidden: ValidatingAdmissionPolicy 'no-delete' with binding 'no-delete' denied request: failed expression: false`}}, errorAdmissionDenied},
		"admission policy with reason Invalid": {&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `ValidatingAdmissionPolicy 'freeze' denied request: frozen`}}, errorAdmissionDenied},
		"webhook that cannot be called": {apierrors.NewInternalError(
			errors.New(`failed calling webhook "deny.example.com": Post "https://deny.default.svc:443/": dial tcp: connection refused`)), errorUnavailable},
		"another 500 with a message": {&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 500,
			Message: "etcdserver: request timed out"}}, errorUnavailable},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := removalErrorKind(tc.err); got != tc.want {
				t.Errorf("removalErrorKind(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

// An eviction refused by a PodDisruptionBudget comes back at once, not after
// client-go has slept through the refusal's Retry-After ten times.
func TestDisruptionBudgetRefusalIsNotRetriedInsideTheCall(t *testing.T) {
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "10")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429,`+
			`"message":"Cannot evict pod as it would violate the pod's disruption budget.",`+
			`"details":{"causes":[{"reason":"DisruptionBudget","message":"needs 1 healthy pods"}]}}`)
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL}
	cfg.Wrap(withoutDisruptionBudgetRetryAfter)
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err := client.CoreV1().Pods("default").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}})
	if removalErrorKind(err) != errorDisruptionBudget {
		t.Fatalf("err = %v (kind %q), want a disruption budget refusal", err, removalErrorKind(err))
	}
	if calls != 1 || time.Since(start) > 2*time.Second {
		t.Errorf("%d calls in %v, want one call answered at once", calls, time.Since(start))
	}
}

// A removal call that hangs is cut off at the write timeout and retried.
func TestHungRemovalCallTimesOut(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	pod := newPod("hung", t0.Add(-time.Hour), corev1.PodFailed, map[string]string{"podjanitor.io/ttl": "1m"})
	f := newFixture(t, Options{WriteTimeout: 200 * time.Millisecond}, pod)
	f.c.client = kubernetes.NewForConfigOrDie(&rest.Config{Host: srv.URL})
	start := time.Now()
	d := policy.Decision{Deadline: t0, Action: policy.ActionDelete, Reason: policy.ReasonTTL}
	_, err := f.c.removePod(f.ctx, pod, d)
	if err == nil || removalErrorKind(err) != errorTimeout {
		t.Fatalf("err = %v, want a timeout", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the call took %v, want it cut off near the 200ms write timeout", took)
	}
	if got := testutilValue(f.metrics, "delete", errorTimeout); got != 1 {
		t.Errorf(`removal_errors_total{error="timeout"} = %v, want 1`, got)
	}
}

// The Eviction API's answer for a pod under two PodDisruptionBudgets, as the
// API server sends it (EvictionREST.Create returns a failure Status with
// code 500, no reason and no Retry-After), reaches the controller in one
// call, classified as multiple_budgets and as a refusal, not as a failure of
// the API server.
func TestMultipleBudgetsAnswerIsARefusal(t *testing.T) {
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",`+
			`"message":"This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.","code":500}`)
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL}
	cfg.Wrap(withoutDisruptionBudgetRetryAfter)
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := client.CoreV1().Pods("default").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}})
	if kind := removalErrorKind(err); kind != errorMultipleBudgets || !isRefusal(kind) {
		t.Fatalf("err = %v (kind %q), want multiple_budgets, a refusal", err, kind)
	}
	if calls != 1 {
		t.Errorf("%d calls, want 1", calls)
	}
}

func TestRefusalKinds(t *testing.T) {
	for _, kind := range removalErrorKinds {
		want := kind == errorDisruptionBudget || kind == errorMultipleBudgets || kind == errorAdmissionDenied || kind == errorRefused
		if isRefusal(kind) != want {
			t.Errorf("isRefusal(%q) = %v, want %v", kind, !want, want)
		}
	}
	if len(refusalKinds) > 8 {
		t.Errorf("%d refusal kinds do not fit podMarks.reported", len(refusalKinds))
	}
}
