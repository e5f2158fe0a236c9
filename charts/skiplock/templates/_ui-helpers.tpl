{{/*
Selector labels of the UI pod (Deployment, Service, NetworkPolicy).
*/}}
{{- define "skiplock.uiSelectorLabels" -}}
{{ include "skiplock.selectorLabels" . }}
app.kubernetes.io/component: ui
{{- end }}

{{/*
The UI's image: ui.image.repository (with its tag or digest) when set, else the chart's image. It needs the
`ui` extra of skiplock installed (pip install 'skiplock[ui]').
*/}}
{{- define "skiplock.uiImage" -}}
{{- $img := .Values.ui.image }}
{{- if not $img.repository }}
{{- include "skiplock.image" . }}
{{- else if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag | toString) }}
{{- end }}
{{- end }}
