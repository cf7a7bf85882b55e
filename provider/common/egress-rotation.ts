/**
 * Rotation by exit address: `rotateEgress` maps an address a user sees
 * burned (`"203.0.113.9"`, `"2001:db8::7"`) to any text. The pool gives the
 * same map to every VM member, because which member leaves from an address
 * is known only from its state (the egress check's `egressIp` /
 * `egressIpv6`), never to the program.
 *
 * The rule, decided in `diff`: a member is replaced, its old VM deleted first
 * (see withEgressRotation), when its recorded exit
 * address has an entry whose text its own state does not carry for that
 * address. The replacement is created with the map, so its state carries the
 * text: a new VM that still leaves from the burned address (one NAT for the
 * whole network) is not replaced again and again; a new text rotates again,
 * as a member key's text does. A change of the map alone changes no member:
 * the map is never compared whole (common/diff.ts ChangeTableOf).
 *
 * Pure and offline: `pulumi preview` decides it from state alone.
 */
import type { DiffDecision } from "./diff";
import { rotateEgressEntry } from "./exit-address";

/** The input's name (common/diff.ts ChangeTableOf leaves it out of every table). */
export const ROTATE_EGRESS_KEY = "rotateEgress";

/**
 * The exit address that asks for this member's replacement, with its text,
 * or undefined. `olds` are the member's outputs (its exit addresses and the
 * map it was created or last updated with), `news` the checked new inputs.
 */
export function egressRotationDue(
  olds: Record<string, unknown>,
  news: Record<string, unknown>,
): { address: string; text: string } | undefined {
  for (const address of [olds.egressIp, olds.egressIpv6]) {
    const text = rotateEgressEntry(news[ROTATE_EGRESS_KEY], address);
    if (text === undefined) continue;
    if (rotateEgressEntry(olds[ROTATE_EGRESS_KEY], address) === text) continue;
    return { address: address as string, text };
  }
  return undefined;
}

/** The table's decision, plus the replacement an exit-address entry asks for. */
export function withEgressRotation(
  decision: DiffDecision,
  olds: Record<string, unknown>,
  news: Record<string, unknown>,
): DiffDecision {
  if (egressRotationDue(olds, news) === undefined) return decision;
  // check renames a VM it replaces so that old and new can live side by side, but check sees inputs
  // only, never the exit address: when nothing else renamed it, the name is still the old VM's and the
  // old VM must go first. A burned address serves crawlers nothing while it waits, either.
  return {
    changes: true,
    replaces: [...new Set([...decision.replaces, ROTATE_EGRESS_KEY])],
    deleteBeforeReplace: decision.deleteBeforeReplace || news.vmName === olds.vmName,
  };
}

/** Whether `a` was made after `b` (the same moment: the later name is the younger). */
export function isYounger(
  a: { name: string; createdAt: string | null | undefined },
  b: { name: string; createdAt: string | null | undefined },
): boolean {
  const [at, bt] = [Date.parse(a.createdAt ?? ""), Date.parse(b.createdAt ?? "")];
  if (Number.isFinite(at) && Number.isFinite(bt) && at !== bt) return at > bt;
  return a.name > b.name;
}
