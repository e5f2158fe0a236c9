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
True (non-empty) when the operator watches a fixed list of namespaces (rbac.scope namespace: the release
namespace, or every namespace of rbac.namespaces), with a Role in each instead of a ClusterRole.
*/}}
{{- define "skiplock.namespaced" -}}
{{- if eq .Values.rbac.scope "namespace" }}true{{ end }}
{{- end }}

{{/*
The namespaces the operator watches in namespaced mode, as a JSON list: rbac.namespaces when given (the
multi-namespace install), else the release namespace. Use with fromJsonArray.
*/}}
{{- define "skiplock.watchedNamespaces" -}}
{{- if and .Values.rbac.namespaces (not (include "skiplock.namespaced" .)) }}
{{- fail "rbac.namespaces lists the namespaces of rbac.scope namespace; with rbac.scope cluster leave it empty" }}
{{- end }}
{{- if .Values.rbac.namespaces }}
{{- toJson (uniq .Values.rbac.namespaces) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
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
The operator's RBAC rules, shared by the ClusterRole (rbac.scope cluster) and the Roles (rbac.scope namespace,
one per watched namespace). Every verb is one the operator or kopf uses; tests/chart asserts the exact set.
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
# The worker Deployment of each JobQueue: created, scaled by patch, deleted, and watched so that a hand edit
# of a Deployment it owns is reconciled back (drift correction).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The database DSN, read from the Secret a JobQueue names (the operator reads only Secrets labelled
# skiplock.io/dsn=true). Listed and watched only with rbac.watchSecrets, so that a rotation is seen at once.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: [{{ if .Values.rbac.watchSecrets }}"get", "list", "watch"{{ else }}"get"{{ end }}]
{{- if .Values.rbac.drainPods }}
# Busy-pod-safe scale-in (rbac.drainPods): the worker pods are listed to rank them by the jobs they hold, and
# patched with controller.kubernetes.io/pod-deletion-cost so that the ones drained go first.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "patch"]
{{- end }}
# A Kubernetes Event for every scale decision and every error (patch: kopf and the client aggregate repeats).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# kopf peering keep-alives, so that exactly one of several operator pods acts.
- apiGroups: ["kopf.dev"]
  resources: [{{ if include "skiplock.namespaced" . }}"kopfpeerings"{{ else }}"clusterkopfpeerings"{{ end }}]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}

{{/*
Comma-separated list for an operator environment variable; an item holding a comma fails the render.
Arguments: (list "values.key" $items).
*/}}
{{- define "skiplock.csv" -}}
{{- $key := index . 0 }}
{{- range $item := index . 1 }}
{{- if or (contains "," $item) (not $item) }}
{{- fail (printf "%s: %q must be non-empty and hold no comma" $key $item) }}
{{- end }}
{{- end }}
{{- join "," (index . 1) }}
{{- end }}

{{/*
Allow-list entries as CEL data for the admission policy: {"text": ..., "prefix": true} for an entry ending in *
(the * dropped) or / (kept), {"text": ..., "prefix": false} for an exact one. The operator reads the same forms.
*/}}
{{- define "skiplock.celRules" -}}
{{- $out := list }}
{{- range (default (list) .) }}
{{- if hasSuffix "*" . }}
{{- $out = append $out (dict "text" (trimSuffix "*" .) "prefix" true) }}
{{- else }}
{{- $out = append $out (dict "text" . "prefix" (hasSuffix "/" .)) }}
{{- end }}
{{- end }}
{{- toJson $out }}
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

{{/*
"true" when JobQueues may set tolerations, affinity and nodeSelector: one switch for the three, on only when
policy.allowTolerations, policy.allowAffinity and policy.allowNodeSelector are all true (mixed values fail).
*/}}
{{- define "skiplock.allowScheduling" -}}
{{- $p := .Values.policy }}
{{- if and $p.allowTolerations $p.allowAffinity $p.allowNodeSelector }}true
{{- else if or $p.allowTolerations $p.allowAffinity $p.allowNodeSelector }}
{{- fail "policy.allowTolerations, policy.allowAffinity and policy.allowNodeSelector are one switch in the operator: set all three alike" }}
{{- else }}false
{{- end }}
{{- end }}
