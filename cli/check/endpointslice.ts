/**
 * `check --serve --endpointslice <namespace>/<name>`: keeps the ready
 * conditions of the pool's published EndpointSlice as current as the
 * exporter's last check, between the `pulumi up`s that publish it. Pulumi
 * writes the slice (its members, and the readiness its own checks found);
 * this only flips `conditions.ready` of members the check knows, and only
 * when the check disagrees, so an unchanged pool sees no writes at all.
 *
 * Runs inside the cluster as the exporter's pod, with a service account that
 * may get and patch that one slice (components/kubernetes-exporter.ts). The
 * patch is a JSON Patch that first tests the slice's resourceVersion: if
 * Pulumi rewrote the slice meanwhile the patch is refused and the next round
 * starts from the new slice.
 */
import { readFileSync } from "node:fs";
import { request } from "node:https";
import { isIP } from "node:net";
import { join } from "node:path";
import type { CheckReport } from "./report";

/** Where Kubernetes mounts a pod's service-account token and the cluster's CA. */
export const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";
/** Each API call's deadline: a slow API server must not hold the check loop. */
const CALL_MS = 5_000;
const DNS_LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/;

export interface SliceRef {
  namespace: string;
  name: string;
}

export class SliceRefError extends Error {}

export function parseSliceRef(text: string): SliceRef {
  const [namespace, name, ...rest] = text.split("/");
  if (
    rest.length > 0 ||
    namespace === undefined ||
    name === undefined ||
    !DNS_LABEL.test(namespace) ||
    !DNS_SUBDOMAIN.test(name)
  )
    throw new SliceRefError(
      `--endpointslice must be <namespace>/<name> of the pool's EndpointSlice (e.g. crawlers/egress-vms), not ${JSON.stringify(text)}`,
    );
  return { namespace, name };
}

interface SliceEndpoint {
  addresses?: string[];
  conditions?: { ready?: boolean };
}

/** The part of an EndpointSlice read here. */
export interface EndpointSliceDocument {
  metadata?: { resourceVersion?: string };
  endpoints?: SliceEndpoint[] | null;
}

export type JsonPatchOperation =
  { op: "test"; path: string; value: unknown } | { op: "add"; path: string; value: unknown };

/** The proxy's address from a result's `host:port` (an IPv6 literal in brackets). */
function addressOf(endpoint: string): string {
  const host = endpoint.replace(/:\d+$/, "");
  return host.replace(/^\[(.*)\]$/, "$1");
}

/**
 * The JSON Patch that makes the slice's ready conditions say what the report
 * found, or [] when they already do. Members the report does not name are
 * left as they are (the exporter's list may lag the slice's by one `up`).
 */
export function readinessPatch(
  slice: EndpointSliceDocument,
  report: CheckReport,
): JsonPatchOperation[] {
  const upByAddress = new Map(
    report.results.map((result) => [addressOf(result.endpoint), result.up]),
  );
  const operations: JsonPatchOperation[] = [];
  (slice.endpoints ?? []).forEach((endpoint, index) => {
    const address = endpoint.addresses?.[0];
    const up = address === undefined ? undefined : upByAddress.get(address);
    if (up === undefined || endpoint.conditions?.ready === up) return;
    operations.push(
      endpoint.conditions === undefined
        ? { op: "add", path: `/endpoints/${index}/conditions`, value: { ready: up } }
        : { op: "add", path: `/endpoints/${index}/conditions/ready`, value: up },
    );
  });
  if (operations.length === 0) return [];
  const resourceVersion = slice.metadata?.resourceVersion;
  return resourceVersion === undefined
    ? operations
    : [{ op: "test", path: "/metadata/resourceVersion", value: resourceVersion }, ...operations];
}

/** How to reach the API server as the pod's service account. */
export interface KubernetesApi {
  /** `https://host:port`. */
  server: string;
  ca: string;
  /** Read at each call: projected tokens are rotated while the pod runs. */
  token(): string;
}

export class InClusterError extends Error {}

/**
 * The API server and credentials a pod gets: KUBERNETES_SERVICE_HOST/PORT
 * and the mounted service-account files (elsewhere when
 * EGRESS_KUBE_SERVICEACCOUNT_DIR names another directory, e.g. a projected
 * token outside a pod).
 */
export function inClusterApi(env: Record<string, string | undefined>): KubernetesApi {
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT ?? "443";
  if (host === undefined || host === "")
    throw new InClusterError(
      "--endpointslice runs inside the cluster (KUBERNETES_SERVICE_HOST is not set): run the exporter as the pool's kubernetes.exporter, or leave --endpointslice out",
    );
  const dir = env.EGRESS_KUBE_SERVICEACCOUNT_DIR ?? SERVICE_ACCOUNT_DIR;
  const read = (file: string): string => {
    try {
      return readFileSync(join(dir, file), "utf8").trim();
    } catch (error) {
      throw new InClusterError(
        `--endpointslice needs the pod's service account: ${join(dir, file)} cannot be read (${(error as NodeJS.ErrnoException).code ?? "error"}); is automountServiceAccountToken off?`,
      );
    }
  };
  const ca = read("ca.crt");
  read("token");
  return {
    server: `https://${isIP(host) === 6 ? `[${host}]` : host}:${port}`,
    ca,
    token: () => read("token"),
  };
}

interface ApiAnswer {
  status: number;
  body: string;
}

function call(
  api: KubernetesApi,
  method: "GET" | "PATCH",
  path: string,
  body?: { contentType: string; text: string },
): Promise<ApiAnswer> {
  return new Promise<ApiAnswer>((resolve, reject) => {
    const url = new URL(path, api.server);
    const req = request(
      url,
      {
        method,
        ca: api.ca,
        timeout: CALL_MS,
        headers: {
          authorization: `Bearer ${api.token()}`,
          accept: "application/json",
          ...(body === undefined
            ? {}
            : { "content-type": body.contentType, "content-length": Buffer.byteLength(body.text) }),
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString("utf8") }),
        );
        res.on("error", reject);
      },
    );
    // A deadline for the whole call, not only between packets.
    const deadline = setTimeout(
      () => req.destroy(new Error(`${method} ${url.pathname} took longer than ${CALL_MS} ms`)),
      CALL_MS,
    );
    req.on("close", () => clearTimeout(deadline));
    req.on("timeout", () =>
      req.destroy(new Error(`${method} ${url.pathname}: no answer in ${CALL_MS} ms`)),
    );
    req.on("error", reject);
    req.end(body?.text);
  });
}

/** The API server's reason, short: its Status message when it sent one. */
function reasonOf(answer: ApiAnswer): string {
  try {
    const status = JSON.parse(answer.body) as { message?: string };
    if (typeof status.message === "string") return `${answer.status} ${status.message}`;
  } catch {
    // not JSON
  }
  return `${answer.status}`;
}

/** What one round did, for the exporter's log and tests. */
export type SliceUpdate =
  | { kind: "unchanged" }
  | { kind: "patched"; changed: number }
  | { kind: "conflict" }
  | { kind: "failed"; reason: string };

/** One round: read the slice, patch the ready conditions that disagree with the report. */
export async function updateSliceReadiness(
  api: KubernetesApi,
  ref: SliceRef,
  report: CheckReport,
): Promise<SliceUpdate> {
  const path = `/apis/discovery.k8s.io/v1/namespaces/${ref.namespace}/endpointslices/${ref.name}`;
  const where = `EndpointSlice ${ref.namespace}/${ref.name}`;
  const got = await call(api, "GET", path);
  if (got.status !== 200) return { kind: "failed", reason: `reading ${where}: ${reasonOf(got)}` };
  const operations = readinessPatch(JSON.parse(got.body) as EndpointSliceDocument, report);
  if (operations.length === 0) return { kind: "unchanged" };
  const patched = await call(api, "PATCH", path, {
    contentType: "application/json-patch+json",
    text: JSON.stringify(operations),
  });
  // 422 from a failed "test": Pulumi (or someone) wrote the slice since it was read.
  if (patched.status === 409 || patched.status === 422) return { kind: "conflict" };
  if (patched.status !== 200)
    return { kind: "failed", reason: `patching ${where}: ${reasonOf(patched)}` };
  return {
    kind: "patched",
    changed: operations.filter((operation) => operation.op === "add").length,
  };
}

/** The log line of a round; nothing for a round that changed nothing. */
export function describeSliceUpdate(ref: SliceRef, update: SliceUpdate): string | undefined {
  const where = `EndpointSlice ${ref.namespace}/${ref.name}`;
  switch (update.kind) {
    case "unchanged":
      return undefined;
    case "patched":
      return `${where}: ${update.changed} ready condition(s) set from this check`;
    case "conflict":
      return `${where} changed while it was being patched (pulumi up?); the next check starts from the new one`;
    case "failed":
      return update.reason;
  }
}
