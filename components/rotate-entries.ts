/**
 * The pool's `rotate` entries checked against the members it has (their key, `<backend>-<index>`, to
 * their backend kind). A key may also be an exit address: which member leaves from it is in state only,
 * so those entries go to every VM member (`rotateEgress`, provider/common/egress-rotation.ts). Pure: the
 * pool places its members and logs what this returns.
 */
import { canonicalAddress } from "../provider/common/exit-address";

/** The entries keyed by an exit address, keys in canonical form; undefined when there are none. */
export function addressEntries(rotate: unknown): Record<string, string> | undefined {
  if (typeof rotate !== "object" || rotate === null || Array.isArray(rotate)) return undefined;
  const entries = Object.entries(rotate as Record<string, unknown>).flatMap(([key, text]) => {
    const address = canonicalAddress(key);
    return address === undefined || typeof text !== "string" ? [] : [[address, text] as const];
  });
  return entries.length === 0 ? undefined : Object.fromEntries(entries);
}

/**
 * Problems with the entries: not a map, a static member (not the pool's to replace), an unusable text.
 * An entry for a member the pool does not have is not a problem: a scale-down leaves it behind
 * (docs/day2.md says to keep entries), and failing on it would fail every `up` until a person edits it.
 */
export function rotateEntryProblems(
  rotate: unknown,
  members: ReadonlyMap<string, string>,
): string[] {
  if (typeof rotate !== "object" || rotate === null || Array.isArray(rotate))
    return [
      'rotate must map member keys or exit addresses to any text, e.g. { "kvm1-0": "2026-12-02", "203.0.113.9": "burned-2026-12-04" }',
    ];
  return Object.entries(rotate).flatMap(([key, text]) => {
    const kind = members.get(key);
    if (kind === undefined && canonicalAddress(key) === undefined) return [];
    if (kind === "static")
      return [
        `rotate.${key}: a static proxy is not the pool's to replace; change its URL in the backend instead`,
      ];
    if (typeof text !== "string" || text === "" || text.length > 200)
      return [`rotate.${key} must be a text of 1 to 200 characters, e.g. "2026-12-02"`];
    return [];
  });
}

/** The entries that name no member (scaled down, or a typo): each rotates nothing, said with the members. */
export function unusedEntries(rotate: unknown, members: ReadonlyMap<string, string>): string[] {
  if (typeof rotate !== "object" || rotate === null || Array.isArray(rotate)) return [];
  const known = [...members.keys()].join(", ");
  return Object.keys(rotate)
    .filter((key) => !members.has(key) && canonicalAddress(key) === undefined)
    .map(
      (key) =>
        `rotate.${key}: the pool has no member ${key} (scaled down, or a typo?), so the entry rotates nothing; its members are ${known}`,
    );
}
