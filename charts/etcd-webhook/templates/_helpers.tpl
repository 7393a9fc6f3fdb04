{{/* The names are fixed: the CRD (in crds/, not templated) points its conversion webhook at
     the Service etcd-webhook in the namespace etcd-system. */}}
{{- define "etcd-webhook.name" -}}etcd-webhook{{- end -}}

{{- define "etcd-webhook.checkNamespace" -}}
{{- if ne .Release.Namespace "etcd-system" -}}
{{- fail "install etcd-webhook into the namespace etcd-system (the CRD's conversion webhook points there): helm install etcd-webhook charts/etcd-webhook -n etcd-system --create-namespace" -}}
{{- end -}}
{{- /* Combinations values.schema.json cannot express, refused with what to do instead. */ -}}
{{- if ge (int .Values.podDisruptionBudget.minAvailable) (int .Values.replicas) -}}
{{- fail (printf "podDisruptionBudget.minAvailable (%d) must be below replicas (%d): otherwise no replica may ever be evicted and every node drain blocks. With replicas: 1 set podDisruptionBudget.minAvailable: 0 (and expect EtcdCluster writes to fail while that pod restarts, failurePolicy Fail)" (int .Values.podDisruptionBudget.minAvailable) (int .Values.replicas)) -}}
{{- end -}}
{{- if and .Values.controller.enabled (not .Values.controller.leaderElection) (gt (int .Values.replicas) 1) -}}
{{- fail (printf "controller.leaderElection: false with replicas: %d would run %d reconcile loops against the same EtcdClusters: keep leader election on, or set replicas: 1" (int .Values.replicas) (int .Values.replicas)) -}}
{{- end -}}
{{- end -}}

{{- /* The pods call the API (and so get a ServiceAccount token) for the reconcile loop or to read
     the serving certificate's Secret (tls.source: secret). */ -}}
{{- define "etcd-webhook.token" -}}
{{- or .Values.controller.enabled (eq .Values.tls.source "secret") -}}
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

{{- /* commonAnnotations and, with cert-manager, the CA injection: for the webhook configurations. */ -}}
{{- define "etcd-webhook.annotationsAndInjectCA" -}}
{{- $common := include "etcd-webhook.annotations" . | trim -}}
{{- $inject := include "etcd-webhook.injectCA" . | trim -}}
{{- $common -}}
{{- if and $common $inject }}{{ "\n" }}{{ end -}}
{{- $inject -}}
{{- end -}}

{{- define "etcd-webhook.injectCA" -}}
{{- if .Values.certManager.enabled }}
cert-manager.io/inject-ca-from: {{ printf "%s/etcd-webhook-serving" .Release.Namespace }}
{{- end }}
{{- end -}}
