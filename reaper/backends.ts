/**
 * The reaper's backend registry: for each kind of backend, its config schema
 * (the list under its key in the reaper config) and how to open, list and
 * delete on one configured backend. config.ts and sweep.ts loop over
 * `REAPER_BACKENDS` and name no backend; adding a backend is an entry here
 * (and one in components/backends.ts). Deletes go through each resource's own
 * delete, so the reaper removes exactly what `pulumi destroy` would.
 */
import { z } from "zod";
import { safeErrorMessage } from "../provider/common/redact";
import type { DeleteOutcome } from "../provider/common/lifecycle";
import {
  closeKvmLinks,
  deleteKvmEntry,
  kvmBackendSchema,
  listKvmBackend,
  type KvmBackendConfig,
  type KvmListOptions,
  type KvmSession,
} from "./kvm";
import { NAME_PATTERN } from "./names";
import type { BackendListing, PlanEntry } from "./plan";
import {
  closeProxmoxLinks,
  connectionInputsOf,
  deleteProxmoxEntry,
  listProxmoxBackend,
  proxmoxBackendSchema,
  proxmoxClient,
  type ProxmoxBackendConfig,
  type ProxmoxListOptions,
} from "./proxmox";

export type { DeleteOutcome, KvmBackendConfig, ProxmoxBackendConfig };

/** How backends are reached; tests replace the KVM dialer to hold the link's server side. */
export interface SweepDeps {
  openKvm(config: KvmBackendConfig): Promise<KvmSession>;
  onKvmDomainRead?: KvmListOptions["onDomainRead"];
  onProxmoxVmRead?: ProxmoxListOptions["onVmRead"];
}

export interface ListOptions {
  pruneImages: boolean;
}

/** One configured backend, listed: what it holds, and how to delete a planned entry there. */
export interface OpenBackend {
  listing: BackendListing;
  delete?: (entry: PlanEntry) => Promise<DeleteOutcome>;
  close(): Promise<void>;
}

export interface ReaperBackendKind<Config extends { name: string }> {
  /** One backend of this kind in the reaper config, under the kind's key. */
  configSchema: z.ZodType<Config>;
  /** Opens and lists one backend; never throws (an unreachable one is an incomplete listing). */
  open(config: Config, options: ListOptions, deps: SweepDeps): Promise<OpenBackend>;
  /** Closes what the kind's deletes opened (the resources' own connection pools), after the run. */
  closeAll?(): Promise<void>;
}

const kvm: ReaperBackendKind<KvmBackendConfig> = {
  configSchema: kvmBackendSchema,
  async open(config, options, deps) {
    let session: KvmSession;
    try {
      session = await deps.openKvm(config);
    } catch (error) {
      return unreachable(config.name, error);
    }
    const listing = await listKvmBackend(session, config, {
      pruneImages: options.pruneImages,
      ...(deps.onKvmDomainRead === undefined ? {} : { onDomainRead: deps.onKvmDomainRead }),
    });
    return {
      listing,
      delete: (entry) => deleteKvmEntry(session, config, entry),
      close: () => session.close(),
    };
  },
  closeAll: closeKvmLinks,
};

const proxmox: ReaperBackendKind<ProxmoxBackendConfig> = {
  configSchema: proxmoxBackendSchema,
  async open(config, _options, deps) {
    let inputs;
    let client;
    try {
      inputs = connectionInputsOf(config);
      client = proxmoxClient(inputs);
    } catch (error) {
      return unreachable(config.name, error);
    }
    const listing = await listProxmoxBackend(
      client,
      config,
      deps.onProxmoxVmRead === undefined ? {} : { onVmRead: deps.onProxmoxVmRead },
    );
    const connection = inputs;
    return {
      listing,
      delete: (entry) => deleteProxmoxEntry(connection, config, entry),
      close: async () => undefined,
    };
  },
  closeAll: closeProxmoxLinks,
};

/** Static proxies exist without us: there is nothing of ours to reap, and the report says so. */
const staticProxies: ReaperBackendKind<{ name: string }> = {
  configSchema: z.strictObject({
    name: z
      .string()
      .regex(NAME_PATTERN, { error: "name must be letters, digits, _ . - (e.g. shop)" }),
  }),
  open: async (config) => ({
    listing: {
      backend: config.name,
      complete: true,
      note: "static proxies are not made by egress-proxies: nothing to reap",
      items: [],
    },
    close: async () => undefined,
  }),
};

/** Every kind of backend the reaper sweeps, by its key in the reaper config. */
export const REAPER_BACKENDS = {
  kvm,
  proxmox,
  static: staticProxies,
} as const;

/** One configured backend's type per key. */
export type ReaperBackendConfigs = {
  [K in keyof typeof REAPER_BACKENDS]: (typeof REAPER_BACKENDS)[K] extends ReaperBackendKind<
    infer C
  >
    ? C
    : never;
};

export function unreachable(backend: string, error: unknown): OpenBackend {
  return {
    listing: { backend, complete: false, problem: safeErrorMessage(error), items: [] },
    close: async () => undefined,
  };
}
