/**
 * One reaper run as a story: read every state (any failure: stop, delete
 * nothing), list every backend (each one complete or not), plan (pure),
 * report, and with --apply delete the planned orphans through the resources'
 * own delete paths. Returns the exit status; main.ts only parses argv.
 */
import { closeAllProxmoxPools, type ProxmoxClient } from "../provider/proxmox/client";
import type { ConnectionInputs } from "../provider/proxmox/connection";
import { safeErrorMessage } from "../provider/common/redact";
import type { KvmBackendConfig, ProxmoxBackendConfig, ReaperConfig } from "./config";
import {
  deleteKvmEntry,
  listKvmBackend,
  openKvmSession,
  type DeleteOutcome,
  type KvmListOptions,
  type KvmSession,
} from "./kvm";
import { planReaping, type BackendListing, type PlanEntry } from "./plan";
import {
  connectionInputsOf,
  deleteProxmoxEntry,
  listProxmoxBackend,
  proxmoxClient,
  type ProxmoxListOptions,
} from "./proxmox";
import { renderJson, renderTable, type RemovalResult } from "./report";
import { readStates } from "./states";

export const EXIT = {
  ok: 0,
  /** A backend not listed completely, or a delete that failed. */
  incomplete: 1,
  usage: 2,
  /** A state that could not be read: nothing was deleted. */
  state: 3,
} as const;

export interface SweepOptions {
  apply: boolean;
  json: boolean;
  minAgeMs: number;
  pruneImages: boolean;
  project?: string;
  now?: Date;
}

export interface SweepIo {
  out(text: string): void;
  err(text: string): void;
}

/** How backends are reached; tests replace the KVM dialer to hold the link's server side. */
export interface SweepDeps {
  openKvm(config: KvmBackendConfig): Promise<KvmSession>;
  onKvmDomainRead?: KvmListOptions["onDomainRead"];
  onProxmoxVmRead?: ProxmoxListOptions["onVmRead"];
}

const defaultDeps: SweepDeps = { openKvm: openKvmSession };

type Deleter = (entry: PlanEntry) => Promise<DeleteOutcome>;

interface OpenBackend {
  listing: BackendListing;
  delete?: Deleter;
  close(): Promise<void>;
}

export async function runSweep(
  config: ReaperConfig,
  options: SweepOptions,
  io: SweepIo,
  deps: SweepDeps = defaultDeps,
): Promise<number> {
  let states;
  try {
    states = await readStates(config.states);
  } catch (error) {
    io.err(`egress-reaper: ${safeErrorMessage(error)}\nnothing was listed or deleted.`);
    return EXIT.state;
  }
  const backends = await Promise.all([
    ...config.kvm.map((backend) => openAndListKvm(backend, options, deps)),
    ...config.proxmox.map((backend) => openAndListProxmox(backend, deps)),
  ]);
  try {
    const listings = backends.map((backend) => backend.listing);
    const plan = planReaping(listings, states, {
      now: options.now ?? new Date(),
      minAgeMs: options.minAgeMs,
      pruneImages: options.pruneImages,
      ...(options.project === undefined ? {} : { project: options.project }),
    });
    const removals = options.apply ? await applyPlan(plan, backends) : [];
    io.out(
      options.json
        ? renderJson(plan, listings, removals, options.apply)
        : renderTable(plan, listings, removals, options.apply),
    );
    for (const listing of listings)
      if (!listing.complete)
        io.err(
          `egress-reaper: ${listing.backend} not listed completely: ${listing.problem}; nothing deleted there`,
        );
    const failed = removals.filter((removal) => removal.outcome === "failed");
    for (const removal of failed)
      io.err(
        `egress-reaper: could not remove ${removal.entry.item.kind} ${removal.entry.item.name}: ${removal.error}`,
      );
    return listings.every((listing) => listing.complete) && failed.length === 0
      ? EXIT.ok
      : EXIT.incomplete;
  } finally {
    await Promise.all(backends.map((backend) => backend.close().catch(() => undefined)));
    await closeAllProxmoxPools().catch(() => undefined);
  }
}

async function openAndListKvm(
  config: KvmBackendConfig,
  options: SweepOptions,
  deps: SweepDeps,
): Promise<OpenBackend> {
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
}

async function openAndListProxmox(
  config: ProxmoxBackendConfig,
  deps: SweepDeps,
): Promise<OpenBackend> {
  let inputs: ConnectionInputs;
  let client: ProxmoxClient;
  try {
    inputs = connectionInputsOf(config);
    client = proxmoxClient(inputs);
  } catch (error) {
    return unreachable(config.name, error);
  }
  return {
    listing: await listProxmoxBackend(
      client,
      config,
      deps.onProxmoxVmRead === undefined ? {} : { onVmRead: deps.onProxmoxVmRead },
    ),
    delete: (entry) => deleteProxmoxEntry(client, inputs, config, entry),
    close: async () => undefined,
  };
}

function unreachable(backend: string, error: unknown): OpenBackend {
  return {
    listing: { backend, complete: false, problem: safeErrorMessage(error), items: [] },
    close: async () => undefined,
  };
}

/** Only entries planned "reap" on a completely listed backend; one failure does not stop the rest. */
async function applyPlan(plan: PlanEntry[], backends: OpenBackend[]): Promise<RemovalResult[]> {
  const results: RemovalResult[] = [];
  for (const entry of plan) {
    if (entry.action !== "reap") continue;
    const backend = backends.find((candidate) => candidate.listing.backend === entry.item.backend);
    if (backend?.delete === undefined || !backend.listing.complete) continue;
    try {
      results.push({ entry, outcome: await backend.delete(entry) });
    } catch (error) {
      results.push({ entry, outcome: "failed", error: safeErrorMessage(error) });
    }
  }
  return results;
}
