/**
 * `check --serve --endpointslices <namespace>/<service>`: the exporter is the
 * only writer of the pool's EndpointSlices, `<service>-checked` (IPv4) and
 * `<service>-checked-ipv6`. An EndpointSlice's `endpoints` is an atomic list
 * under server-side apply: whoever writes a ready condition owns the whole
 * list, so Pulumi listing the members while the exporter set readiness meant
 * two writers of one field (a conflict, or one undoing the other at every
 * round). Pulumi writes the member list into the Secret instead
 * (components/slice-members.ts) and declares no slice.
 *
 * Pure: what the slices should say, and whether the live ones already do.
 * The calls are in slice-owner.ts.
 */
import type { SliceMembers } from "../../components/slice-members";
import type { CheckReport } from "./report";

const DNS_LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/** The exporter's field manager: the name `managedFields` shows for everything it writes. */
export const FIELD_MANAGER = "egress-proxies-exporter";
/** endpointslice.kubernetes.io/managed-by: no Kubernetes controller touches a slice with another value. */
export const MANAGED_BY = "check-exporter.egress-proxies.dev";

/** The pool's Service, which names the Secret too (the publishing gives both one name). */
export interface ServiceRef {
  namespace: string;
  name: string;
}

export class ServiceRefError extends Error {}

export function parseServiceRef(text: string): ServiceRef {
  const [namespace, name, ...rest] = text.split("/");
  if (
    rest.length > 0 ||
    namespace === undefined ||
    name === undefined ||
    !DNS_LABEL.test(namespace) ||
    !DNS_LABEL.test(name)
  )
    throw new ServiceRefError(
      `--endpointslices must be <namespace>/<service> of the pool's Service (e.g. crawlers/egress), not ${JSON.stringify(text)}`,
    );
  return { namespace, name };
}

export type AddressType = "IPv4" | "IPv6";

/** The slice of one family: `<service>-checked`, `<service>-checked-ipv6`. */
export function sliceNameOf(service: string, addressType: AddressType): string {
  return addressType === "IPv4" ? `${service}-checked` : `${service}-checked-ipv6`;
}

interface SliceEndpoint {
  addresses: string[];
  conditions: { ready?: boolean };
}

/** The apply configuration of one slice: every field the exporter owns, nothing else. */
export interface SliceApply {
  apiVersion: "discovery.k8s.io/v1";
  kind: "EndpointSlice";
  metadata: {
    name: string;
    namespace: string;
    labels: Record<string, string>;
    ownerReferences: { apiVersion: "v1"; kind: "Service"; name: string; uid: string }[];
  };
  addressType: AddressType;
  ports: { name: string; port: number; protocol: "TCP" }[];
  endpoints: SliceEndpoint[];
}

/** The part of a live EndpointSlice compared here. */
export interface LiveSlice {
  metadata?: {
    labels?: Record<string, string>;
    ownerReferences?: { uid?: string }[];
  };
  addressType?: string;
  ports?: { name?: string; port?: number; protocol?: string }[] | null;
  endpoints?: { addresses?: string[]; conditions?: { ready?: boolean } }[] | null;
}

/** The proxy's address from a result's `host:port` (an IPv6 literal in brackets). */
function addressOf(endpoint: string): string {
  const host = endpoint.replace(/:\d+$/, "");
  return host.replace(/^\[(.*)\]$/, "$1");
}

/**
 * What each slice should hold. A member's ready condition is what the last
 * check found for its address; a member no check has seen yet (the pool
 * added it since) has none, which Kubernetes reads as ready: the pool waited
 * for it to answer before listing it. A pool without IPv6 gets no IPv6 slice
 * (`ipv6` absent); one that had IPv6 keeps an empty one until the Service goes.
 */
export function desiredSlices(
  service: ServiceRef & { uid: string; labels: Record<string, string> },
  members: SliceMembers,
  report: CheckReport | undefined,
): { ipv4: SliceApply; ipv6?: SliceApply } {
  const upByAddress = new Map(
    (report?.results ?? []).map((result) => [addressOf(result.endpoint), result.up]),
  );
  const slice = (addressType: AddressType, addresses: readonly string[]): SliceApply => ({
    apiVersion: "discovery.k8s.io/v1",
    kind: "EndpointSlice",
    metadata: {
      name: sliceNameOf(service.name, addressType),
      namespace: service.namespace,
      labels: {
        ...service.labels,
        "kubernetes.io/service-name": service.name,
        "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
      },
      // Deleting the Service (pulumi destroy) deletes its slices: nothing else removes them.
      ownerReferences: [
        { apiVersion: "v1", kind: "Service", name: service.name, uid: service.uid },
      ],
    },
    addressType,
    ports: [{ name: "http-proxy", port: members.port, protocol: "TCP" }],
    endpoints: [...new Set(addresses)].map((address) => {
      const up = upByAddress.get(address);
      return { addresses: [address], conditions: up === undefined ? {} : { ready: up } };
    }),
  });
  return {
    ipv4: slice("IPv4", members.ipv4),
    ...(members.ipv6 === undefined ? {} : { ipv6: slice("IPv6", members.ipv6) }),
  };
}

/**
 * Whether the live slice differs from what the exporter would apply: a
 * healthy, unchanged pool sees reads and no writes. Fields others added
 * (labels, annotations) are theirs and not compared.
 */
export function sliceNeedsApply(live: LiveSlice | undefined, desired: SliceApply): boolean {
  if (live === undefined) return true;
  const labels = live.metadata?.labels ?? {};
  const sameLabels = Object.entries(desired.metadata.labels).every(
    ([key, value]) => labels[key] === value,
  );
  const owned = (live.metadata?.ownerReferences ?? []).some(
    (reference) => reference.uid === desired.metadata.ownerReferences[0]!.uid,
  );
  const ports = (live.ports ?? []).map(({ name, port, protocol }) => ({ name, port, protocol }));
  const endpoints = (live.endpoints ?? []).map((endpoint) => ({
    addresses: endpoint.addresses ?? [],
    conditions:
      endpoint.conditions?.ready === undefined ? {} : { ready: endpoint.conditions.ready },
  }));
  return (
    !sameLabels ||
    !owned ||
    live.addressType !== desired.addressType ||
    JSON.stringify(ports) !== JSON.stringify(desired.ports) ||
    JSON.stringify(endpoints) !== JSON.stringify(desired.endpoints)
  );
}
