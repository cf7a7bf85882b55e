/**
 * What a node answers for all its VMs in one call, shared by the Reads of a
 * refresh (common/shared-listing.ts): the node's VM index (F25: status,
 * paused, lock) and the ISO content of a seed storage on it. Without sharing,
 * every member paid for its whole node's answer (issue 32, docs/scale.md).
 *
 * This module holds the listings and forgets them; it imports nothing that
 * talks to PVE, so the client (every write) and the task waiter (every task)
 * can forget a node's listings without an import circle. Fn name the
 * behaviours of docs/proxmox.md, section 9.
 */
import { SharedListings } from "../common/shared-listing";

/**
 * How long after it was asked a node's listing may still answer a Read: 10 s.
 * The engine runs a refresh's Reads `--parallel` at a time (by default 4 ×
 * the CPUs: 8 on a 2-CPU runner, docs/scale.md), and a Read asks three
 * things in turn (the index, the config with the seed, the agent). On the
 * simulator (20 ms a call) a 200-member refresh takes 2 s; on a real node a
 * call takes more (pvedaemon reads the config, QEMU answers the agent), say
 * 50–100 ms, so 200 / 8 × 3 × 100 ms ≈ 7.5 s: one window still covers it, and
 * a 1000-member one asks a few times per node instead of once per member.
 * Longer buys little and keeps a change made behind the back of a process
 * that outlives one refresh (an engine test refreshing twice) hidden longer;
 * our own writes and tasks never hide (they forget).
 */
export const NODE_LISTING_WINDOW_MS = 10_000;

/** A VM as its node's index lists it (F25); the fields read needs, as status/current names them. */
export interface IndexedVm {
  status: string;
  qmpstatus?: string;
  lock?: string;
  name?: string;
}

const vmIndexes = new SharedListings<ReadonlyMap<number, IndexedVm>>({
  windowMs: NODE_LISTING_WINDOW_MS,
});
const isoContents = new SharedListings<ReadonlySet<string>>({ windowMs: NODE_LISTING_WINDOW_MS });
/**
 * Keys carry who asked (`scope`: the API endpoint and the token id, never its
 * secret), as the index is filtered by the token's VM.Audit and another
 * endpoint may be another cluster; each listing's group is its node's name.
 */
const keyOf = (scope: string, node: string, what: string): string =>
  JSON.stringify([scope, node, what]);

/** The node's VM index by VMID, asking `list` only when no fresh one is in hand or in flight. */
export function sharedVmIndex(
  scope: string,
  node: string,
  list: () => Promise<ReadonlyMap<number, IndexedVm>>,
): Promise<ReadonlyMap<number, IndexedVm>> {
  return vmIndexes.get(keyOf(scope, node, "qemu"), list, node);
}

/** The volids of a storage's ISO content on the node, shared as the index is. */
export function sharedIsoContent(
  scope: string,
  node: string,
  storage: string,
  list: () => Promise<ReadonlySet<string>>,
): Promise<ReadonlySet<string>> {
  return isoContents.get(keyOf(scope, node, `storage/${storage}/iso`), list, node);
}

/**
 * This process changed the node (a write, or a task it waited for): no later
 * Read sees a listing asked before. By node name across endpoints, since
 * every node of a cluster answers for the others (forgetting a same-named
 * node of another cluster costs one listing). `undefined`: a write not
 * addressed to one node; every node is forgotten.
 */
export function forgetNodeListings(node: string | undefined): void {
  for (const listings of [vmIndexes, isoContents])
    if (node === undefined) listings.forgetAll();
    else listings.forget(node);
}
