package removalerrors

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/podjanitor/podjanitor/internal/apitest"
)

func TestRemovalErrorKinds(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	tests := map[string]struct {
		err  error
		want string
	}{
		"deadline":             {fmt.Errorf("call: %w", context.DeadlineExceeded), Timeout},
		"server timeout":       {apierrors.NewServerTimeout(gr, "delete", 1), Timeout},
		"connection refused":   {errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"), Unavailable},
		"503":                  {apierrors.NewServiceUnavailable("shutting down"), Unavailable},
		"500":                  {apierrors.NewInternalError(errors.New("etcd")), Unavailable},
		"401":                  {apierrors.NewUnauthorized("token expired"), Unavailable},
		"flow control 429":     {apierrors.NewTooManyRequests("too many requests", 1), Throttled},
		"budget 429":           {apitest.DisruptionBudgetRefusal(), DisruptionBudget},
		"404":                  {apierrors.NewNotFound(gr, "web"), NotFound},
		"403":                  {apierrors.NewForbidden(gr, "web", errors.New("RBAC")), Refused},
		"422":                  {apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "web", nil), Refused},
		"conflict stays a 4xx": {apierrors.NewConflict(gr, "web", errors.New("uid")), Refused},
		"two budgets":          {apitest.MultipleBudgetsRefusal(), MultipleBudgets},
		"webhook denial":       {apitest.WebhookDenial(), AdmissionDenied},
		"webhook denial 403": {apierrors.NewForbidden(gr, "web",
			errors.New(`admission webhook "validation.gatekeeper.sh" denied the request: [no-delete] pods are protected`)), AdmissionDenied},
		"webhook without explanation, wrapped in a 500 (older API servers)": {apierrors.NewInternalError(
			errors.New(`admission webhook "deny.example.com" denied the request without explanation`)), AdmissionDenied},
		"admission policy": {&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
			Message: `pods "web" is forbidden: ValidatingAdmissionPolicy 'no-delete' with binding 'no-delete' denied request: failed expression: false`}}, AdmissionDenied},
		"admission policy with reason Invalid": {&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 422, Reason: metav1.StatusReasonInvalid,
			Message: `ValidatingAdmissionPolicy 'freeze' denied request: frozen`}}, AdmissionDenied},
		"webhook that cannot be called": {apierrors.NewInternalError(
			errors.New(`failed calling webhook "deny.example.com": Post "https://deny.default.svc:443/": dial tcp: connection refused`)), Unavailable},
		"another 500 with a message": {&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 500,
			Message: "etcdserver: request timed out"}}, Unavailable},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := KindOf(tc.err); got != tc.want {
				t.Errorf("KindOf(%v) = %q, want %q", tc.err, got, tc.want)
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
	cfg.Wrap(WithoutDisruptionBudgetRetryAfter)
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err := client.CoreV1().Pods("default").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}})
	if KindOf(err) != DisruptionBudget {
		t.Fatalf("err = %v (kind %q), want a disruption budget refusal", err, KindOf(err))
	}
	if calls != 1 || time.Since(start) > 2*time.Second {
		t.Errorf("%d calls in %v, want one call answered at once", calls, time.Since(start))
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
	cfg.Wrap(WithoutDisruptionBudgetRetryAfter)
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := client.CoreV1().Pods("default").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}})
	if kind := KindOf(err); kind != MultipleBudgets || !IsRefusal(kind) {
		t.Fatalf("err = %v (kind %q), want multiple_budgets, a refusal", err, kind)
	}
	if calls != 1 {
		t.Errorf("%d calls, want 1", calls)
	}
}

func TestRefusalKinds(t *testing.T) {
	for _, kind := range Kinds {
		want := kind == DisruptionBudget || kind == MultipleBudgets || kind == AdmissionDenied || kind == Refused
		if IsRefusal(kind) != want {
			t.Errorf("IsRefusal(%q) = %v, want %v", kind, !want, want)
		}
	}
	if len(Refusals) > 8 {
		t.Errorf("%d refusal kinds do not fit podMarks.reported", len(Refusals))
	}
}
