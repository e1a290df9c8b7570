// Package apitest holds the API objects and answers that unit tests build:
// a plain pod, and the API server's refusals of an eviction or a deletion as
// client-go returns them. Only tests import it.
package apitest

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pod is a pod of the default namespace, created at created, in phase, with
// annotations; its UID is "uid-" + name and its resourceVersion "7".
func Pod(name string, created time.Time, phase corev1.PodPhase, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default", UID: types.UID("uid-" + name), ResourceVersion: "7",
			CreationTimestamp: metav1.NewTime(created), Annotations: annotations,
		},
		Status: corev1.PodStatus{Phase: phase},
	}
}

// DisruptionBudgetRefusal is the Eviction API's answer when a
// PodDisruptionBudget forbids the eviction.
func DisruptionBudgetRefusal() error {
	err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10)
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes,
		metav1.StatusCause{Type: policyv1.DisruptionBudgetCause, Message: "The disruption budget web-pdb needs 1 healthy pods and has 1 currently"})
	return err
}

// MultipleBudgetsRefusal is what client-go returns for the Eviction API's
// answer about a pod under two PodDisruptionBudgets: a Status with code 500
// and no reason (k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go).
func MultipleBudgetsRefusal() error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 500,
		Message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."}}
}

// WebhookDenial is a validating webhook's denial of a DELETE, as the API
// server words it (the webhook chose no code: 400).
func WebhookDenial() error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 400,
		Message: `admission webhook "deny-delete.example.com" denied the request: pods of team x are kept for audit`}}
}
