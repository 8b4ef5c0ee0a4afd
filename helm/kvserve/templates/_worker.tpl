{{/*
The worker pod template (metadata and spec), shared by the worker StatefulSets
(worker-statefulset.yaml) and the pipeline groups' LeaderWorkerSet (worker-leaderworkerset.yaml).
Call with (dict "ctx" $ "component" "worker" "role" "" "extraArgs" (list) "discovery" true
"pipeline" "") and nindent the result under "template:":
  component  app.kubernetes.io/component of the pods
  role       --role (disaggregation: "prefill" or "decode"; "" for none)
  extraArgs  flags for this pool only, after worker.extraArgs
  discovery  label the pods kvserve.io/discovery=worker (the router finds them)
  pipeline   "" (a whole-model worker), "leader" (stage 0 of a pipeline group, the pod the router
             talks to) or "stage" (stages 1..P-1: they dial the leader, take their layers, KV pool
             and batch shape from it, and serve gRPC health only, no metrics)
*/}}
{{- define "kvserve.workerPod" -}}
{{- $ctx := .ctx -}}
{{- $pool := . -}}
{{- $w := $ctx.Values.worker -}}
{{- $e := $w.engine -}}
{{- $p := $w.pipeline -}}
{{- $tp := int $w.tensorParallelSize -}}
{{- $kvDisk := $w.kvTiers.disk -}}
{{- $grpc := int $ctx.Values.ports.grpc -}}
{{- with $ctx -}}
metadata:
  labels:
    {{- include "kvserve.selectorLabels" (dict "ctx" $ctx "component" $pool.component) | nindent 4 }}
    {{- if $pool.discovery }}
    {{- if $pool.pipeline }}
    # Only the group's leader: the router must never send requests to a stage pod.
    {{- else }}
    # Both pools answer on the headless Service when disaggregation is on.
    {{- end }}
    kvserve.io/discovery: worker
    {{- end }}
    {{- with $w.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $w.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "kvserve.serviceAccountName" . }}
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ $w.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  {{- if eq .Values.model.source "fetch" }}
  initContainers:
    {{- include "kvserve.fetchInitContainer" . | nindent 4 }}
  {{- end }}
  containers:
    - name: worker
      image: {{ include "kvserve.image" (dict "ctx" $ctx "image" $w.image) }}
      imagePullPolicy: {{ $w.image.pullPolicy }}
      args:
        - worker
        - --model={{ include "kvserve.modelPath" . }}
        - --listen=0.0.0.0:{{ .Values.ports.grpc }}
        {{- if ne $pool.pipeline "stage" }}
        - --advertise=$(POD_IP):{{ .Values.ports.grpc }}
        {{- end }}
        {{- with $pool.role }}
        - --role={{ . }}
        {{- end }}
        {{- if ne $pool.pipeline "stage" }}
        {{- with .Values.model.servedModelName }}
        - --served-model-name={{ . }}
        {{- end }}
        {{- end }}
        {{- if gt $tp 1 }}
        - --tp={{ $tp }}
        {{- end }}
        {{- if $pool.pipeline }}
        - --pp={{ int $p.stages }}
        {{- if eq $pool.pipeline "stage" }}
        # LWS sets both per pod: the stage's index in its group (1..P-1) and the DNS name of the
        # group's leader, <lws>-<group>.<lws>.<namespace>, published by the rendezvous Service.
        - --pp-rank=$(LWS_WORKER_INDEX)
        - --pp-leader=$(LWS_LEADER_ADDRESS):{{ $grpc }}
        {{- else }}
        {{- with $p.layers }}
        - --pp-layers={{ . }}
        {{- end }}
        {{- if not (kindIs "invalid" $p.stepTimeoutSeconds) }}
        - --pp-step-timeout={{ int $p.stepTimeoutSeconds }}
        {{- end }}
        {{- with $p.handOver }}
        - --pp-hand-over={{ . }}
        {{- end }}
        {{- end }}
        {{- end }}
        {{- with $w.device }}
        - --device={{ . }}
        {{- end }}
        {{- /* A stage takes its KV pool and batch shape from the leader: no engine flags but threads. */}}
        {{- if ne $pool.pipeline "stage" }}
        - --block-size={{ $e.blockSize }}
        {{- if not (kindIs "invalid" $e.kvCacheDtype) }}
        - --kv-cache-dtype={{ $e.kvCacheDtype }}
        {{- end }}
        {{- if not (kindIs "invalid" $e.maxNumSeqs) }}
        - --max-num-seqs={{ $e.maxNumSeqs }}
        {{- end }}
        {{- if not (kindIs "invalid" $e.maxNumBatchedTokens) }}
        - --max-num-batched-tokens={{ $e.maxNumBatchedTokens }}
        {{- end }}
        {{- if not (kindIs "invalid" $e.gpuMemoryUtilization) }}
        - --gpu-memory-utilization={{ $e.gpuMemoryUtilization }}
        {{- end }}
        {{- if not (kindIs "invalid" $e.numKvBlocks) }}
        - --num-kv-blocks={{ $e.numKvBlocks }}
        {{- end }}
        {{- end }}
        {{- if not (kindIs "invalid" $e.threads) }}
        - --threads={{ $e.threads }}
        {{- end }}
        {{- if ne $pool.pipeline "stage" }}
        {{- if not $e.prefixCaching }}
        - --no-prefix-caching
        {{- end }}
        {{- with $w.kvTiers.hostMemory }}
        - --kv-offload-memory={{ . }}
        {{- end }}
        {{- if $kvDisk.enabled }}
        - --kv-disk-dir=/var/cache/kvserve/kv
        - --kv-disk-bytes={{ $kvDisk.size }}B
        {{- end }}
        - {{ include "kvserve.drainArg" . }}
        {{- end }}
        - --log-format={{ .Values.logFormat }}
        {{- /* A stage serves gRPC health only: no metrics endpoint. */}}
        {{- if ne $pool.pipeline "stage" }}
        - {{ include "kvserve.flag.metricsListen" . }}=0.0.0.0:{{ .Values.ports.metrics }}
        {{- end }}
        {{- range $w.extraArgs }}
        - {{ . | quote }}
        {{- end }}
        {{- range $pool.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        - name: POD_IP
          valueFrom:
            fieldRef:
              fieldPath: status.podIP
        - name: POD_NAME
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- if not $w.gpu.enabled }}
        # No GPU requested: keep the NVIDIA runtime from exposing every GPU of the node.
        - name: NVIDIA_VISIBLE_DEVICES
          value: void
        {{- end }}
        {{- with $w.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: grpc
          containerPort: {{ .Values.ports.grpc }}
          protocol: TCP
        {{- if ne $pool.pipeline "stage" }}
        - name: metrics
          containerPort: {{ .Values.ports.metrics }}
          protocol: TCP
        {{- end }}
      startupProbe:
        {{- include "kvserve.grpcProbe" (dict "port" .Values.ports.grpc "service" $w.probes.service "probe" $w.probes.startup) | nindent 8 }}
      readinessProbe:
        {{- include "kvserve.grpcProbe" (dict "port" .Values.ports.grpc "service" $w.probes.service "probe" $w.probes.readiness) | nindent 8 }}
      livenessProbe:
        {{- include "kvserve.grpcProbe" (dict "port" .Values.ports.grpc "service" $w.probes.service "probe" $w.probes.liveness) | nindent 8 }}
      {{- $res := deepCopy (default (dict) $w.resources) }}
      {{- if $w.gpu.enabled }}
      {{- $limits := default (dict) $res.limits }}
      {{- $requests := default (dict) $res.requests }}
      {{- $_ := set $limits $w.gpu.resourceName $tp }}
      {{- $_ := set $requests $w.gpu.resourceName $tp }}
      {{- $_ := set $res "limits" $limits }}
      {{- $_ := set $res "requests" $requests }}
      {{- end }}
      {{- with $res }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      volumeMounts:
        {{- include "kvserve.modelMount" . | nindent 8 }}
        - name: tmp
          mountPath: /tmp
        - name: dshm
          mountPath: /dev/shm
        {{- if $kvDisk.enabled }}
        - name: kv-disk
          mountPath: /var/cache/kvserve/kv
        {{- end }}
  volumes:
    {{- with include "kvserve.modelVolume" (dict "Values" .Values "router" false) | trim }}
    {{- . | nindent 4 }}
    {{- end }}
    - name: tmp
      emptyDir: {}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $w.shmSize }}
    {{- if and $kvDisk.enabled (ne $kvDisk.storage "volumeClaimTemplate") }}
    - name: kv-disk
      emptyDir:
        sizeLimit: {{ $kvDisk.size }}
    {{- end }}
  {{- with $w.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $w.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $spread := and $pool.pipeline $p.spreadTopologyKey }}
  {{- if or $w.topologySpreadConstraints $spread }}
  topologySpreadConstraints:
    {{- if $spread }}
    # The pods of one group (same LWS group key) on different nodes: at most one per
    # topologyKey domain while a domain without one is left.
    - maxSkew: 1
      topologyKey: {{ $p.spreadTopologyKey }}
      whenUnsatisfiable: DoNotSchedule
      labelSelector:
        matchLabels:
          {{- include "kvserve.selectorLabels" (dict "ctx" $ctx) | nindent 10 }}
      matchLabelKeys:
        - leaderworkerset.sigs.k8s.io/group-key
    {{- end }}
    {{- with $w.topologySpreadConstraints }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
{{- end }}
{{- end -}}
