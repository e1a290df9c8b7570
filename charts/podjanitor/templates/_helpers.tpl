{{/* The chart's name, overridable with nameOverride. */}}
{{- define "podjanitor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object names: the release name, with the chart's name appended unless it contains it. */}}
{{- define "podjanitor.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "podjanitor.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "podjanitor.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "podjanitor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "podjanitor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "podjanitor.labels" -}}
{{ include "podjanitor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Leader election is on when asked for, and always with more than one replica. */}}
{{- define "podjanitor.leaderElect" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicas) 1) }}true{{ else }}false{{ end }}
{{- end }}

{{/*
Whether podjanitor uses its Lease: to elect a leader, or to record held waves
and their approvals (holdWaves.enabled).
*/}}
{{- define "podjanitor.usesLease" -}}
{{- if or (eq (include "podjanitor.leaderElect" .) "true") .Values.holdWaves.enabled }}true{{ else }}false{{ end }}
{{- end }}

{{/*
The leader-election Lease (--leader-elect-resource-name): leaderElection.leaseName,
else the fullname, so that releases in one namespace (a dryRun canary beside the
live release, per-team scope namespace releases) elect apart.
*/}}
{{- define "podjanitor.leaseName" -}}
{{- .Values.leaderElection.leaseName | default (include "podjanitor.fullname" .) }}
{{- end }}

{{/* The namespace whose pods podjanitor watches with scope namespace. */}}
{{- define "podjanitor.watchNamespace" -}}
{{- .Values.watchNamespace | default .Release.Namespace }}
{{- end }}

{{/* The annotation key for name under the configured prefix: podjanitor.io/ttl. */}}
{{- define "podjanitor.annotation" -}}
{{- printf "%s/%s" .root.Values.annotationPrefix .name }}
{{- end }}

{{/* The metrics Service, whose names a cert-manager certificate is for. */}}
{{- define "podjanitor.metricsService" -}}
{{- printf "%s-metrics" (include "podjanitor.fullname" .) }}
{{- end }}

{{/* The Secret of the metrics serving certificate that cert-manager issues. */}}
{{- define "podjanitor.metricsCertSecret" -}}
{{- printf "%s-metrics-cert" (include "podjanitor.fullname" .) }}
{{- end }}

{{/* The scrapers' ClusterRole, and the ServiceAccount (and its token Secret) the monitors scrape as. */}}
{{- define "podjanitor.metricsReader" -}}
{{- printf "%s-metrics-reader" (include "podjanitor.fullname" .) }}
{{- end }}

{{/*
The scrape settings of a monitor endpoint (PodMonitor, ServiceMonitor) for the
metrics endpoint: HTTPS with the reader's token, verifying cert-manager's
certificate (ca.crt, the Service's name) or skipping the self-signed one's.
*/}}
{{- define "podjanitor.monitorEndpointAuth" -}}
{{- if .Values.metrics.secure }}
scheme: https
authorization:
  type: Bearer
  credentials:
    name: {{ include "podjanitor.metricsReader" . }}-token
    key: token
tlsConfig:
  {{- if .Values.metrics.certManager.enabled }}
  ca:
    secret:
      name: {{ include "podjanitor.metricsCertSecret" . }}
      key: ca.crt
  serverName: {{ include "podjanitor.metricsService" . }}.{{ .Release.Namespace }}.svc
  {{- else }}
  # The certificate is self-signed at start.
  insecureSkipVerify: true
  {{- end }}
{{- else }}
scheme: http
{{- end }}
{{- end }}
