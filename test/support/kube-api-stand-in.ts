/**
 * A stand-in for the Kubernetes API server, for the exporter's slice writing:
 * HTTPS with a private CA and a bearer token, GET of a Secret, a Service and
 * EndpointSlices, and server-side apply as Kubernetes does it for an
 * EndpointSlice: `fieldManager` required, ownership per field (labels per
 * key; `ports`, `endpoints` and `ownerReferences` as atomic lists, as the
 * EndpointSlice schema declares them), a conflict (409) when a manager
 * applies a value to a field another manager owns unless `force=true`, a
 * no-op apply written nowhere (resourceVersion kept), and an apply that
 * creates authorized as `create`. RBAC as the pool's Role grants it.
 */
import { isDeepStrictEqual } from "node:util";
import { createServer, type Server } from "node:https";
import type { AddressInfo } from "node:net";
import { simulatorTls } from "../pve-sim/ca";

export interface StoredSlice {
  metadata: {
    name: string;
    namespace: string;
    uid: string;
    resourceVersion: string;
    labels?: Record<string, string>;
    ownerReferences?: unknown[];
    managedFields?: { manager: string; operation: string; fieldsV1: Record<string, unknown> }[];
  };
  addressType?: string;
  ports?: unknown[];
  endpoints?: { addresses: string[]; conditions?: { ready?: boolean } }[];
}

type Grant = { verb: string; resource: string; name?: string };

export interface ApiStandIn {
  server: Server;
  port: number;
  requests: { method: string; path: string; contentType?: string; body: string; status: number }[];
  slices: Map<string, StoredSlice>;
  /** Who owns which field of a slice, as `managedFields` would say. */
  owners(slice: string): Record<string, string[]>;
  setMembers(document: unknown): void;
  /** A write by another client (kubectl edit, an older exporter's JSON patch): an Update that takes the fields. */
  strayUpdate(
    slice: string,
    manager: string,
    fields: Partial<Pick<StoredSlice, "endpoints">>,
  ): void;
  close(): Promise<void>;
}

const SLICES = "/apis/discovery.k8s.io/v1/namespaces/crawlers/endpointslices/";

/** The fields one apply configuration sets, as field paths with their values. */
function fieldsOf(config: Record<string, unknown>): Map<string, unknown> {
  const fields = new Map<string, unknown>();
  const metadata = (config.metadata ?? {}) as Record<string, unknown>;
  for (const [key, value] of Object.entries((metadata.labels ?? {}) as Record<string, unknown>))
    fields.set(`metadata.labels.${key}`, value);
  if (metadata.ownerReferences !== undefined)
    fields.set("metadata.ownerReferences", metadata.ownerReferences);
  for (const key of ["addressType", "ports", "endpoints"])
    if (config[key] !== undefined) fields.set(key, config[key]);
  return fields;
}

function valueAt(slice: StoredSlice, field: string): unknown {
  if (field.startsWith("metadata.labels.")) return slice.metadata.labels?.[field.slice(16)];
  if (field === "metadata.ownerReferences") return slice.metadata.ownerReferences;
  return (slice as unknown as Record<string, unknown>)[field];
}

function setAt(slice: StoredSlice, field: string, value: unknown): void {
  if (field.startsWith("metadata.labels.")) {
    const labels = { ...slice.metadata.labels };
    if (value === undefined) delete labels[field.slice(16)];
    else labels[field.slice(16)] = value as string;
    slice.metadata.labels = labels;
  } else if (field === "metadata.ownerReferences")
    slice.metadata.ownerReferences = value as unknown[] | undefined;
  else (slice as unknown as Record<string, unknown>)[field] = value;
}

export function startApiStandIn(options: {
  token: string;
  service: { name: string; uid: string; labels: Record<string, string> };
  members: unknown;
  grants: Grant[];
}): Promise<ApiStandIn> {
  const tls = simulatorTls();
  let members = options.members;
  const slices = new Map<string, StoredSlice>();
  // slice -> field -> managers (operation per manager)
  const ownership = new Map<string, Map<string, Map<string, string>>>();
  let version = 100;
  const requests: ApiStandIn["requests"] = [];
  const allowed = (verb: string, resource: string, name: string) =>
    options.grants.some(
      (grant) =>
        grant.verb === verb &&
        grant.resource === resource &&
        (grant.name === undefined || grant.name === name),
    );
  const renderManaged = (name: string): StoredSlice["metadata"]["managedFields"] => {
    const byManager = new Map<string, { operation: string; fields: Record<string, unknown> }>();
    for (const [field, managers] of ownership.get(name) ?? new Map<string, Map<string, string>>())
      for (const [manager, operation] of managers) {
        const entry = byManager.get(manager) ?? { operation, fields: {} };
        entry.fields[`f:${field}`] = {};
        byManager.set(manager, entry);
      }
    return [...byManager].map(([manager, { operation, fields }]) => ({
      manager,
      operation,
      fieldsV1: fields,
    }));
  };

  const server = createServer({ key: tls.serverKeyPem, cert: tls.serverCertPem }, (req, res) => {
    let body = "";
    req.on("data", (chunk: Buffer) => (body += chunk.toString()));
    req.on("end", () => {
      const url = new URL(req.url ?? "/", "https://stand-in");
      const reply = (status: number, document: unknown) => {
        requests.push({
          method: req.method ?? "",
          path: url.pathname,
          contentType: req.headers["content-type"],
          body,
          status,
        });
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify(document));
      };
      const status = (code: number, reason: string, message: string) =>
        reply(code, { kind: "Status", apiVersion: "v1", status: "Failure", reason, message, code });
      if (req.headers.authorization !== `Bearer ${options.token}`)
        return status(401, "Unauthorized", "Unauthorized");
      const verb = req.method === "GET" ? "get" : req.method === "PATCH" ? "patch" : "other";
      const forbidden = (resource: string, name: string, as = verb) =>
        status(
          403,
          "Forbidden",
          `${resource} "${name}" is forbidden: cannot ${as} resource "${resource}"`,
        );

      if (url.pathname === `/api/v1/namespaces/crawlers/secrets/${options.service.name}`) {
        if (!allowed(verb, "secrets", options.service.name) || verb !== "get")
          return forbidden("secrets", options.service.name);
        const data =
          members === undefined
            ? {}
            : { "endpoints.json": Buffer.from(JSON.stringify(members)).toString("base64") };
        return reply(200, { metadata: { name: options.service.name }, data });
      }
      if (url.pathname === `/api/v1/namespaces/crawlers/services/${options.service.name}`) {
        if (!allowed(verb, "services", options.service.name) || verb !== "get")
          return forbidden("services", options.service.name);
        return reply(200, {
          metadata: {
            name: options.service.name,
            uid: options.service.uid,
            labels: options.service.labels,
          },
        });
      }
      if (!url.pathname.startsWith(SLICES)) return status(404, "NotFound", "not found");
      const name = url.pathname.slice(SLICES.length);
      const existing = slices.get(name);
      if (verb === "get") {
        if (!allowed("get", "endpointslices", name)) return forbidden("endpointslices", name);
        if (existing === undefined)
          return status(404, "NotFound", `endpointslices.discovery.k8s.io "${name}" not found`);
        return reply(200, {
          ...existing,
          metadata: { ...existing.metadata, managedFields: renderManaged(name) },
        });
      }
      if (verb !== "patch") return status(405, "MethodNotAllowed", "not here");
      if (req.headers["content-type"] !== "application/apply-patch+yaml")
        return status(
          415,
          "UnsupportedMediaType",
          `only apply patches here, not ${req.headers["content-type"]}`,
        );
      const manager = url.searchParams.get("fieldManager");
      if (manager === null || manager === "")
        return status(400, "BadRequest", "fieldManager is required for apply requests");
      const force = url.searchParams.get("force") === "true";
      // An apply that creates is authorized as create, as the API server does.
      if (
        existing === undefined
          ? !allowed("create", "endpointslices", name)
          : !allowed("patch", "endpointslices", name)
      )
        return forbidden("endpointslices", name, existing === undefined ? "create" : "patch");
      const config = JSON.parse(body) as Record<string, unknown>;
      const fields = fieldsOf(config);
      const owners = ownership.get(name) ?? new Map<string, Map<string, string>>();
      const slice: StoredSlice = existing ?? {
        metadata: {
          name,
          namespace: "crawlers",
          uid: `slice-${name}`,
          resourceVersion: String(version),
        },
      };
      const before = JSON.stringify(slice);
      const conflicts = [...fields].filter(([field, value]) => {
        const others = [...(owners.get(field)?.keys() ?? [])].filter((each) => each !== manager);
        return others.length > 0 && !isDeepStrictEqual(valueAt(slice, field), value);
      });
      if (conflicts.length > 0 && !force)
        return status(
          409,
          "Conflict",
          `Apply failed with ${conflicts.length} conflict(s): ${conflicts
            .map(
              ([field]) => `conflict with "${[...owners.get(field)!.keys()].join(",")}": .${field}`,
            )
            .join("; ")}`,
        );
      for (const [field, value] of fields) {
        const changed = !isDeepStrictEqual(valueAt(slice, field), value);
        setAt(slice, field, value);
        const managers = changed
          ? new Map<string, string>()
          : (owners.get(field) ?? new Map<string, string>());
        managers.set(manager, "Apply");
        owners.set(field, managers);
      }
      // What this manager applied before and no longer does, and nobody else owns, goes.
      for (const [field, managers] of [...owners]) {
        if (fields.has(field) || !managers.has(manager)) continue;
        managers.delete(manager);
        if (managers.size === 0) {
          owners.delete(field);
          setAt(slice, field, undefined);
        }
      }
      ownership.set(name, owners);
      if (JSON.stringify(slice) !== before) slice.metadata.resourceVersion = String(++version);
      slices.set(name, slice);
      return reply(existing === undefined ? 201 : 200, slice);
    });
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        server,
        port: (server.address() as AddressInfo).port,
        requests,
        slices,
        owners: (name) =>
          Object.fromEntries(
            [...(ownership.get(name) ?? new Map<string, Map<string, string>>())].map(
              ([field, managers]) => [field, [...managers.keys()]],
            ),
          ),
        setMembers: (document) => (members = document),
        strayUpdate: (name, manager, fields) => {
          const slice = slices.get(name)!;
          const owners = ownership.get(name)!;
          for (const [field, value] of Object.entries(fields)) {
            setAt(slice, field, value);
            owners.set(field, new Map([[manager, "Update"]]));
          }
          slice.metadata.resourceVersion = String(++version);
        },
        close: () => new Promise<void>((done) => server.close(() => done())),
      }),
    ),
  );
}
