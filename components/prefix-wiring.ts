/**
 * The pool's `ipv6Prefix` (docs/many-exit-addresses.md): which member spreads
 * which routed IPv6 prefix, what the arguments must say for it, and the host
 * routes the user adds. Pure and kept apart from pool.ts, which only asks.
 *
 * A prefix is set on the pool or on a VM backend (a backend's own wins). A
 * /64 or longer serves one proxy; a shorter one (a /56, a /48) is split into
 * /64s and the member `<backend>-<i>` takes the i-th: deterministic by member
 * index, so growing or shrinking the backend never moves another member's /64
 * (and so never changes another member's cloud-init, which would replace it).
 */
import { z } from "zod";
import {
  memberPrefix,
  prefixEgressProblems,
  prefixMemberCapacity,
  PREFIX_MODES,
  type PrefixEgressSettings,
  type PrefixMode,
} from "../workloads/prefix-egress";

/** `ipv6Prefix` as the pool and its backends take it. */
export interface Ipv6PrefixArgs {
  /** A routed IPv6 prefix: a /64 for one proxy, or a /56 … /48 split into one /64 per proxy. */
  prefix: string;
  /** random: a new address per connection; sticky: one per proxy user; pool: `count` fixed ones. */
  mode: PrefixMode;
  /** pool mode only: how many fixed addresses each proxy uses. */
  count?: number;
}

/** The stack config's shape; the values' own rules (prefixEgressProblems) run in the pool. */
export const ipv6PrefixConfigSchema = z
  .strictObject(
    {
      prefix: z.string({ error: 'ipv6Prefix.prefix must be a prefix, e.g. "2001:db8:1::/56"' }),
      mode: z.enum(PREFIX_MODES as [PrefixMode, ...PrefixMode[]], {
        error: 'ipv6Prefix.mode must be "random", "sticky" or "pool"',
      }),
      count: z.int({ error: "ipv6Prefix.count must be a whole number" }).optional(),
    },
    { error: 'ipv6Prefix must be { prefix: "2001:db8:1::/56", mode: "random" }' },
  )
  .optional();

/** What the wiring needs of a backend (a pool backend, read loosely: it may be unvalidated). */
interface BackendView {
  name?: unknown;
  ipv6Prefix?: Ipv6PrefixArgs;
  count?: unknown;
  [kind: string]: unknown;
}

const VM_KINDS = ["kvm", "proxmox"] as const;

/** The VM settings of a backend (kvm or proxmox), undefined for another kind. */
function vmSettingsOf(backend: BackendView): Record<string, unknown> | undefined {
  for (const kind of VM_KINDS) {
    const settings = backend[kind];
    if (settings !== null && typeof settings === "object")
      return settings as Record<string, unknown>;
  }
  return undefined;
}

/** The prefix a backend's members spread: its own, else the pool's (VM backends only). */
export function backendPrefix(
  backend: object,
  pool: Ipv6PrefixArgs | undefined,
): Ipv6PrefixArgs | undefined {
  const view = backend as BackendView;
  if (vmSettingsOf(view) === undefined) return undefined;
  return view.ipv6Prefix ?? pool;
}

/** The squid settings' prefixEgress for member `index` of a backend that spreads `prefix`. */
export function memberPrefixEgress(prefix: Ipv6PrefixArgs, index: number): PrefixEgressSettings {
  return {
    prefix: memberPrefix(prefix.prefix, index),
    mode: prefix.mode,
    ...(prefix.count === undefined ? {} : { count: prefix.count }),
  };
}

/** The prefixEgress of member `index` of a backend, undefined without a prefix, or why it gets none. */
export function memberPrefixOf(
  backend: object,
  pool: Ipv6PrefixArgs | undefined,
  index: number,
): PrefixEgressSettings | string | undefined {
  const prefix = backendPrefix(backend, pool);
  if (prefix === undefined) return undefined;
  try {
    return memberPrefixEgress(prefix, index);
  } catch (error) {
    return (error as Error).message;
  }
}

/** Every problem with `ipv6Prefix` on the pool and its backends, each naming the field and the fix. */
export function ipv6PrefixProblems(args: {
  ipv6Prefix?: Ipv6PrefixArgs;
  ipFamilies?: unknown;
  backends?: readonly unknown[];
}): string[] {
  const backends = (Array.isArray(args.backends) ? args.backends : []) as BackendView[];
  const problems: string[] = [];
  // A value of the wrong shape is the schema's to report (stack config); its rules need the shape.
  if (args.ipv6Prefix !== undefined && !wellShaped(args.ipv6Prefix)) return problems;
  if (args.ipv6Prefix !== undefined) problems.push(...prefixEgressProblems(args.ipv6Prefix));
  const takers = backends.filter(
    (backend) => backend.ipv6Prefix === undefined && vmSettingsOf(backend) !== undefined,
  );
  if (args.ipv6Prefix !== undefined && takers.length > 1)
    problems.push(
      `ipv6Prefix on the pool would be shared by the VM backends ${takers.map((b) => String(b.name)).join(", ")}, but a prefix is routed to one host: set ipv6Prefix on each backend instead`,
    );
  backends.forEach((backend, index) => {
    const field = `backends[${index}].ipv6Prefix`;
    if (backend.ipv6Prefix !== undefined && !wellShaped(backend.ipv6Prefix)) return;
    if (backend.ipv6Prefix !== undefined) {
      if (vmSettingsOf(backend) === undefined)
        problems.push(
          `${field}: only a VM backend (kvm or proxmox) can spread a prefix; remove it here`,
        );
      else problems.push(...prefixEgressProblems(backend.ipv6Prefix, field));
    }
    const prefix = backendPrefix(backend, args.ipv6Prefix);
    if (prefix === undefined) return;
    const where = backend.ipv6Prefix === undefined ? "ipv6Prefix" : field;
    const families = vmSettingsOf(backend)?.ipFamilies ?? args.ipFamilies;
    // An Output (known at apply) is the resource's to check; a plain list or none is checked here.
    const plainList = families === undefined || Array.isArray(families);
    if (plainList && !(Array.isArray(families) && families.includes("ipv6")))
      problems.push(
        `${where} needs IPv6 on the backend ${String(backend.name)}'s proxies (the prefix is routed to the VM's IPv6 address): set ipFamilies: ["ipv4", "ipv6"] on the pool or the backend`,
      );
    const capacity = prefixMemberCapacity(prefix.prefix);
    if (capacity !== undefined && typeof backend.count === "number" && backend.count > capacity)
      problems.push(
        `${where}.prefix ${prefix.prefix} serves ${capacity} ${capacity === 1 ? "proxy" : "proxies"} (one /64 each) but the backend ${String(backend.name)} has count ${backend.count}: give a /56 or shorter prefix, or fewer proxies`,
      );
  });
  return problems;
}

const wellShaped = (value: unknown): value is Ipv6PrefixArgs =>
  value !== null &&
  typeof value === "object" &&
  typeof (value as { prefix?: unknown }).prefix === "string";

/** The backend's bridge, for the route line: a KVM `network.bridge`, a Proxmox `bridge`, else a placeholder. */
export function bridgeOf(backend: object): string {
  const settings = vmSettingsOf(backend as BackendView) ?? {};
  const network = settings.network as { bridge?: unknown } | undefined;
  if (typeof network?.bridge === "string") return network.bridge;
  if (typeof settings.bridge === "string") return settings.bridge;
  return "<bridge>";
}

/** The host route that sends a member's prefix to its VM: what the user adds on the VM's host. */
export function ipv6RouteLine(prefix: string, via: string, bridge: string): string {
  return `ip -6 route add ${prefix} via ${via} dev ${bridge}`;
}
