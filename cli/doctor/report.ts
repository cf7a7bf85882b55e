/**
 * What the doctor prints: a table for people (check, status, fix) or one JSON
 * document for scripts. Only names, statuses and commands: never keys or
 * connection secrets.
 */
import type { Finding } from "../../provider/kvm/preflight";
import type { DoctorTarget } from "./targets";

export interface HostReport {
  target: DoctorTarget;
  /** Set when the host could not be examined at all (unreachable, denied). */
  problem?: string;
  findings: Finding[];
  /** What --fix did, in words. */
  fixed: string[];
}

export const hostPassed = (report: HostReport): boolean =>
  report.problem === undefined && report.findings.every((f) => f.status !== "fail");

const COLUMNS = ["HOST", "CHECK", "STATUS", "WHAT", "FIX"];
const GAP = "  ";
/** A longer host name wraps within its column. */
const MAX_HOST_WIDTH = 16;
/** The narrowest the two text columns get. */
const MIN_TEXT_WIDTH = 16;

/**
 * The table for people: one row per finding, at most `width` columns (80 when
 * stdout is no terminal). HOST, CHECK and STATUS keep their width; WHAT and
 * FIX share the rest and wrap at word boundaries, each row's continuation
 * lines indented under its cells. Every finding and problem appears once.
 */
export function renderTable(reports: readonly HostReport[], width = 80): string {
  const rows: string[][] = [];
  for (const report of reports) {
    const host =
      report.target.name === report.target.label
        ? report.target.label
        : `${report.target.name} (${report.target.label})`;
    // The host is named on its first row only.
    const hostCell = () => (rows.length === firstRow ? host : "");
    const firstRow = rows.length;
    if (report.problem !== undefined)
      rows.push([hostCell(), "connect", "FAIL", report.problem, ""]);
    for (const f of report.findings)
      rows.push([
        hostCell(),
        f.check,
        f.status.toUpperCase(),
        `${report.target.inputPrefix}${f.input}=${f.wanted}: ${f.hostHas}`,
        f.fix.join("; ") + (f.safeFix && f.status !== "ok" ? " [--fix does this]" : ""),
      ]);
  }
  const widths = columnWidths(rows, width);
  const out = [formatLine(COLUMNS, widths)];
  for (const row of rows) {
    const cells = row.map((cell, column) => wrapText(cell, widths[column]!));
    const height = Math.max(...cells.map((lines) => lines.length));
    for (let index = 0; index < height; index++)
      out.push(
        formatLine(
          cells.map((lines) => lines[index] ?? ""),
          widths,
        ),
      );
  }
  for (const report of reports)
    for (const did of report.fixed)
      out.push(...wrapText(`fixed on ${report.target.label}: ${did}`, width));
  const failed = reports.filter((report) => !hostPassed(report)).length;
  out.push(
    ...wrapText(
      failed === 0
        ? `${reports.length} host(s) ready`
        : `${failed} of ${reports.length} host(s) not ready` +
            (reports.some((r) => r.findings.some((f) => f.safeFix && f.status === "fail"))
              ? "; `egress-proxies doctor --fix` applies the fixes marked [--fix does this]"
              : ""),
      width,
    ),
  );
  return out.join("\n");
}

/** HOST, CHECK, STATUS as wide as their longest cell; WHAT and FIX split what is left. */
function columnWidths(rows: readonly string[][], width: number): number[] {
  const natural = COLUMNS.map((title, column) =>
    Math.max(title.length, ...rows.map((row) => row[column]!.length)),
  );
  const fixed = [Math.min(natural[0]!, MAX_HOST_WIDTH), natural[1]!, natural[2]!];
  const left = Math.max(
    2 * MIN_TEXT_WIDTH,
    width - fixed.reduce((sum, w) => sum + w, 0) - GAP.length * (COLUMNS.length - 1),
  );
  const [what, fix] = [natural[3]!, natural[4]!];
  if (what + fix <= left) return [...fixed, what, fix];
  // Give the shorter column what it needs (up to half), the longer the rest.
  const whatWidth =
    fix <= left / 2
      ? left - Math.max(fix, "FIX".length)
      : what <= left / 2
        ? what
        : Math.ceil(left / 2);
  return [...fixed, whatWidth, left - whatWidth];
}

function formatLine(cells: readonly string[], widths: readonly number[]): string {
  return cells
    .map((cell, column) => (column === cells.length - 1 ? cell : cell.padEnd(widths[column]!)))
    .join(GAP)
    .trimEnd();
}

/** Where a word longer than the line may break: after one of these (paths, input names, hosts). */
const SOFT_BREAK = /[./:;=,-]/;

/**
 * Word-wraps `text` to lines of at most `width` characters. A longer word is
 * broken after its last `.` `/` `:` `;` `=` `,` or `-` that fits, else cut.
 */
export function wrapText(text: string, width: number): string[] {
  const lines: string[] = [];
  let line = "";
  for (const word of text.split(/\s+/).filter((w) => w !== "")) {
    let rest = word;
    if (line !== "" && line.length + 1 + rest.length <= width) {
      line = `${line} ${rest}`;
      continue;
    }
    if (line !== "") lines.push(line);
    while (rest.length > width) {
      let cut = width;
      for (let index = width - 1; index > 0; index--)
        if (SOFT_BREAK.test(rest[index]!)) {
          cut = index + 1;
          break;
        }
      lines.push(rest.slice(0, cut));
      rest = rest.slice(cut);
    }
    line = rest;
  }
  if (line !== "" || lines.length === 0) lines.push(line);
  return lines;
}

export function renderJson(reports: readonly HostReport[]): string {
  return JSON.stringify(
    {
      ok: reports.every(hostPassed),
      hosts: reports.map((report) => ({
        name: report.target.name,
        host: report.target.label,
        ready: hostPassed(report),
        ...(report.problem !== undefined ? { problem: report.problem } : {}),
        checks: report.findings.map((f) => ({
          check: f.check,
          status: f.status,
          input: `${report.target.inputPrefix}${f.input}`,
          wanted: f.wanted,
          hostHas: f.hostHas,
          fix: f.fix,
          ...(f.safeFix ? { safeFix: f.safeFix.kind } : {}),
        })),
        fixed: report.fixed,
      })),
    },
    null,
    2,
  );
}
