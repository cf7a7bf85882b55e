/**
 * What a backend reports about what it holds, for the reaper: every item that
 * carries (or may carry) our mark, with who made it. Each backend lists its own
 * (provider/<backend>/leftovers.ts); the reaper decides (reaper/plan.ts).
 */
import type { OwnerIdentity, OwnershipMark } from "./mark";

export type ItemKind = "domain" | "volume" | "seed" | "base-image" | "proxmox-vm";

/** What the item says about who made it. Volumes carry no mark: the lister may attribute them. */
export type ItemOwnership =
  | { kind: "marked"; mark: OwnershipMark }
  /** A per-VM volume without a domain, taken to be `owner`'s by the backend's config. */
  | { kind: "attributed"; owner: Pick<OwnerIdentity, "project" | "stack">; createdAt?: string }
  | { kind: "unmarked" }
  | { kind: "corrupt"; reason: string }
  /** Base images are shared by every stack on the host; they have no owner. */
  | { kind: "shared"; createdAt?: string; usedBy: string[] };

export interface ListedItem {
  /** The backend's name in the config. */
  backend: string;
  /** How the host or node appears in resource ids. */
  host: string;
  kind: ItemKind;
  /** Domain, volume or VM name. */
  name: string;
  /** The storage pool a volume was listed in. */
  pool?: string;
  /** The VM the item belongs to (for volumes and seeds: the name they were made for). */
  vmName?: string;
  /** The id a KvmProxy / ProxmoxProxy managing this item has in its state. */
  resourceId?: string;
  ownership: ItemOwnership;
  /** running, paused, stopped... for the report. */
  state?: string;
}

export interface BackendListing {
  backend: string;
  /** False when anything could not be listed: then nothing is deleted on this backend. */
  complete: boolean;
  /** Why the listing is incomplete, for the report. */
  problem?: string;
  /** Something the report should say about this backend, e.g. that it has nothing to reap. */
  note?: string;
  items: ListedItem[];
}
