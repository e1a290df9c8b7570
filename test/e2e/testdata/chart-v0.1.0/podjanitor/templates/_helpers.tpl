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

{{/* The namespace whose pods podjanitor watches with scope namespace. */}}
{{- define "podjanitor.watchNamespace" -}}
{{- .Values.watchNamespace | default .Release.Namespace }}
{{- end }}

{{/* The annotation key for name under the configured prefix: podjanitor.io/ttl. */}}
{{- define "podjanitor.annotation" -}}
{{- printf "%s/%s" .root.Values.annotationPrefix .name }}
{{- end }}
