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

export function renderTable(reports: readonly HostReport[]): string {
  const rows: string[][] = [];
  for (const report of reports) {
    const host =
      report.target.name === report.target.label
        ? report.target.label
        : `${report.target.name} (${report.target.label})`;
    if (report.problem !== undefined) rows.push([host, "connect", "FAIL", report.problem, ""]);
    for (const f of report.findings)
      rows.push([
        host,
        f.check,
        f.status.toUpperCase(),
        `${report.target.inputPrefix}${f.input}=${f.wanted}: ${f.hostHas}`,
        f.fix.join("; ") + (f.safeFix && f.status !== "ok" ? " [--fix does this]" : ""),
      ]);
  }
  const widths = COLUMNS.map((title, column) =>
    Math.max(title.length, ...rows.map((row) => row[column]!.length)),
  );
  const line = (cells: string[]) =>
    cells
      .map((cell, column) => (column === cells.length - 1 ? cell : cell.padEnd(widths[column]!)))
      .join("  ")
      .trimEnd();
  const out = [line(COLUMNS), ...rows.map(line)];
  for (const report of reports)
    for (const did of report.fixed) out.push(`fixed on ${report.target.label}: ${did}`);
  const failed = reports.filter((report) => !hostPassed(report)).length;
  out.push(
    failed === 0
      ? `${reports.length} host(s) ready`
      : `${failed} of ${reports.length} host(s) not ready` +
          (reports.some((r) => r.findings.some((f) => f.safeFix && f.status === "fail"))
            ? "; `egress-proxies doctor --fix` applies the fixes marked [--fix does this]"
            : ""),
  );
  return out.join("\n");
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
