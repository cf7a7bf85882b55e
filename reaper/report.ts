/**
 * What the reaper prints: a table for people (dry run and --apply), or one
 * JSON document for scripts. Only names, owners and reasons appear: never
 * connection details or tokens.
 */
import { formatAge, type BackendListing, type PlanEntry } from "./plan";
import type { DeleteOutcome } from "./kvm";

export interface RemovalResult {
  entry: PlanEntry;
  outcome: DeleteOutcome | "failed";
  error?: string;
}

const COLUMNS = ["BACKEND", "HOST", "KIND", "NAME", "OWNER STACK", "AGE", "ACTION", "WHY"];

export function renderTable(
  plan: readonly PlanEntry[],
  listings: readonly BackendListing[],
  removals: readonly RemovalResult[],
  applied: boolean,
): string {
  const rows = plan.map((entry) => [
    entry.item.backend,
    entry.item.host,
    entry.item.kind + (entry.item.state ? ` (${entry.item.state})` : ""),
    entry.item.name,
    entry.ownerStack ?? "-",
    entry.ageMs === undefined ? "-" : formatAge(entry.ageMs),
    entry.action === "reap" ? (applied ? "REMOVE" : "would remove") : "keep",
    entry.why,
  ]);
  const widths = COLUMNS.map((title, column) =>
    Math.max(title.length, ...rows.map((row) => row[column]!.length)),
  );
  const line = (cells: string[]) =>
    cells
      .map((cell, column) => (column === cells.length - 1 ? cell : cell.padEnd(widths[column]!)))
      .join("  ");
  const out = [line(COLUMNS), ...rows.map(line)];
  for (const listing of listings)
    if (listing.note !== undefined) out.push(`- ${listing.backend}: ${listing.note}`);
  for (const listing of listings)
    if (!listing.complete)
      out.push(
        `! ${listing.backend}: not listed completely (${listing.problem}); nothing deleted there`,
      );
  const orphans = plan.filter((entry) => entry.action === "reap").length;
  if (!applied) out.push(`${orphans} orphan(s); dry run: pass --apply to remove them`);
  for (const removal of removals) {
    const { item } = removal.entry;
    const what = `${item.kind} ${item.name} on ${item.backend}/${item.host}`;
    out.push(
      removal.outcome === "failed"
        ? `failed to remove ${what}: ${removal.error}`
        : `${removal.outcome === "removed" ? "removed" : "already gone"}: ${what}`,
    );
  }
  return out.join("\n");
}

export function renderJson(
  plan: readonly PlanEntry[],
  listings: readonly BackendListing[],
  removals: readonly RemovalResult[],
  applied: boolean,
): string {
  return JSON.stringify(
    {
      applied,
      backends: listings.map((listing) => ({
        backend: listing.backend,
        complete: listing.complete,
        ...(listing.problem === undefined ? {} : { problem: listing.problem }),
        ...(listing.note === undefined ? {} : { note: listing.note }),
      })),
      items: plan.map((entry) => ({
        backend: entry.item.backend,
        host: entry.item.host,
        kind: entry.item.kind,
        name: entry.item.name,
        ...(entry.item.pool === undefined ? {} : { pool: entry.item.pool }),
        ...(entry.item.state === undefined ? {} : { state: entry.item.state }),
        ...(entry.item.resourceId === undefined ? {} : { resourceId: entry.item.resourceId }),
        ownerStack: entry.ownerStack ?? null,
        ageSeconds: entry.ageMs === undefined ? null : Math.floor(entry.ageMs / 1000),
        action: entry.action,
        why: entry.why,
      })),
      removed: removals.map((removal) => ({
        backend: removal.entry.item.backend,
        kind: removal.entry.item.kind,
        name: removal.entry.item.name,
        outcome: removal.outcome,
        ...(removal.error === undefined ? {} : { error: removal.error }),
      })),
    },
    null,
    2,
  );
}
