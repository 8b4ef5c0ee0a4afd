{{/* Chart name, at most 40 characters so every suffixed name stays within limits. */}}
{{- define "kvserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name prefix of every resource: <release>-<chart> (or the release name when it already contains
the chart name), at most 40 characters: the StatefulSet name (prefix + "-worker") must stay under
52 characters for its controller-revision-hash label, and Service names under 63.
*/}}
{{- define "kvserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvserve.routerName" -}}{{ include "kvserve.fullname" . }}-router{{- end -}}
{{- define "kvserve.workerName" -}}{{ include "kvserve.fullname" . }}-worker{{- end -}}
{{- define "kvserve.workerHeadlessName" -}}{{ include "kvserve.fullname" . }}-worker-headless{{- end -}}

{{/* Labels every object carries. Call with (dict "ctx" $ "component" "router"). */}}
{{- define "kvserve.labels" -}}
helm.sh/chart: {{ include "kvserve.chart" .ctx }}
{{ include "kvserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: kvserve
{{- end -}}

{{/* Selector labels: stable across upgrades. Call with (dict "ctx" $ "component" "worker"). */}}
{{- define "kvserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvserve.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "kvserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image reference; call with (dict "ctx" $ "image" .Values.router.image). */}}
{{- define "kvserve.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* Full path of the model inside the containers. */}}
{{- define "kvserve.modelPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (trimPrefix "/" .Values.model.path) -}}
{{- end -}}

{{/* The name the router resolves to find every worker (A records of the headless Service). */}}
{{- define "kvserve.workersDns" -}}
{{- printf "%s.%s.svc.%s:%d" (include "kvserve.workerHeadlessName" .) .Release.Namespace .Values.clusterDomain (int .Values.ports.grpc) -}}
{{- end -}}

{{/*
Command-line flag names, in one place. The metrics, HTTP and drain flags are those of issue 6 and the
tensor-parallel and device flags those of issue 5 (`kvserve worker --tp N --device auto`).
*/}}
{{- define "kvserve.flag.metricsListen" -}}--metrics-listen{{- end -}}
{{- define "kvserve.flag.httpListen" -}}--http-listen{{- end -}}

{{/*
Pod volume holding the model, named "model". Call with (dict "Values" $.Values "router" bool): in
fetch mode with per-worker PVCs the router still fetches into an emptyDir.
*/}}
{{- define "kvserve.modelVolume" -}}
{{- $m := .Values.model -}}
{{- if eq $m.source "existingClaim" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "model.existingClaim.claimName is required when model.source is existingClaim" $m.existingClaim.claimName }}
    readOnly: true
{{- else if eq $m.source "hostPath" }}
- name: model
  hostPath:
    path: {{ required "model.hostPath.path is required when model.source is hostPath" $m.hostPath.path }}
    type: {{ $m.hostPath.type }}
{{- else if eq $m.source "fetch" }}
{{- if or (eq $m.fetch.storage "emptyDir") .router }}
- name: model
  emptyDir:
    sizeLimit: {{ $m.fetch.size }}
{{- end }}
{{- else }}
{{- fail (printf "model.source: unknown source %q (existingClaim, hostPath or fetch)" $m.source) }}
{{- end }}
{{- end -}}

{{/* Mount of the model volume; read-only except for the fetch init container. */}}
{{- define "kvserve.modelMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- if and (eq .Values.model.source "existingClaim") .Values.model.existingClaim.subPath }}
  subPath: {{ .Values.model.existingClaim.subPath }}
{{- end }}
{{- end -}}

{{/* The init container that fetches the model (model.source: fetch). */}}
{{- define "kvserve.fetchInitContainer" -}}
{{- $f := .Values.model.fetch -}}
- name: fetch-model
  image: {{ printf "%s:%s" $f.image.repository $f.image.tag }}
  imagePullPolicy: {{ $f.image.pullPolicy }}
  {{- with $f.command }}
  command:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $f.args }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  env:
    - name: MODEL_DIR
      value: {{ .Values.model.mountPath | quote }}
    - name: MODEL_PATH
      value: {{ include "kvserve.modelPath" . | quote }}
    {{- with $f.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $f.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: model
      mountPath: {{ .Values.model.mountPath }}
    - name: tmp
      mountPath: /tmp
{{- end -}}

{{/* gRPC probe body; call with (dict "port" 50051 "service" "" "probe" $probeValues). */}}
{{- define "kvserve.grpcProbe" -}}
grpc:
  port: {{ int .port }}
  {{- if .service }}
  service: {{ .service | quote }}
  {{- end }}
periodSeconds: {{ .probe.periodSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
timeoutSeconds: {{ default 2 .probe.timeoutSeconds }}
{{- end -}}

{{/* The worker's drain flag: seconds running requests get after SIGTERM. */}}
{{- define "kvserve.drainArg" -}}
--drain-timeout={{ int .Values.worker.drainTimeoutSeconds }}
{{- end -}}
