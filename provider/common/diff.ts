/**
 * The replace-or-update decision both resources make in `diff`, and the VM
 * name `check` settles on. Pure and offline: `pulumi preview` in CI has no
 * credentials and no route to any hypervisor.
 */
import { containsUnknown, UNKNOWN } from "./inputs";
import { newVmName } from "./names";

export type ChangeKind = "replace" | "update";

/**
 * Which input paths replace the VM and which update in place. A key is a
 * top-level input ("image") or a dotted path into one ("connection.host")
 * when one object mixes both kinds.
 */
export type ChangeTable = Readonly<Record<string, ChangeKind>>;

/** `connection.host`, `connection.user`, …: the dotted paths of the object inputs in `Split`. */
type SplitPaths<T, Split extends keyof T> = Split extends keyof T
  ? `${Split & string}.${keyof NonNullable<T[Split]> & string}`
  : never;

/**
 * A change table that must name every input of `T` (a new input that nobody
 * classified does not compile): each top-level key, except the object inputs
 * in `Split`, which are classified field by field as dotted paths.
 * `vmNameChosenBy` follows `vmName` and is never compared on its own;
 * `rotateEgress` is never compared whole (its rule: common/egress-rotation.ts).
 */
export type ChangeTableOf<T, Split extends keyof T = never> = Readonly<
  Record<
    Exclude<keyof T, Split | "vmNameChosenBy" | "rotateEgress"> | SplitPaths<T, Split>,
    ChangeKind
  >
>;

export interface DiffDecision {
  changes: boolean;
  replaces: string[];
  deleteBeforeReplace: boolean;
}

/** The value at a dotted path; under an unknown object, the path is unknown too. */
export const valueAt = (inputs: Record<string, unknown>, path: string): unknown =>
  path
    .split(".")
    .reduce<unknown>(
      (value, key) =>
        value === UNKNOWN
          ? UNKNOWN
          : typeof value === "object" && value !== null
            ? (value as Record<string, unknown>)[key]
            : undefined,
      inputs,
    );

/**
 * FROZEN state key: read sets it on the props and inputs of a VM that `.get`
 * adopted (neither holds what the VM was created with), never create or update.
 */
export const ADOPTED_KEY = "adopted";

/** Whether `olds` (outputs, or the inputs Check gets) is a state `.get` adopted rather than one create wrote. */
export function isAdoptedState(olds: Record<string, unknown>): boolean {
  return olds[ADOPTED_KEY] === true;
}

/**
 * The table's paths whose values differ (an unknown value counts as different).
 *
 * The adoption rule: in a state `.get` adopted, a path without a value is one
 * neither the host nor the VM's mark could report (userData, a token, an
 * image URL, anything a mark written before creation fields existed does not
 * hold), so it does not count as a change: the program's value is taken on
 * trust. A state create wrote holds every input it was given, so there a
 * missing value is a real one ("unset") and compares as usual. The same
 * rule holds in check (vmNameAfterReplacement), whose olds are the inputs
 * read returned.
 */
function changedPaths(
  table: ChangeTable,
  olds: Record<string, unknown>,
  news: Record<string, unknown>,
): string[] {
  const adopted = isAdoptedState(olds);
  return Object.keys(table).filter((path) => {
    const before = valueAt(olds, path);
    // Missing, not null: null is a value read reported ("the VM has none").
    if (adopted && before === undefined) return false;
    const after = valueAt(news, path);
    return containsUnknown(after) || !sameValue(before, after);
  });
}

/**
 * `olds` are the previous outputs (which carry the checked inputs), `news`
 * the checked new inputs, possibly with unknown values. A state `.get`
 * adopted compares only what it holds (the adoption rule, changedPaths).
 */
export function decideDiff(
  table: ChangeTable,
  olds: Record<string, unknown>,
  news: Record<string, unknown>,
): DiffDecision {
  const changed = changedPaths(table, olds, news);
  // New provider code must reach state even when no input changed.
  const providerChanged = olds.__provider !== undefined && news.__provider !== olds.__provider;
  const replaces = changed.filter((path) => table[path] === "replace");
  // A name the user fixed cannot exist twice: the old VM must go first.
  const deleteBeforeReplace =
    replaces.length > 0 && news.vmNameChosenBy === "user" && news.vmName === olds.vmName;
  return { changes: changed.length > 0 || providerChanged, replaces, deleteBeforeReplace };
}

/** The Pulumi resource name the resource class put in `owner`, the prefix of generated VM names. */
export function resourceNameOf(news: Record<string, unknown>): string {
  const owner = news.owner as { resource?: unknown } | undefined;
  return typeof owner?.resource === "string" && owner.resource !== UNKNOWN
    ? owner.resource
    : "proxy";
}

/**
 * Autonaming, step one (before validation): the user's name, else the name
 * check generated last time, else a fresh one.
 */
export function provisionalVmName(
  olds: Record<string, unknown>,
  news: Record<string, unknown>,
  resourceName: string,
): { vmName: string; vmNameChosenBy: "user" | "provider" } {
  if (typeof news.vmName === "string") return { vmName: news.vmName, vmNameChosenBy: "user" };
  const previous =
    olds.vmNameChosenBy === "provider" && typeof olds.vmName === "string" ? olds.vmName : undefined;
  return { vmName: previous ?? newVmName(resourceName), vmNameChosenBy: "provider" };
}

/**
 * Autonaming, step two (after validation, so defaults are filled on both
 * sides and an unchanged program compares equal): a generated name is
 * replaced when the VM will be replaced, because a create-before-delete
 * replacement would otherwise collide with the old VM still holding it.
 */
export function vmNameAfterReplacement(
  table: ChangeTable,
  olds: Record<string, unknown>,
  checked: Record<string, unknown> & { vmName: string; vmNameChosenBy?: string },
  resourceName: string,
): string {
  if (checked.vmNameChosenBy !== "provider" || checked.vmName !== olds.vmName)
    return checked.vmName;
  // Only a known change renames. A value unknown at preview may turn out the
  // same; check runs again at `up` with it known and renames then if needed,
  // so preview shows the table's verdict for that field and no invented vmName change.
  const replaced = changedPaths(table, olds, checked).some(
    (path) =>
      path !== "vmName" && table[path] === "replace" && !containsUnknown(valueAt(checked, path)),
  );
  return replaced ? newVmName(resourceName) : checked.vmName;
}

/** Structural equality where undefined, null and a missing key are the same, and key order does not matter. */
export function sameValue(a: unknown, b: unknown): boolean {
  if (a === undefined || a === null) return b === undefined || b === null;
  if (b === undefined || b === null) return false;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((item, index) => sameValue(item, b[index]));
  }
  if (typeof a === "object" && typeof b === "object") {
    const keys = new Set([...Object.keys(a as object), ...Object.keys(b as object)]);
    for (const key of keys)
      if (!sameValue((a as Record<string, unknown>)[key], (b as Record<string, unknown>)[key]))
        return false;
    return true;
  }
  return a === b;
}
