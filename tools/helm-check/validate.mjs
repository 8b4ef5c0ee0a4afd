// Validates rendered Kubernetes manifests offline.
//
//   node validate.mjs rendered.yaml [more.yaml ...]
//
// Each file is one `helm template` output (one release). Every document is checked against the
// Kubernetes OpenAPI schemas of the npm package kubernetes-models (types, required fields, enums,
// unknown kinds) and, for monitoring.coreos.com/v1, of @kubernetes-models/prometheus-operator.
// The API groups of schemas/*.yaml (custom resources: leaderworkerset.x-k8s.io/v1) are checked
// against those files with ajv, the Kubernetes types they embed (pod templates) against
// kubernetes-models. Any other apiVersion or kind fails: nothing passes unchecked.
// Then the documents of one file are checked against each other: what a schema cannot see but
// the API server or the kubelet would reject, or what would silently not work (a Service that
// selects no pod, a probe on an undeclared port, a PodMonitor port that no container has, the
// router's --workers-dns pointing at no headless Service or at pipeline stage pods, GPU count
// different from --tp, a pipeline group whose stages cannot find or join their leader).
// Exit status: 0 when every file is clean, 1 when any check failed, 2 on usage errors.

import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import Ajv from "ajv";
import { parse, parseAllDocuments } from "yaml";

const PROMETHEUS_OPERATOR_GROUP = "monitoring.coreos.com/v1";
const WORKLOAD_KINDS = new Set(["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"]);
const BUILTIN_RESOURCES = /^(cpu|memory|ephemeral-storage|hugepages-.+)$/;
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS1035_LABEL = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const IANA_SVC_NAME = /^(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

const LWS_GROUP = "leaderworkerset.x-k8s.io/v1";
// Labels and env vars the LeaderWorkerSet controller and its pod webhook add to every pod of a set.
const LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name";
const LWS_ENV = ["LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"];

const moduleCache = new Map();

// --- schemas of custom resources (schemas/*.yaml) ----------------------------------------------
// Each file: {apiVersion, kinds: {Kind: schema}}, the schema in the OpenAPI v3 dialect of CRDs.
// `x-kvserve-model: MODULE#TYPE` marks a Kubernetes type checked with kubernetes-models; an object
// schema with `properties` is closed unless it sets x-kubernetes-preserve-unknown-fields.
const ajv = new Ajv({ allErrors: true, strict: false });
const crdKinds = loadCrdSchemas(join(dirname(fileURLToPath(import.meta.url)), "schemas"));

function loadCrdSchemas(dir) {
  const byApiVersion = new Map();
  let files = [];
  try {
    files = readdirSync(dir).filter((f) => f.endsWith(".yaml"));
  } catch {
    return byApiVersion; // no schemas: every custom resource is an unknown apiVersion
  }
  for (const f of files) {
    const { apiVersion, kinds } = parse(readFileSync(join(dir, f), "utf8"));
    const entry = byApiVersion.get(apiVersion) || {};
    for (const [kind, schema] of Object.entries(kinds)) {
      entry[kind] = { schema, validate: ajv.compile(toJsonSchema(schema)) };
    }
    byApiVersion.set(apiVersion, entry);
  }
  return byApiVersion;
}

/** The ajv schema of a schemas/*.yaml schema: closed objects, embedded types left to checkModels. */
function toJsonSchema(node) {
  if (Array.isArray(node)) return node.map(toJsonSchema);
  if (node === null || typeof node !== "object") return node;
  if (node["x-kvserve-model"]) return { type: "object" };
  const out = {};
  for (const [k, v] of Object.entries(node)) {
    if (k.startsWith("x-")) continue;
    out[k] = ["properties", "enum", "required"].includes(k)
      ? k === "properties"
        ? Object.fromEntries(Object.entries(v).map(([p, s]) => [p, toJsonSchema(s)]))
        : v
      : toJsonSchema(v);
  }
  if (node.properties && !("additionalProperties" in node) && !node["x-kubernetes-preserve-unknown-fields"]) {
    out.additionalProperties = false;
  }
  return out;
}

/** Checks the parts of `data` that `schema` marks x-kvserve-model with kubernetes-models. */
async function checkModels(schema, data, path, errors) {
  if (!schema || typeof schema !== "object" || data === null || data === undefined) return;
  const ref = schema["x-kvserve-model"];
  if (ref) {
    const [specifier, type] = ref.split("#");
    let Model;
    try {
      Model = (await import(specifier))[type];
    } catch {
      Model = undefined;
    }
    if (typeof Model !== "function") return errors.push(`${path}: schema names unknown model ${ref}`);
    try {
      new Model(data).validate();
    } catch (e) {
      for (const m of String(e.message).split(/, (?=data)/)) errors.push(m.replace(/^data/, path));
    }
    return;
  }
  if (schema.properties && typeof data === "object" && !Array.isArray(data)) {
    for (const [k, s] of Object.entries(schema.properties)) await checkModels(s, data[k], `${path}/${k}`, errors);
  }
  if (schema.items && Array.isArray(data)) {
    for (const [i, item] of data.entries()) await checkModels(schema.items, item, `${path}/${i}`, errors);
  }
}

/** Schema check of a custom resource against schemas/*.yaml; null when its group has none. */
async function crdSchemaErrors(doc) {
  const kinds = crdKinds.get(doc.apiVersion);
  if (!kinds) return null;
  const entry = kinds[doc.kind];
  if (!entry) return [`unknown kind ${doc.kind} in ${doc.apiVersion}`];
  const errors = [];
  if (!entry.validate(doc)) {
    const all = entry.validate.errors;
    for (const e of all) {
      const at = e.instancePath || "/";
      if (e.keyword === "additionalProperties") {
        errors.push(`${at}: unknown field ${e.params.additionalProperty}`);
      } else if (e.keyword === "enum") {
        errors.push(`${at} must be one of ${e.params.allowedValues.join(", ")}`);
      } else if (e.keyword === "anyOf") {
        // One message for the alternatives (int-or-string) instead of one per branch.
        const branches = all.filter((o) => o.schemaPath.startsWith(`${e.schemaPath}/`)).map((o) => o.message);
        errors.push(`${at} matches none of: ${branches.join("; ")}`);
      } else if (!/\/anyOf\/\d+\//.test(e.schemaPath)) {
        errors.push(`${at} ${e.message}`);
      }
    }
  }
  await checkModels(entry.schema, doc, "", errors);
  return errors;
}

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
  const crdErrors = await crdSchemaErrors(doc);
  if (crdErrors) return crdErrors;
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

/**
 * The pod templates (or bare Pod) of a document: [{labels, spec, where, env, lwsRole}]. A
 * LeaderWorkerSet has two, leaders and workers (the leaders' defaults to the workers'), with the
 * labels and env vars that the LWS controller adds to each pod.
 */
function podsOf(doc) {
  const where = `${doc.kind} ${doc.metadata?.name}`;
  const one = (t, extra = {}) =>
    t ? [{ labels: t.metadata?.labels || {}, spec: t.spec || {}, where, env: [], ...extra }] : [];
  if (doc.kind === "Pod") return one(doc);
  if (doc.kind === "CronJob") return one(doc.spec?.jobTemplate?.spec?.template);
  if (doc.apiVersion === LWS_GROUP && doc.kind === "LeaderWorkerSet") {
    const lwt = doc.spec?.leaderWorkerTemplate || {};
    const lws = (t, role) => {
      if (!t) return [];
      const labels = { ...(t.metadata?.labels || {}), [LWS_NAME_LABEL]: doc.metadata?.name };
      return [{ labels, spec: t.spec || {}, where: `${where} ${role}Template`, env: LWS_ENV, lwsRole: role }];
    };
    const pods = lws(lwt.leaderTemplate || lwt.workerTemplate, "leader");
    return Number(lwt.size ?? 1) > 1 ? [...pods, ...lws(lwt.workerTemplate, "worker")] : pods;
  }
  if (!WORKLOAD_KINDS.has(doc.kind)) return [];
  return one(doc.spec?.template);
}

/** The kvserve container of a pod (`kvserve worker ...` / `kvserve router ...`), if any. */
function kvserveContainer(pod, subcommand) {
  return (pod.spec.containers || []).find((c) => String((c.args || [])[0]) === subcommand);
}

/** Whether a pod is a pipeline stage 1..P-1: it serves health only and must get no requests. */
function isPipelineStage(pod) {
  const c = kvserveContainer(pod, "worker");
  return pod.lwsRole === "worker" || (c !== undefined && flagValue(c, "--pp-rank") !== undefined);
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
  const injectedEnv = pod.env || [];
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
    const envNames = new Set([...(c.env || []).map((e) => e.name), ...injectedEnv]);
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
  const pods = docs.filter((d) => !isHook(d)).flatMap((d) => podsOf(d).map((pod) => ({ doc: d, pod })));
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
    for (const pod of podsOf(d)) {
      if (WORKLOAD_KINDS.has(d.kind) && d.kind !== "Job") {
        if (!selects(d.spec?.selector, pod.labels)) {
          err(`${where}: spec.selector does not select the pod template's labels`);
        }
      }
      const claims = d.spec?.volumeClaimTemplates || d.spec?.leaderWorkerTemplate?.volumeClaimTemplates || [];
      checkPod(pod.where, pod, claims.map((t) => t.metadata?.name), err);
      for (const c of allContainers(pod.spec)) checkWorkersDns(pod.where, c, services, pods, err);
    }
    if (d.apiVersion === LWS_GROUP && d.kind === "LeaderWorkerSet") checkLeaderWorkerSet(d, docs, services, err);
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
            err(`${where}: targetPort ${port.targetPort} is no container port of ${m.pod.where}`);
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
      else if (target.apiVersion !== ref.apiVersion) {
        err(`${where}: scaleTargetRef apiVersion ${ref.apiVersion} is not that of ${ref.kind} ${ref.name}, ` +
          target.apiVersion);
      } else if (target.spec?.replicas !== undefined) {
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

/**
 * The router's --workers-dns NAME.NS.svc.DOMAIN:PORT must resolve to a headless Service port, and
 * that Service must not select pipeline stage pods (they serve health only, never requests).
 */
function checkWorkersDns(where, container, services, pods, err) {
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
  for (const p of pods) {
    if (svc.spec?.selector && selects(svc.spec.selector, p.pod.labels) && isPipelineStage(p.pod)) {
      err(`${where}: --workers-dns Service ${name} selects the pipeline stage pods of ${p.pod.where}: ` +
        "the router would send them requests");
    }
  }
}

/**
 * A LeaderWorkerSet: names the controller derives from its name, its rendezvous Service, and for
 * kvserve pipeline groups (`kvserve worker --pp P`) that every stage can find and join its leader.
 */
function checkLeaderWorkerSet(d, docs, services, err) {
  const name = d.metadata?.name ?? "";
  const where = `LeaderWorkerSet ${name}`;
  const spec = d.spec || {};
  const lwt = spec.leaderWorkerTemplate || {};
  const size = Number(lwt.size ?? 1);
  // Groups run as StatefulSets <name> (leaders) and <name>-<group> (each group's workers).
  const hpa = docs.find(
    (h) => h.kind === "HorizontalPodAutoscaler" && h.spec?.scaleTargetRef?.kind === "LeaderWorkerSet" &&
      h.spec.scaleTargetRef.name === name,
  );
  const groups = Math.max(spec.replicas ?? 1, hpa?.spec?.maxReplicas ?? 0);
  const longest = `${name}-${Math.max(groups - 1, 0)}`;
  if (longest.length > 52) {
    err(`${where}: its worker StatefulSet ${longest} is longer than 52 characters (controller-revision-hash label)`);
  }
  const [leader, worker] = podsOf(d);
  const policy = spec.networkConfig?.subdomainPolicy ?? "Shared";
  // The rendezvous Service: the controller creates it unless the release has it.
  const ns = d.metadata?.namespace ?? "";
  const svc = services.find((s) => s.metadata?.name === name && (s.metadata.namespace ?? "") === ns);
  if (policy === "Shared" && svc) {
    if (!isHeadless(svc)) err(`${where}: Service ${name} (its pods' subdomain) is not headless`);
    for (const p of [leader, worker]) {
      if (p && !selects(svc.spec?.selector, p.labels)) {
        err(`${where}: Service ${name} does not select the pods of ${p.where}`);
      }
    }
  }

  const leaderC = leader && kvserveContainer(leader, "worker");
  const stageC = worker && kvserveContainer(worker, "worker");
  const pp = (c) => (c ? flagValue(c, "--pp") : undefined);
  if (pp(leaderC) === undefined && pp(stageC) === undefined) return; // not a kvserve pipeline
  const lw = `${where} leaderTemplate`;
  const ww = `${where} workerTemplate`;
  if (!leaderC) return err(`${lw}: no kvserve worker container, but the workers run --pp`);
  if (Number(pp(leaderC)) !== size) err(`${lw}: runs --pp=${pp(leaderC)} in groups of size ${size}`);
  if (!lwt.leaderTemplate) err(`${where}: no leaderTemplate: the leaders would run the stage command`);
  if (flagValue(leaderC, "--pp-leader") !== undefined) err(`${lw}: the leader must not have --pp-leader`);
  if (![undefined, "0"].includes(flagValue(leaderC, "--pp-rank"))) err(`${lw}: the leader's --pp-rank must be 0`);
  if (spec.startupPolicy === "LeaderReady") {
    err(`${where}: startupPolicy LeaderReady: the leader turns ready only once its stages joined, ` +
      "and they would be created only after that");
  }
  const layers = flagValue(leaderC, "--pp-layers");
  if (layers !== undefined && layers.split(",").length !== Number(pp(leaderC))) {
    err(`${lw}: --pp-layers=${layers} does not list ${pp(leaderC)} stages`);
  }
  if (size < 2) return;
  if (!stageC) return err(`${ww}: no kvserve worker container for stages 1..${size - 1}`);
  if (Number(pp(stageC)) !== size) err(`${ww}: runs --pp=${pp(stageC)} in groups of size ${size}`);
  if (flagValue(stageC, "--pp-rank") !== "$(LWS_WORKER_INDEX)") {
    err(`${ww}: --pp-rank must be $(LWS_WORKER_INDEX), each stage's index in its group`);
  }
  const listen = /:(\d+)$/.exec(flagValue(leaderC, "--listen") ?? "");
  const dial = /^\$\(LWS_LEADER_ADDRESS\):(\d+)$/.exec(flagValue(stageC, "--pp-leader") ?? "");
  if (!dial) err(`${ww}: --pp-leader must be $(LWS_LEADER_ADDRESS):PORT, the group's leader`);
  else if (!listen || listen[1] !== dial[1]) {
    err(`${ww}: --pp-leader port ${dial[1]} is not the leader's --listen port ${listen?.[1]}`);
  }
  if (policy === "Shared" && svc && svc.spec?.publishNotReadyAddresses !== true) {
    err(`${where}: Service ${name} must set publishNotReadyAddresses: the stages dial their leader before it is ready`);
  }
  // What a stage must agree with its leader on (the KV layout and batch shape come from the leader).
  for (const flag of ["--model", "--tp", "--device"]) {
    const a = flagValue(leaderC, flag);
    const b = flagValue(stageC, flag);
    if (a !== b) err(`${where}: leader and stages differ in ${flag} (${a ?? "unset"} vs ${b ?? "unset"})`);
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
      if (!has) err(`${where}: port ${e.port} is no container port of ${p.pod.where}`);
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
