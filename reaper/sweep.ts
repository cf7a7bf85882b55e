/**
 * One reaper run as a story: read every state (any failure: stop, delete
 * nothing), list every backend (each one complete or not), plan (pure),
 * report, and with --apply delete the planned orphans through the resources'
 * own delete paths. Returns the exit status; main.ts only parses argv.
 */
import { safeErrorMessage } from "../provider/common/redact";
import {
  REAPER_BACKENDS,
  type OpenBackend,
  type ReaperBackendKind,
  type SweepDeps,
} from "./backends";
import type { ReaperConfig } from "./config";
import { openKvmSession } from "./kvm";
import { planReaping, type PlanEntry } from "./plan";
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

export type { SweepDeps };

const defaultDeps: SweepDeps = { openKvm: openKvmSession };

/** Every kind in the registry, with the backends of that kind the config lists. */
const configuredKinds = (config: ReaperConfig) =>
  Object.entries(REAPER_BACKENDS).map(([key, kind]) => ({
    kind: kind as unknown as ReaperBackendKind<{ name: string }>,
    backends: config[key as keyof typeof REAPER_BACKENDS] as { name: string }[],
  }));

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
  const kinds = configuredKinds(config);
  const backends = await Promise.all(
    kinds.flatMap(({ kind, backends: configured }) =>
      configured.map((backend) => kind.open(backend, options, deps)),
    ),
  );
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
    for (const { kind } of kinds) await kind.closeAll?.().catch(() => undefined);
  }
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
