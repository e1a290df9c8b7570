package policy

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// created is every test pod's creationTimestamp; now is a day later.
var (
	created = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	now     = created.Add(24 * time.Hour)
)

type podOption func(*corev1.Pod)

// newPod is a Pending bare pod in namespace "default" created at created.
func newPod(opts ...podOption) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              "web-1",
			Namespace:         "default",
			CreationTimestamp: metav1.NewTime(created),
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	for _, opt := range opts {
		opt(pod)
	}
	return pod
}

func inPhase(phase corev1.PodPhase) podOption {
	return func(p *corev1.Pod) { p.Status.Phase = phase }
}

func inNamespace(ns string) podOption {
	return func(p *corev1.Pod) { p.Namespace = ns }
}

// annotated sets annotations from key, value pairs.
func annotated(keyValues ...string) podOption {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(keyValues); i += 2 {
			p.Annotations[keyValues[i]] = keyValues[i+1]
		}
	}
}

// labelled sets labels from key, value pairs.
func labelled(keyValues ...string) podOption {
	return func(p *corev1.Pod) {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		for i := 0; i+1 < len(keyValues); i += 2 {
			p.Labels[keyValues[i]] = keyValues[i+1]
		}
	}
}

func ownedBy(kinds ...string) podOption {
	return func(p *corev1.Pod) {
		for _, kind := range kinds {
			p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{Kind: kind, Name: "owner"})
		}
	}
}

func withReason(reason string) podOption {
	return func(p *corev1.Pod) { p.Status.Reason = reason }
}

func withCondition(t corev1.PodConditionType, status corev1.ConditionStatus, reason string, at time.Time) podOption {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: t, Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(at),
		})
	}
}

// notCreated clears the creationTimestamp, which the API server always sets.
func notCreated() podOption {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.Time{} }
}

func startedAt(t time.Time) podOption {
	return func(p *corev1.Pod) { st := metav1.NewTime(t); p.Status.StartTime = &st }
}

func terminating() podOption {
	return func(p *corev1.Pod) { dt := metav1.NewTime(created.Add(time.Hour)); p.DeletionTimestamp = &dt }
}

func mirror() podOption {
	return annotated(corev1.MirrorPodAnnotationKey, "abc123")
}

func withContainers(statuses ...corev1.ContainerStatus) podOption {
	return func(p *corev1.Pod) { p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, statuses...) }
}

func withInitContainers(statuses ...corev1.ContainerStatus) podOption {
	return func(p *corev1.Pod) {
		p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, statuses...)
	}
}

func terminatedContainer(reason string, finishedAt time.Time) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: "c", State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{Reason: reason, FinishedAt: metav1.NewTime(finishedAt)},
	}}
}

func waitingContainer(reason string, restarts int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: "c", RestartCount: restarts, State: corev1.ContainerState{
		Waiting: &corev1.ContainerStateWaiting{Reason: reason},
	}}
}

func runningContainer() corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: "c", State: corev1.ContainerState{
		Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(created)},
	}}
}

func ptr[T any](v T) *T { return &v }

// anyNamespace is a known namespace without labels or annotations.
var anyNamespace = &Namespace{}

// statusWritten gives the pod a managedFields entry of a status write the
// API server stamped at (whole seconds, as it stores them).
func statusWritten(manager string, at time.Time) podOption {
	return func(p *corev1.Pod) {
		stamp := metav1.NewTime(at.Truncate(time.Second))
		p.ManagedFields = append(p.ManagedFields, metav1.ManagedFieldsEntry{
			Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", Time: &stamp})
	}
}
