/**
 * A shared exit address rotated without a person (the pool's `onCollision:
 * "rotate"`, carried in each member's `disruptionBudget`): of two members
 * that a refresh found leaving from one address, the younger (made later;
 * at the same time, the later name) gets an entry for that address in its
 * `rotateEgress`, `"shared with <older member>"`, and the rule of
 * common/egress-rotation.ts replaces it (old VM first), within the budget.
 *
 * Only a refresh in the same deployment tells a member where its siblings
 * leave from (the ledger notes each read): `pulumi up --refresh`, as the
 * operator and the timer run it. The loop guard is egress-rotation's: the
 * new VM is created with the entry, so when it lands on the same address
 * again (one NAT for the whole network) it is not replaced again; the pool
 * then says rotation cannot separate them.
 */
import { budgetedMember, disruptionLedger, type MemberExit } from "./disruption-budget";
import { isYounger, ROTATE_EGRESS_KEY } from "./egress-rotation";
import { canonicalAddress, rotateEgressEntry } from "./exit-address";

type Props = Record<string, unknown>;

/** The text of the entry: stable while the older member is the same, so it asks once. */
export const collisionText = (older: string): string => `shared with ${older}`;

/** The address `member` shares with an older sibling, and the oldest such sibling; undefined: none. */
export function olderSharing(
  member: string,
  exits: ReadonlyMap<string, MemberExit>,
): { address: string; older: string } | undefined {
  const own = exits.get(member);
  if (own === undefined) return undefined;
  const self = { name: member, createdAt: own.createdAt };
  for (const address of own.addresses) {
    const older = [...exits]
      .filter(([name, exit]) => name !== member && exit.addresses.includes(address))
      .map(([name, exit]) => ({ name, createdAt: exit.createdAt }))
      .filter((sibling) => isYounger(self, sibling))
      .sort((a, b) => (isYounger(a, b) ? 1 : -1))[0];
    if (older !== undefined) return { address, older: older.name };
  }
  return undefined;
}

/** The member's checked inputs, with the entry that rotates it when it is the younger on a shared address. */
export function inputsWithCollisionRotation(inputs: Props): Props {
  const budgeted = budgetedMember(inputs);
  if (budgeted === undefined || !budgeted.rotatesCollisions) return inputs;
  const found = olderSharing(budgeted.member, disruptionLedger.exitsOf(budgeted));
  if (found === undefined) return inputs;
  const entries = (inputs[ROTATE_EGRESS_KEY] ?? {}) as Record<string, string>;
  // An entry of the user's own for that address says more: it stays.
  if (rotateEgressEntry(entries, found.address) !== undefined) return inputs;
  return {
    ...inputs,
    [ROTATE_EGRESS_KEY]: { ...entries, [found.address]: collisionText(found.older) },
  };
}

/** What a refresh notes of a running member for the rule above. */
export function memberExitOf(found: Props): MemberExit | undefined {
  const addresses = [found.egressIp, found.egressIpv6]
    .map((address) => (typeof address === "string" ? canonicalAddress(address) : undefined))
    .filter((address): address is string => address !== undefined);
  if (found.state !== "running" || addresses.length === 0 || typeof found.createdAt !== "string")
    return undefined;
  return { addresses, createdAt: found.createdAt };
}
