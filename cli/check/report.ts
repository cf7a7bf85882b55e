/**
 * What `check` says: a summary line and a table for people (every proxy when
 * there are few; the down ones and the shared egress addresses when there
 * are many), JSON for scripts, and the node-exporter textfile format for
 * Prometheus. Pure: results in, text out.
 */
import {
  groupByEgress,
  membersToRotate,
  rotateChange,
  rotationText,
  sharedEgress,
  type EgressGroup,
} from "../../components/egress-diversity";
import type { ProbeResult } from "./probe";

export const CHECK_EXIT = { healthy: 0, someDown: 1, usage: 2 } as const;

/** Above this many proxies the table lists only the down ones unless --all. */
const FULL_TABLE_LIMIT = 25;

export interface CheckReport {
  /** ISO 8601, when the check started. */
  checkedAt: string;
  results: ProbeResult[];
}

export interface Summary {
  total: number;
  up: number;
  down: number;
  /** Distinct egress addresses among the proxies that reported one. */
  egressAddresses: number;
  /** Egress addresses behind more than one proxy. */
  sharedEgress: EgressGroup[];
}

export function summarize(results: readonly ProbeResult[]): Summary {
  const up = results.filter((result) => result.up).length;
  const groups = egressGroups(results);
  return {
    total: results.length,
    up,
    down: results.length - up,
    egressAddresses: groups.length,
    sharedEgress: sharedEgress(groups),
  };
}

/**
 * Proxies by exit address. A dual-stack member's two URLs leaving from one
 * address (its IPv6 URL checked with the IPv4 echo URL) are one member, not
 * a shared address.
 */
function egressGroups(results: readonly ProbeResult[]): EgressGroup[] {
  const seen = new Set<string>();
  return groupByEgress(
    results
      .map((result) => ({ name: result.name, egressIp: result.egressIp }))
      .filter(({ name, egressIp }) => {
        const key = JSON.stringify([name, egressIp]);
        return !seen.has(key) && seen.add(key) !== undefined;
      }),
  );
}

export function exitStatus(results: readonly ProbeResult[]): number {
  return results.every((result) => result.up) ? CHECK_EXIT.healthy : CHECK_EXIT.someDown;
}

export function summaryLine(summary: Summary): string {
  const proxies = `${summary.total} prox${summary.total === 1 ? "y" : "ies"}`;
  const health =
    summary.down === 0
      ? summary.total === 1
        ? "up"
        : "all up"
      : `${summary.up} up, ${summary.down} down`;
  const egress =
    summary.egressAddresses === 0
      ? ""
      : `; ${summary.egressAddresses} egress address${summary.egressAddresses === 1 ? "" : "es"}` +
        (summary.sharedEgress.length === 0
          ? ""
          : `, ${summary.sharedEgress.length} shared by several proxies`);
  return `${proxies}: ${health}${egress}`;
}

const ms = (value: number | undefined) =>
  value === undefined ? "-" : `${Math.round(value * 1000)} ms`;

export function renderTable(report: CheckReport, options: { all?: boolean } = {}): string {
  const summary = summarize(report.results);
  const listAll = options.all === true || report.results.length <= FULL_TABLE_LIMIT;
  // Down first: they are what the reader came for.
  const ordered = [...report.results].sort(
    (a, b) => Number(a.up) - Number(b.up) || a.name.localeCompare(b.name),
  );
  const rows = listAll ? ordered : ordered.filter((result) => !result.up);
  const lines = [summaryLine(summary)];
  if (rows.length > 0) {
    const header = ["PROXY", "ENDPOINT", "STATUS", "HTTP", "CONNECT", "EGRESS", "PROBLEM"];
    const cells = rows.map((result) => [
      result.name,
      result.endpoint,
      result.up ? "up" : "DOWN",
      result.httpStatus === undefined ? "-" : `${result.httpStatus} ${ms(result.httpSeconds)}`,
      ms(result.connectSeconds),
      result.egressIp ?? "-",
      result.error ?? "",
    ]);
    lines.push("", ...alignColumns([header, ...cells]));
  }
  if (!listAll)
    lines.push(
      "",
      `${summary.up} up prox${summary.up === 1 ? "y" : "ies"} not listed (--all lists every proxy, --json gives every detail)`,
    );
  lines.push(...rotationHints(report));
  if (summary.sharedEgress.length > 0) {
    lines.push("", "shared egress addresses (these proxies add capacity, not diversity):");
    for (const group of summary.sharedEgress.slice(0, listAll ? undefined : 10))
      lines.push(`  ${group.address}: ${abbreviate(group.proxies, listAll ? Infinity : 8)}`);
    if (!listAll && summary.sharedEgress.length > 10)
      lines.push(`  … and ${summary.sharedEgress.length - 10} more (--json lists them)`);
    // The pool's own rule (requireDistinctEgress names the same change): keep the first of each address.
    const later = membersToRotate(summary.sharedEgress).filter((name) =>
      POOL_MEMBER_KEY.test(name),
    );
    if (later.length > 0)
      lines.push(
        `  to leave each address to one proxy at the next \`pulumi up\` (new VMs may get new addresses): ${rotateChange(later, new Date(report.checkedAt))}`,
      );
  }
  return lines.join("\n");
}

/** A pool member's key, `<backend>-<index>`: what the pool's `rotate` takes. */
const POOL_MEMBER_KEY = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?-\d+$/;

/**
 * For each down proxy that is a pool member: the exact change that replaces
 * it at the next `pulumi up` (the new VM is ready before the old one goes).
 */
export function rotationHints(report: CheckReport): string[] {
  return [...downHints(report), ...agedHints(report)];
}

/**
 * Up members past their `rotateAfter` (the pool's rotateAfterDays): the next
 * `pulumi up --refresh` replaces them; the `rotate` change does it at a plain `up`.
 */
function agedHints(report: CheckReport): string[] {
  const aged = report.results.filter(
    (result) =>
      result.up &&
      result.rotateAfter !== undefined &&
      result.rotateAfter <= report.checkedAt &&
      POOL_MEMBER_KEY.test(result.name),
  );
  if (aged.length === 0) return [];
  const text = rotationText(new Date(report.checkedAt));
  return [
    "",
    `due for rotation by age (rotateAfterDays): ${aged.map((result) => `${result.name} (since ${result.rotateAfter})`).join(", ")}`,
    "  the next `pulumi up --refresh` replaces them (each new one is ready before the old one goes); at a plain `pulumi up`:",
    `  pool arguments: rotate: { ${aged.map((result) => `"${result.name}": "${text}"`).join(", ")} }`,
    ...aged.map(
      (result) =>
        `  stack config:   pulumi config set --path 'egress-proxies:pool.rotate["${result.name}"]' ${text}`,
    ),
  ];
}

/**
 * Down members: the change that replaces them, except those the last
 * refresh found listening in their guests while silent from its runner
 * ("path-unknown"): replacing them cannot mend a path, so they are named
 * apart, with what to look at instead.
 */
function downHints(report: CheckReport): string[] {
  const members = report.results.filter(
    (result) => !result.up && POOL_MEMBER_KEY.test(result.name),
  );
  const listening = members.filter((result) => result.recordedProblem?.kind === "path-unknown");
  const down = members.filter((result) => result.recordedProblem?.kind !== "path-unknown");
  const pathHints =
    listening.length === 0
      ? []
      : [
          "",
          `not suggested for replacement: ${[...new Set(listening.map((result) => result.name))].join(", ")}: ` +
            "the last refresh found them silent from its runner but listening in their guests (path unknown);",
          "  look at the path from here to them (routes, firewalls) before replacing anything",
        ];
  if (down.length === 0) return pathHints;
  const text = rotationText(new Date(report.checkedAt));
  return [
    ...pathHints,
    "",
    "to replace the down proxies at the next `pulumi up` (each new one is ready before the old one goes):",
    `  pool arguments: rotate: { ${down.map((result) => `"${result.name}": "${text}"`).join(", ")} }`,
    ...down.map(
      (result) =>
        `  stack config:   pulumi config set --path 'egress-proxies:pool.rotate["${result.name}"]' ${text}`,
    ),
  ];
}

function abbreviate(names: readonly string[], limit: number): string {
  if (names.length <= limit) return names.join(", ");
  return `${names.slice(0, limit).join(", ")} and ${names.length - limit} more`;
}

function alignColumns(rows: string[][]): string[] {
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => row[column]!.length)));
  return rows.map((row) =>
    row
      .map((cell, column) => (column === row.length - 1 ? cell : cell.padEnd(widths[column]!)))
      .join("  ")
      .trimEnd(),
  );
}

export function renderJson(report: CheckReport): string {
  const summary = summarize(report.results);
  return JSON.stringify(
    {
      checkedAt: report.checkedAt,
      summary: {
        total: summary.total,
        up: summary.up,
        down: summary.down,
        egressAddresses: summary.egressAddresses,
      },
      proxies: report.results,
      egress: egressGroups(report.results),
    },
    null,
    2,
  );
}

/**
 * The node-exporter textfile format (Prometheus text exposition 0.0.4): one
 * HELP and TYPE per family, then its samples. No timestamps on samples (the
 * textfile collector refuses them); the check time is its own gauge.
 */
export function renderPrometheus(report: CheckReport): string {
  const summary = summarize(report.results);
  const families: Array<{ name: string; help: string; samples: string[] }> = [];
  const family = (name: string, help: string, samples: string[]) =>
    families.push({ name, help, samples });
  const labels = (result: ProbeResult, extra: Record<string, string> = {}) =>
    labelSet({ proxy: result.name, endpoint: result.endpoint, family: result.family, ...extra });

  family(
    "egress_proxy_up",
    "1 if the proxy passed every probe of the last check (HTTP, CONNECT, egress), else 0.",
    report.results.map((result) => `egress_proxy_up${labels(result)} ${result.up ? 1 : 0}`),
  );
  family(
    "egress_proxy_probe_duration_seconds",
    "How long each probe through the proxy took in the last check.",
    report.results.flatMap((result) =>
      (
        [
          ["http", result.httpSeconds],
          ["connect", result.connectSeconds],
          ["egress", result.egressSeconds],
        ] as const
      ).flatMap(([probe, value]) =>
        value === undefined
          ? []
          : [`egress_proxy_probe_duration_seconds${labels(result, { probe })} ${value}`],
      ),
    ),
  );
  family(
    "egress_proxy_egress_info",
    "The address targets saw through the proxy in the last check (always 1).",
    report.results.flatMap((result) =>
      result.egressIp === undefined
        ? []
        : [`egress_proxy_egress_info${labels(result, { egress_ip: result.egressIp })} 1`],
    ),
  );
  family("egress_proxies_probed", "Proxies the last check probed.", [
    `egress_proxies_probed ${summary.total}`,
  ]);
  family("egress_proxies_up", "Proxies that passed every probe of the last check.", [
    `egress_proxies_up ${summary.up}`,
  ]);
  family(
    "egress_proxies_egress_addresses",
    "Distinct egress addresses among the proxies of the last check.",
    [`egress_proxies_egress_addresses ${summary.egressAddresses}`],
  );
  family(
    "egress_proxies_last_check_timestamp_seconds",
    "When the last check ran, as a Unix time.",
    [`egress_proxies_last_check_timestamp_seconds ${Date.parse(report.checkedAt) / 1000}`],
  );
  return families
    .filter((entry) => entry.samples.length > 0)
    .map((entry) =>
      [`# HELP ${entry.name} ${entry.help}`, `# TYPE ${entry.name} gauge`, ...entry.samples].join(
        "\n",
      ),
    )
    .join("\n")
    .concat("\n");
}

/** `{a="x",b="y"}` with label values escaped as the exposition format requires. */
export function labelSet(values: Record<string, string>): string {
  const escape = (value: string) =>
    value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
  return `{${Object.entries(values)
    .map(([name, value]) => `${name}="${escape(value)}"`)
    .join(",")}}`;
}
