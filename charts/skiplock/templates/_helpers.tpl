{{/*
Chart name, cut at 63 characters (the limit of a DNS label and of a label value).
*/}}
{{- define "skiplock.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects: release-chart, or just the release when it already contains the chart
name; cut at 63 characters.
*/}}
{{- define "skiplock.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
chart-version for the helm.sh/chart label.
*/}}
{{- define "skiplock.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels of the operator pods: stable across upgrades, never add to them.
*/}}
{{- define "skiplock.selectorLabels" -}}
app.kubernetes.io/name: {{ include "skiplock.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of every object the chart renders.
*/}}
{{- define "skiplock.labels" -}}
helm.sh/chart: {{ include "skiplock.chart" . }}
{{ include "skiplock.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: skiplock
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "skiplock.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "skiplock.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference: repository, then @digest when set, else :tag (defaulting to the chart's appVersion).
*/}}
{{- define "skiplock.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/*
True (non-empty) when more than one operator replica runs, which turns on kopf peering.
*/}}
{{- define "skiplock.ha" -}}
{{- if gt (int .Values.operator.replicas) 1 }}true{{ end }}
{{- end }}

{{/*
True (non-empty) when the operator watches only the release namespace.
*/}}
{{- define "skiplock.namespaced" -}}
{{- if eq .Values.rbac.scope "namespace" }}true{{ end }}
{{- end }}

{{/*
Render one CRD file of crds-src/ with the chart's labels and, behind crds.keep, the keep policy.
Arguments: (list $ "crds-src/file.yaml"). A file may hold several documents.
*/}}
{{- define "skiplock.crds" -}}
{{- $root := index . 0 }}
{{- $path := index . 1 }}
{{- $text := $root.Files.Get $path }}
{{- if not $text }}
{{- fail (printf "%s is missing from the chart; run tools/sync-crds.sh" $path) }}
{{- end }}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" $text -1 }}
{{- $crd := fromYaml $doc }}
{{- if $crd }}
{{- if hasKey $crd "Error" }}
{{- fail (printf "%s: %s" $path $crd.Error) }}
{{- end }}
{{- $meta := $crd.metadata }}
{{- $labels := merge (dict) (include "skiplock.labels" $root | fromYaml) (default (dict) $meta.labels) }}
{{- $_ := set $meta "labels" $labels }}
{{- if $root.Values.crds.keep }}
{{- $annotations := default (dict) $meta.annotations }}
{{- $_ := set $annotations "helm.sh/resource-policy" "keep" }}
{{- $_ := set $meta "annotations" $annotations }}
{{- end }}
---
{{ toYaml $crd }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The operator's RBAC rules, shared by the ClusterRole (rbac.scope cluster) and the Role (rbac.scope namespace).
Every verb is one the operator uses; tests/chart asserts the exact set.
*/}}
{{- define "skiplock.rbacRules" -}}
# Watch JobQueues; kopf patches them for its finalizer and progress annotations.
- apiGroups: ["skiplock.io"]
  resources: ["jobqueues"]
  verbs: ["get", "list", "watch", "patch"]
# Conditions, backlog and replica counts go to the status subresource.
- apiGroups: ["skiplock.io"]
  resources: ["jobqueues/status"]
  verbs: ["patch"]
# The worker Deployment of each JobQueue: created, scaled by patch, and deleted.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The database DSN, read from the Secret a JobQueue names (never listed or watched).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
# A Kubernetes Event for every scale change and every error.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# kopf peering keep-alives, so that exactly one of several operator pods acts.
- apiGroups: ["kopf.dev"]
  resources: [{{ if include "skiplock.namespaced" . }}"kopfpeerings"{{ else }}"clusterkopfpeerings"{{ end }}]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}

{{/*
Selector labels of the operator pods (Deployment, Service, PodDisruptionBudget, anti-affinity). The component
label keeps them apart from anything else that carries the release's name and instance labels.
*/}}
{{- define "skiplock.operatorSelectorLabels" -}}
{{ include "skiplock.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
Name of the kopf peering object shared by the operator pods when replicas > 1.
*/}}
{{- define "skiplock.peeringName" -}}
{{- default (include "skiplock.fullname" .) .Values.operator.peeringName }}
{{- end }}
