// +k8s:deepcopy-gen=package
// +groupName=podjanitor.io

// Package v1alpha1 is the podjanitor.io/v1alpha1 API: PodLifetimePolicy, the
// lifetime rules that a namespace's owners write for the pods of their own
// namespace. The CRD is artifacts/crd/podjanitor.io_podlifetimepolicies.yaml,
// generated from these types by hack/update-codegen.sh.
//
// The cluster policy file (artifacts/policy.yaml, kind PodJanitorPolicy in the
// same apiVersion) is not a Kubernetes object and has no resource: it is read
// from a file or ConfigMap by the cluster admin's podjanitor.
package v1alpha1
