/**
 * The Kubernetes API as the exporter's pod reaches it: its service account's
 * token and the cluster's CA, one HTTPS call at a time, each with a deadline.
 * Only what `check --serve` needs; no client library.
 */
import { readFileSync } from "node:fs";
import { request } from "node:https";
import { isIP } from "node:net";
import { join } from "node:path";

/** Where Kubernetes mounts a pod's service-account token and the cluster's CA. */
export const SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount";
/** Each API call's deadline: a slow API server must not hold the check loop. */
const CALL_MS = 5_000;

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
      "--endpointslices runs inside the cluster (KUBERNETES_SERVICE_HOST is not set): run the exporter as the pool's kubernetes.exporter, or leave --endpointslices out",
    );
  const dir = env.EGRESS_KUBE_SERVICEACCOUNT_DIR ?? SERVICE_ACCOUNT_DIR;
  const read = (file: string): string => {
    try {
      return readFileSync(join(dir, file), "utf8").trim();
    } catch (error) {
      throw new InClusterError(
        `--endpointslices needs the pod's service account: ${join(dir, file)} cannot be read (${(error as NodeJS.ErrnoException).code ?? "error"}); is automountServiceAccountToken off?`,
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

export interface ApiAnswer {
  status: number;
  body: string;
}

export function callApi(
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
export function reasonOf(answer: ApiAnswer): string {
  try {
    const status = JSON.parse(answer.body) as { message?: string };
    if (typeof status.message === "string") return `${answer.status} ${status.message}`;
  } catch {
    // not JSON
  }
  return `${answer.status}`;
}
