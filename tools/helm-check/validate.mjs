// Validates rendered Kubernetes manifests offline.
//
//   node validate.mjs rendered.yaml [more.yaml ...]
//
// Each file is one `helm template` output (one release). Every document is checked against the
// Kubernetes OpenAPI schemas of the npm package kubernetes-models (types, required fields, enums,
// unknown kinds) and, for monitoring.coreos.com/v1, of @kubernetes-models/prometheus-operator.
// Then the documents of one file are checked against each other: what a schema cannot see but
// the API server or the kubelet would reject, or what would silently not work (a Service that
// selects no pod, a probe on an undeclared port, a PodMonitor port that no container has, the
// router's --workers-dns pointing at no headless Service, GPU count different from --tp).
// Exit status: 0 when every file is clean, 1 when any check failed, 2 on usage errors.

import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const PROMETHEUS_OPERATOR_GROUP = "monitoring.coreos.com/v1";
const WORKLOAD_KINDS = new Set(["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"]);
const BUILTIN_RESOURCES = /^(cpu|memory|ephemeral-storage|hugepages-.+)$/;
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS1035_LABEL = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const IANA_SVC_NAME = /^(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

const moduleCache = new Map();

/** Imports the kubernetes-models module holding the kinds of one apiVersion (null if none). */
async function modelsFor(apiVersion) {
  if (moduleCache.has(apiVersion)) return moduleCache.get(apiVersion);
  const specifier =
    apiVersion === PROMETHEUS_OPERATOR_GROUP
      ? `@kubernetes-models/prometheus-operator/${apiVersion}`
      : `kubernetes-models/${apiVersion}`;
  let mod = null;
  try {
    mod = await import(specifier);
  } catch {
    mod = null;
  }
  moduleCache.set(apiVersion, mod);
  return mod;
}

/** Schema check of one document; returns a list of messages. */
async function schemaErrors(doc) {
  const { apiVersion, kind } = doc;
  if (typeof apiVersion !== "string" || typeof kind !== "string") {
    return ["apiVersion and kind must be strings"];
  }
  const mod = await modelsFor(apiVersion);
  if (!mod) return [`unknown apiVersion ${apiVersion}`];
  const Model = mod[kind];
  if (typeof Model !== "function") return [`unknown kind ${kind} in ${apiVersion}`];
  let model;
  try {
    model = new Model(doc);
  } catch (e) {
    return [`cannot build ${kind}: ${e.message}`];
  }
  if (model.kind !== kind || model.apiVersion !== apiVersion) {
    return [`${apiVersion} ${kind} is not a top-level resource`];
  }
  try {
    model.validate();
  } catch (e) {
    // ajv messages: "data/spec/replicas must be integer, data/... must be ...".
    return String(e.message)
      .split(/, (?=data)/)
      .map((m) => m.replace(/^data/, ""));
  }
  return [];
}

/** Whether a label selector (matchLabels + matchExpressions, or a plain map) selects labels. */
function selects(selector, labels) {
  if (!selector) return false;
  labels = labels || {};
  const plain = !("matchLabels" in selector) && !("matchExpressions" in selector);
  const matchLabels = plain ? selector : selector.matchLabels || {};
  const expressions = plain ? [] : selector.matchExpressions || [];
  if (Object.keys(matchLabels).length === 0 && expressions.length === 0) return false;
  for (const [k, v] of Object.entries(matchLabels)) if (labels[k] !== v) return false;
  for (const e of expressions) {
    const has = Object.prototype.hasOwnProperty.call(labels, e.key);
    const value = labels[e.key];
    switch (e.operator) {
      case "In":
        if (!has || !(e.values || []).includes(value)) return false;
        break;
      case "NotIn":
        if (has && (e.values || []).includes(value)) return false;
        break;
      case "Exists":
        if (!has) return false;
        break;
      case "DoesNotExist":
        if (has) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

/** The pod template (or bare Pod) of a document: {labels, spec} or null. */
function podOf(doc) {
  if (doc.kind === "Pod") return { labels: doc.metadata?.labels || {}, spec: doc.spec || {} };
  if (doc.kind === "CronJob") {
    const t = doc.spec?.jobTemplate?.spec?.template;
    return t ? { labels: t.metadata?.labels || {}, spec: t.spec || {} } : null;
  }
  if (!WORKLOAD_KINDS.has(doc.kind)) return null;
  const t = doc.spec?.template;
  return t ? { labels: t.metadata?.labels || {}, spec: t.spec || {} } : null;
}

function allContainers(spec) {
  return [...(spec.initContainers || []), ...(spec.containers || [])];
}

/** Value of a `--name=value` or `--name value` flag in a container's command line. */
function flagValue(container, name) {
  const argv = [...(container.command || []), ...(container.args || [])].map(String);
  for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith(`${name}=`)) return argv[i].slice(name.length + 1);
    if (argv[i] === name && i + 1 < argv.length) return argv[i + 1];
  }
  return undefined;
}

function isHeadless(svc) {
  return svc.spec?.clusterIP === "None";
}

function checkPod(where, pod, extraVolumeNames, err) {
  const volumes = new Set([...(pod.spec.volumes || []).map((v) => v.name), ...extraVolumeNames]);
  const seenVolumes = new Set();
  for (const v of pod.spec.volumes || []) {
    if (seenVolumes.has(v.name)) err(`${where}: volume ${v.name} declared twice`);
    seenVolumes.add(v.name);
  }
  const containerNames = new Set();
  for (const c of allContainers(pod.spec)) {
    const cw = `${where} container ${c.name}`;
    if (containerNames.has(c.name)) err(`${cw}: container name used twice`);
    containerNames.add(c.name);
    if (!DNS1123_LABEL.test(c.name || "")) err(`${cw}: name is not a DNS-1123 label`);
    const mountPaths = new Set();
    for (const m of c.volumeMounts || []) {
      if (!volumes.has(m.name)) err(`${cw}: volumeMount ${m.name} names no volume of the pod`);
      if (mountPaths.has(m.mountPath)) err(`${cw}: mountPath ${m.mountPath} mounted twice`);
      mountPaths.add(m.mountPath);
    }
    const portNames = new Set();
    const portNumbers = new Set();
    for (const p of c.ports || []) {
      portNumbers.add(p.containerPort);
      if (p.name === undefined) continue;
      if (p.name.length > 15 || !IANA_SVC_NAME.test(p.name)) {
        err(`${cw}: port name ${p.name} is not an IANA service name (max 15 chars)`);
      }
      if (portNames.has(p.name)) err(`${cw}: port name ${p.name} used twice`);
      portNames.add(p.name);
    }
    for (const probeName of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      const probe = c[probeName];
      if (!probe) continue;
      const handler = probe.grpc || probe.httpGet || probe.tcpSocket;
      if (!handler) continue;
      const port = handler.port;
      if (typeof port === "number" ? !portNumbers.has(port) : !portNames.has(port)) {
        err(`${cw}: ${probeName} port ${port} is not a declared container port`);
      }
      if (probeName !== "readinessProbe" && probe.successThreshold > 1) {
        err(`${cw}: ${probeName}.successThreshold must be 1`);
      }
    }
    // $(VAR) in args must name an env var of the container, or Kubernetes passes it verbatim.
    const envNames = new Set((c.env || []).map((e) => e.name));
    for (const a of [...(c.command || []), ...(c.args || [])].map(String)) {
      for (const m of a.matchAll(/(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
        if (!envNames.has(m[1])) err(`${cw}: argument ${a} refers to undefined env var ${m[1]}`);
      }
    }
    // Extended resources (GPUs) cannot be overcommitted: requests must equal limits.
    const req = c.resources?.requests || {};
    const lim = c.resources?.limits || {};
    for (const r of new Set([...Object.keys(req), ...Object.keys(lim)])) {
      if (BUILTIN_RESOURCES.test(r)) continue;
      if (lim[r] === undefined) err(`${cw}: extended resource ${r} needs a limit`);
      else if (req[r] !== undefined && String(req[r]) !== String(lim[r])) {
        err(`${cw}: extended resource ${r}: request ${req[r]} differs from limit ${lim[r]}`);
      }
    }
    // A kvserve worker asks for as many GPUs as its tensor-parallel size.
    const tp = flagValue(c, "--tp");
    const gpus = lim["nvidia.com/gpu"];
    if (gpus !== undefined && Number(gpus) !== Number(tp ?? 1)) {
      err(`${cw}: requests ${gpus} nvidia.com/gpu but runs with --tp=${tp ?? 1}`);
    }
  }
}

/** Cross-document checks of one rendered release. */
function checkRelease(docs, err) {
  const byKey = new Map();
  for (const d of docs) {
    const key = `${d.kind}/${d.metadata?.namespace ?? ""}/${d.metadata?.name}`;
    if (byKey.has(key)) err(`${d.kind} ${d.metadata?.name}: defined twice`);
    byKey.set(key, d);
  }
  const services = docs.filter((d) => d.kind === "Service");
  const pods = docs
    .map((d) => ({ doc: d, pod: podOf(d) }))
    .filter((p) => p.pod && !isHook(p.doc));
  const nsOf = (d) => d.metadata?.namespace ?? "";

  for (const d of docs) {
    const name = d.metadata?.name ?? "";
    const where = `${d.kind} ${name}`;
    if (!DNS1123_SUBDOMAIN.test(name) || name.length > 253) {
      err(`${where}: metadata.name is not a DNS-1123 subdomain`);
    }
    if (d.kind === "Service" && (!DNS1035_LABEL.test(name) || name.length > 63)) {
      err(`${where}: Service names must be DNS-1035 labels of at most 63 characters`);
    }
    if (d.kind === "StatefulSet" && name.length > 52) {
      err(`${where}: name longer than 52 characters breaks the controller-revision-hash label`);
    }
    for (const [k, v] of Object.entries(d.metadata?.labels || {})) {
      if (typeof v !== "string" || v.length > 63) err(`${where}: label ${k} value invalid`);
    }
    const pod = podOf(d);
    if (pod) {
      if (d.kind !== "Pod" && d.kind !== "CronJob" && d.kind !== "Job") {
        if (!selects(d.spec?.selector, pod.labels)) {
          err(`${where}: spec.selector does not select the pod template's labels`);
        }
      }
      const claimTemplates = (d.spec?.volumeClaimTemplates || []).map((t) => t.metadata?.name);
      checkPod(where, pod, claimTemplates, err);
      for (const c of allContainers(pod.spec)) checkWorkersDns(where, c, services, err);
    }
    if (d.kind === "StatefulSet") {
      const svc = services.find((s) => s.metadata.name === d.spec?.serviceName && nsOf(s) === nsOf(d));
      if (!svc) err(`${where}: serviceName ${d.spec?.serviceName} names no Service of the release`);
      else if (!isHeadless(svc)) err(`${where}: serviceName ${svc.metadata.name} is not headless`);
    }
    if (d.kind === "Service" && d.spec?.selector) {
      const matched = pods.filter((p) => nsOf(p.doc) === nsOf(d) && selects(d.spec.selector, p.pod.labels));
      if (matched.length === 0) err(`${where}: selector matches no pod template of the release`);
      for (const port of d.spec.ports || []) {
        if (typeof port.targetPort !== "string") continue;
        for (const m of matched) {
          const named = (m.pod.spec.containers || []).some((c) =>
            (c.ports || []).some((p) => p.name === port.targetPort),
          );
          if (!named) {
            err(`${where}: targetPort ${port.targetPort} is no container port of ${m.doc.kind} ${m.doc.metadata.name}`);
          }
        }
      }
    }
    if (d.kind === "PodDisruptionBudget") {
      if (!pods.some((p) => nsOf(p.doc) === nsOf(d) && selects(d.spec?.selector, p.pod.labels))) {
        err(`${where}: selector matches no pod template of the release`);
      }
    }
    if (d.kind === "HorizontalPodAutoscaler") {
      const ref = d.spec?.scaleTargetRef || {};
      const target = docs.find((t) => t.kind === ref.kind && t.metadata?.name === ref.name);
      if (!target) err(`${where}: scaleTargetRef ${ref.kind}/${ref.name} is not in the release`);
      else if (target.spec?.replicas !== undefined) {
        err(`${where}: ${ref.kind} ${ref.name} sets spec.replicas; every upgrade would reset the HPA's count`);
      }
      if (d.spec?.minReplicas > d.spec?.maxReplicas) err(`${where}: minReplicas > maxReplicas`);
    }
    if (d.kind === "ServiceMonitor") checkServiceMonitor(where, d, services, err);
    if (d.kind === "PodMonitor") checkPodMonitor(where, d, pods, err);
  }
}

function isHook(doc) {
  return Boolean(doc.metadata?.annotations?.["helm.sh/hook"]);
}

/** The router's --workers-dns NAME.NS.svc.DOMAIN:PORT must resolve to a headless Service port. */
function checkWorkersDns(where, container, services, err) {
  const target = flagValue(container, "--workers-dns");
  if (target === undefined) return;
  const m = /^([^.:]+)\.([^.:]+)\.svc\.([^:]+):(\d+)$/.exec(target);
  if (!m) {
    err(`${where}: --workers-dns=${target} is not NAME.NAMESPACE.svc.DOMAIN:PORT`);
    return;
  }
  const [, name, ns, , port] = m;
  const svc = services.find((s) => s.metadata.name === name);
  if (!svc) return err(`${where}: --workers-dns names Service ${name}, not in the release`);
  if ((svc.metadata.namespace ?? ns) !== ns) {
    err(`${where}: --workers-dns namespace ${ns} differs from Service ${name}'s ${svc.metadata.namespace}`);
  }
  if (!isHeadless(svc)) err(`${where}: --workers-dns Service ${name} is not headless (clusterIP: None)`);
  if (!(svc.spec.ports || []).some((p) => p.port === Number(port))) {
    err(`${where}: --workers-dns port ${port} is not a port of Service ${name}`);
  }
}

function checkMonitorNamespaces(where, d, targetNs, err) {
  const names = d.spec?.namespaceSelector?.matchNames;
  if (names && !d.spec.namespaceSelector.any && !names.includes(targetNs)) {
    err(`${where}: namespaceSelector does not include namespace ${targetNs}`);
  }
}

function checkServiceMonitor(where, d, services, err) {
  const matched = services.filter((s) => selects(d.spec?.selector, s.metadata?.labels));
  if (matched.length === 0) return err(`${where}: selector matches no Service of the release`);
  for (const s of matched) checkMonitorNamespaces(where, d, s.metadata.namespace ?? "", err);
  for (const e of d.spec?.endpoints || []) {
    if (e.port === undefined) continue;
    for (const s of matched) {
      if (!(s.spec?.ports || []).some((p) => p.name === e.port)) {
        err(`${where}: endpoint port ${e.port} is not a port name of Service ${s.metadata.name}`);
      }
    }
  }
}

function checkPodMonitor(where, d, pods, err) {
  const matched = pods.filter((p) => selects(d.spec?.selector, p.pod.labels));
  if (matched.length === 0) return err(`${where}: selector matches no pod template of the release`);
  for (const p of matched) checkMonitorNamespaces(where, d, p.doc.metadata?.namespace ?? "", err);
  for (const e of d.spec?.podMetricsEndpoints || []) {
    if (e.port === undefined) continue;
    for (const p of matched) {
      const has = (p.pod.spec.containers || []).some((c) => (c.ports || []).some((cp) => cp.name === e.port));
      if (!has) err(`${where}: port ${e.port} is no container port of ${p.doc.kind} ${p.doc.metadata.name}`);
    }
  }
}

async function checkFile(path) {
  const errors = [];
  const text = readFileSync(path, "utf8");
  const parsed = parseAllDocuments(text, { uniqueKeys: true, prettyErrors: true });
  const docs = [];
  for (const [i, d] of parsed.entries()) {
    for (const e of d.errors) errors.push(`document ${i + 1}: YAML: ${e.message}`);
    for (const w of d.warnings) errors.push(`document ${i + 1}: YAML: ${w.message}`);
    if (d.errors.length) continue;
    const obj = d.toJS();
    if (obj === null || obj === undefined) continue;
    if (typeof obj !== "object" || Array.isArray(obj)) {
      errors.push(`document ${i + 1}: not a mapping`);
      continue;
    }
    docs.push(obj);
  }
  const kinds = {};
  for (const doc of docs) {
    const where = `${doc.kind} ${doc.metadata?.name}`;
    kinds[doc.kind] = (kinds[doc.kind] || 0) + 1;
    for (const e of await schemaErrors(doc)) errors.push(`${where}: ${e}`);
  }
  checkRelease(docs, (m) => errors.push(m));
  return { docs, kinds, errors };
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: node validate.mjs RENDERED.yaml...");
  process.exit(2);
}
let failed = false;
for (const f of files) {
  let result;
  try {
    result = await checkFile(f);
  } catch (e) {
    console.error(`${f}: ${e.message}`);
    failed = true;
    continue;
  }
  const { docs, kinds, errors } = result;
  if (docs.length === 0) errors.push("no documents");
  const summary = Object.entries(kinds)
    .map(([k, n]) => `${n} ${k}`)
    .join(", ");
  if (errors.length === 0) {
    console.log(`${f}: ${docs.length} documents valid (${summary})`);
  } else {
    failed = true;
    for (const e of errors) console.error(`${f}: ${e}`);
  }
}
process.exit(failed ? 1 : 0);
