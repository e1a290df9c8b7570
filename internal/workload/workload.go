// Package workload builds the realistic pods that the load benchmark creates
// and that the cache-memory Go benchmark measures.
package workload

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const (
	AnnotationExpiresAt = "podjanitor.io/expires-at"
	LabelScenario       = "bench.podjanitor.io/scenario"
)

// Pod is a realistic workload pod: an app container and a proxy sidecar,
// env (plain and downward API), three kinds of probes, resources, volume
// mounts, configMap/secret/emptyDir volumes, anti-affinity, tolerations,
// security contexts, the usual labels and annotations. The API server adds
// the service account token volume, default tolerations and managedFields;
// stored, it is about 7 KB of JSON unbound and ~10 KB bound with a Running
// status (see the report's pod_json_bytes).
func Pod(ns, name, scenario string, i int, expiresAt time.Time, nodeName string) *corev1.Pod {
	sum := sha256.Sum256([]byte(name))
	checksum := hex.EncodeToString(sum[:])
	probe := func(path string, port int32, period int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(port), Scheme: corev1.URISchemeHTTP}},
			InitialDelaySeconds: 5, PeriodSeconds: period, TimeoutSeconds: 2, SuccessThreshold: 1, FailureThreshold: 3,
		}
	}
	res := func(cpu, mem, cpuLim, memLim string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpuLim), corev1.ResourceMemory: resource.MustParse(memLim)},
		}
	}
	fieldEnv := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}}
	}
	no, yes := false, true
	uid, fsGroup := int64(10001), int64(10001)
	grace := int64(30)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: ns,
			Labels: map[string]string{
				"app.kubernetes.io/name":      "checkout-api",
				"app.kubernetes.io/instance":  "checkout-api-prod",
				"app.kubernetes.io/version":   "2.14.3",
				"app.kubernetes.io/component": "api",
				"app.kubernetes.io/part-of":   "shop",
				"pod-template-hash":           "6f7c9d8b54",
				"team":                        "payments",
				LabelScenario:                 scenario,
			},
			Annotations: map[string]string{
				AnnotationExpiresAt:                       expiresAt.UTC().Format(time.RFC3339Nano),
				"prometheus.io/scrape":                    "true",
				"prometheus.io/port":                      "9102",
				"prometheus.io/path":                      "/metrics",
				"checksum/config":                         checksum,
				"kubectl.kubernetes.io/default-container": "app",
			},
		},
		Spec: corev1.PodSpec{
			NodeName:                      nodeName,
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: &grace,
			DNSPolicy:                     corev1.DNSClusterFirst,
			SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &uid, FSGroup: &fsGroup, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
					Weight: 100,
					PodAffinityTerm: corev1.PodAffinityTerm{
						TopologyKey:   "kubernetes.io/hostname",
						LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "checkout-api"}},
					},
				}},
			}},
			Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "payments", Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{
				{
					Name:    "app",
					Image:   "registry.example.com/payments/checkout-api:2.14.3",
					Command: []string{"/app/checkout-api"},
					Args:    []string{"--listen=:8080", "--admin-listen=:9102", "--config=/etc/checkout/config.yaml", "--log-format=json"},
					Ports: []corev1.ContainerPort{
						{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
						{Name: "metrics", ContainerPort: 9102, Protocol: corev1.ProtocolTCP},
					},
					Env: []corev1.EnvVar{
						{Name: "APP_ENV", Value: "production"},
						{Name: "LOG_LEVEL", Value: "info"},
						{Name: "DB_HOST", Value: "payments-db.payments.svc.cluster.local"},
						{Name: "DB_PORT", Value: "5432"},
						{Name: "CACHE_URL", Value: "redis://checkout-cache.payments.svc.cluster.local:6379/0"},
						{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "http://otel-collector.observability.svc:4317"},
						{Name: "FEATURE_FLAGS", Value: "new-pricing,async-receipts"},
						{Name: "GOMAXPROCS", Value: "2"},
						{Name: "DB_PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
							LocalObjectReference: corev1.LocalObjectReference{Name: "checkout-db"}, Key: "password"}}},
						fieldEnv("POD_NAME", "metadata.name"),
						fieldEnv("POD_NAMESPACE", "metadata.namespace"),
						fieldEnv("POD_IP", "status.podIP"),
						fieldEnv("NODE_NAME", "spec.nodeName"),
					},
					Resources:      res("250m", "256Mi", "1", "512Mi"),
					LivenessProbe:  probe("/healthz", 9102, 10),
					ReadinessProbe: probe("/readyz", 9102, 5),
					StartupProbe:   probe("/healthz", 9102, 2),
					VolumeMounts: []corev1.VolumeMount{
						{Name: "config", MountPath: "/etc/checkout", ReadOnly: true},
						{Name: "tls", MountPath: "/etc/tls", ReadOnly: true},
						{Name: "tmp", MountPath: "/tmp"},
					},
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes,
						Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
					ImagePullPolicy:          corev1.PullIfNotPresent,
					TerminationMessagePath:   "/dev/termination-log",
					TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				},
				{
					Name:  "proxy",
					Image: "registry.example.com/platform/envoy:1.31.2",
					Args:  []string{"--config-path", "/etc/envoy/envoy.yaml", "--log-level", "warn", "--drain-time-s", "20"},
					Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 8443, Protocol: corev1.ProtocolTCP}},
					Env: []corev1.EnvVar{
						{Name: "ENVOY_UID", Value: "10001"},
						{Name: "UPSTREAM", Value: "127.0.0.1:8080"},
						fieldEnv("POD_NAME", "metadata.name"),
					},
					Resources:      res("100m", "64Mi", "500m", "128Mi"),
					ReadinessProbe: probe("/ready", 8443, 5),
					VolumeMounts: []corev1.VolumeMount{
						{Name: "envoy-config", MountPath: "/etc/envoy", ReadOnly: true},
						{Name: "tls", MountPath: "/etc/tls", ReadOnly: true},
					},
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes},
					ImagePullPolicy: corev1.PullIfNotPresent,
				},
			},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "checkout-api-config"}}}},
				{Name: "envoy-config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "checkout-envoy"}}}},
				{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "checkout-api-tls"}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptrQ("1Gi")}}},
			},
		},
	}
	_ = i
	if nodeName == "" {
		// No scheduler serves this name, so an unbound pod stays Pending and
		// unbound, and nothing but podjanitor and the API server works on it,
		// also in a cluster that runs kube-scheduler (the real node's).
		pod.Spec.SchedulerName = UnboundScheduler
	}
	return pod
}

// UnboundScheduler is the scheduler name of unbound pods: one that no
// scheduler serves.
const UnboundScheduler = "podjanitor-bench-none"

func ptrQ(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

// RunningStatus is what a kubelet reports for the pod once both containers run.
func RunningStatus(pod *corev1.Pod, started time.Time, i int) corev1.PodStatus {
	t := metav1.NewTime(started.Truncate(time.Second))
	ip := fmt.Sprintf("10.%d.%d.%d", 64+(i>>16)&63, (i>>8)&255, i&255)
	cond := func(ty corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: ty, Status: corev1.ConditionTrue, LastTransitionTime: t}
	}
	cs := func(name, image string) corev1.ContainerStatus {
		sum := sha256.Sum256([]byte(pod.Name + name))
		return corev1.ContainerStatus{
			Name: name, Ready: true, Started: ptrBool(true), RestartCount: 0,
			Image:       image,
			ImageID:     image + "@sha256:" + hex.EncodeToString(sum[:]),
			ContainerID: "containerd://" + hex.EncodeToString(sum[:]),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: t}},
		}
	}
	return corev1.PodStatus{
		Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{
			cond("PodReadyToStartContainers"), cond(corev1.PodInitialized), cond(corev1.PodReady),
			cond(corev1.ContainersReady), cond(corev1.PodScheduled),
		},
		HostIP:            "10.1.0.2",
		HostIPs:           []corev1.HostIP{{IP: "10.1.0.2"}},
		PodIP:             ip,
		PodIPs:            []corev1.PodIP{{IP: ip}},
		StartTime:         &t,
		QOSClass:          corev1.PodQOSBurstable,
		ContainerStatuses: []corev1.ContainerStatus{cs("app", pod.Spec.Containers[0].Image), cs("proxy", pod.Spec.Containers[1].Image)},
	}
}

func ptrBool(b bool) *bool { return &b }
