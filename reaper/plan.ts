/**
 * The reaper's decision, pure: listings + stack states + now → a plan. Every
 * safety rule lives here, so each one is a unit test without a hypervisor.
 * The listers only report what they saw; the deleters only act on entries
 * this function marked "reap".
 */
import {
  ageSinceMs,
  MARK_TIME_EXAMPLE,
  parseMarkTime,
  type OwnerIdentity,
} from "../provider/common/mark";

export type {
  BackendListing,
  ItemKind,
  ItemOwnership,
  ListedItem,
} from "../provider/common/leftovers";
import type { ItemOwnership, ListedItem, BackendListing } from "../provider/common/leftovers";

/** One stack's state as the reaper read it: what its resources reference. */
export interface StackState {
  project: string;
  stack: string;
  /** Where it was read from, for messages. */
  source: string;
  resourceIds: ReadonlySet<string>;
  /** VM names in resource outputs: a resource reached through another host name still counts. */
  vmNames: ReadonlySet<string>;
}

export interface PlanOptions {
  now: Date;
  minAgeMs: number;
  pruneImages: boolean;
  /** Only marks of this project are acted on (the others are "another owner"). */
  project?: string;
}

export type Action = "reap" | "keep";

export interface PlanEntry {
  item: ListedItem;
  action: Action;
  /** Why, in words, for the table. */
  why: string;
  /** "project/stack" when the item names one. */
  ownerStack?: string;
  ageMs?: number;
}

export const stackKey = (owner: Pick<OwnerIdentity, "project" | "stack">): string =>
  `${owner.project}/${owner.stack}`;

export function planReaping(
  listings: readonly BackendListing[],
  states: readonly StackState[],
  options: PlanOptions,
): PlanEntry[] {
  // Two sources for one stack (a backup and the live backend, say): either one referencing an item keeps it.
  const byStack = new Map<string, StackState>();
  for (const state of states) {
    const seen = byStack.get(stackKey(state));
    byStack.set(
      stackKey(state),
      seen === undefined
        ? state
        : {
            ...seen,
            source: `${seen.source}, ${state.source}`,
            resourceIds: new Set([...seen.resourceIds, ...state.resourceIds]),
            vmNames: new Set([...seen.vmNames, ...state.vmNames]),
          },
    );
  }
  return listings.flatMap((listing) =>
    listing.items.map((item) => decide(item, listing, byStack, options)),
  );
}

function decide(
  item: ListedItem,
  listing: BackendListing,
  byStack: ReadonlyMap<string, StackState>,
  options: PlanOptions,
): PlanEntry {
  const keep = (why: string, extra: Partial<PlanEntry> = {}): PlanEntry => ({
    item,
    action: "keep",
    why,
    ...extra,
  });
  const { ownership } = item;
  switch (ownership.kind) {
    case "unmarked":
      return keep(
        item.kind === "volume" || item.kind === "seed"
          ? "no domain, but volumes carry no mark: owner unknown (see unmarkedVolumes)"
          : "no ownership mark: not ours",
      );
    case "corrupt":
      return keep(`unreadable ownership mark (${ownership.reason}): left for a person`);
    case "shared":
      return decideBaseImage(item, ownership, listing, options);
    default:
      break;
  }
  const owner = ownership.kind === "marked" ? ownership.mark.owner : ownership.owner;
  const ownerStack = stackKey(owner);
  const createdAt = ownership.kind === "marked" ? ownership.mark.createdAt : ownership.createdAt;
  const ageMs = ageSinceMs(createdAt, options.now);
  const withOwner = { ownerStack, ...(ageMs === undefined ? {} : { ageMs }) };
  if (options.project !== undefined && owner.project !== options.project)
    return keep(`another owner (project ${owner.project}, not ${options.project})`, withOwner);
  const state = byStack.get(ownerStack);
  if (state === undefined)
    return keep(`unknown owner: no state given for ${ownerStack}`, withOwner);
  if (isReferenced(item, state)) return keep(`in the state of ${ownerStack}`, withOwner);
  if (ageMs === undefined) return keep(`${unusableTime(createdAt)}: never old enough`, withOwner);
  if (ageMs < options.minAgeMs)
    return keep(`younger than --min-age (${formatAge(ageMs)})`, withOwner);
  if (!listing.complete)
    return keep(`orphan, but ${listing.backend} was not listed completely`, withOwner);
  const attributed = ownership.kind === "attributed" ? " (owner from the config: no mark)" : "";
  return {
    item,
    action: "reap",
    why: `not in the state of ${ownerStack}${attributed}`,
    ...withOwner,
  };
}

function decideBaseImage(
  item: ListedItem,
  ownership: Extract<ItemOwnership, { kind: "shared" }>,
  listing: BackendListing,
  options: PlanOptions,
): PlanEntry {
  const ageMs = ageSinceMs(ownership.createdAt, options.now);
  const extra = ageMs === undefined ? {} : { ageMs };
  const keep = (why: string): PlanEntry => ({ item, action: "keep", why, ...extra });
  if (ownership.usedBy.length > 0) return keep(`backs ${ownership.usedBy.join(", ")}`);
  if (!options.pruneImages) return keep("unused base image (pass --prune-images to remove)");
  // A base serves every project on the host: a sweep limited to one project does not decide for the rest.
  if (options.project !== undefined)
    return keep("unused base image, but --project limits this sweep and bases are shared");
  if (ageMs === undefined) return keep(unusableTime(ownership.createdAt));
  if (ageMs < options.minAgeMs) return keep(`younger than --min-age (${formatAge(ageMs)})`);
  if (!listing.complete) return keep(`unused, but ${listing.backend} was not listed completely`);
  return { item, action: "reap", why: "no overlay backs onto it", ...extra };
}

/** By id, or by VM name: a stack that reached the host under another name still references its VM. */
function isReferenced(item: ListedItem, state: StackState): boolean {
  if (item.resourceId !== undefined && state.resourceIds.has(item.resourceId)) return true;
  const vmName = item.vmName ?? item.name;
  return state.vmNames.has(vmName);
}

/** Why a creation time gives no age, for the report. */
function unusableTime(createdAt: string | undefined): string {
  if (createdAt === undefined) return "creation time unknown";
  if (parseMarkTime(createdAt) === undefined)
    return `creation time ${JSON.stringify(createdAt)} unreadable (the mark writes ${MARK_TIME_EXAMPLE})`;
  return `creation time ${createdAt} is in the future`;
}

export function formatAge(ms: number): string {
  const minutes = Math.floor(ms / 60_000);
  if (minutes < 60) return `${minutes}m`;
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return `${hours}h${String(minutes % 60).padStart(2, "0")}m`;
  return `${Math.floor(hours / 24)}d`;
}

/** "90s", "30m", "1h", "2d", or plain seconds. */
export function parseDuration(text: string): number | undefined {
  const match = /^(\d+)(s|m|h|d)?$/.exec(text.trim());
  if (!match) return undefined;
  const unit = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 }[match[2] ?? "s"]!;
  return Number(match[1]) * unit;
}
