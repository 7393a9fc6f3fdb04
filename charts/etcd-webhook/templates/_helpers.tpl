{{/* The names are fixed: the CRD (in crds/, not templated) points its conversion webhook at
     the Service etcd-webhook in the namespace etcd-system. */}}
{{- define "etcd-webhook.name" -}}etcd-webhook{{- end -}}

{{- define "etcd-webhook.checkNamespace" -}}
{{- if ne .Release.Namespace "etcd-system" -}}
{{- fail "install etcd-webhook into the namespace etcd-system (the CRD's conversion webhook points there): helm install etcd-webhook charts/etcd-webhook -n etcd-system --create-namespace" -}}
{{- end -}}
{{- end -}}

{{- define "etcd-webhook.selectorLabels" -}}
app.kubernetes.io/name: etcd-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "etcd-webhook.labels" -}}
{{ include "etcd-webhook.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "etcd-webhook.annotations" -}}
{{- with .Values.commonAnnotations }}{{ toYaml . }}{{- end }}
{{- end -}}

{{- define "etcd-webhook.injectCA" -}}
{{- if .Values.certManager.enabled }}
cert-manager.io/inject-ca-from: {{ printf "%s/etcd-webhook-serving" .Release.Namespace }}
{{- end }}
{{- end -}}
