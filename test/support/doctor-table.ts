/**
 * Reads `egress-proxies doctor`'s table back into rows: the header gives each
 * column's start, a line with a HOST or CHECK cell starts a row, and the
 * lines after it (wrapped WHAT and FIX text) are joined onto its cells. A
 * row without a HOST cell belongs to the host above it. Wrapping may break a
 * long word, so compare cells with `squashed` (all white space removed).
 */
export const squashed = (text: string): string => text.replace(/\s+/g, "");

export interface DoctorRow {
  host: string;
  check: string;
  status: string;
  what: string;
  fix: string;
}

export function doctorTableRows(stdout: string): DoctorRow[] {
  const lines = stdout.split("\n");
  const header = lines[0] ?? "";
  const starts = ["HOST", "CHECK", "STATUS", "WHAT", "FIX"].map((title) => header.indexOf(title));
  if (starts.some((start) => start < 0)) throw new Error(`no doctor table header: ${header}`);
  const rows: DoctorRow[] = [];
  // A table line has blanks in the gap before every column; the summary below it does not.
  const inTable = (line: string) =>
    line !== "" && starts.slice(1).every((start) => line.slice(start - 2, start).trim() === "");
  for (const line of lines.slice(1)) {
    if (!inTable(line)) break;
    const cells = starts.map((start, column) =>
      line.slice(start, starts[column + 1] ?? line.length).trim(),
    );
    const previous = rows[rows.length - 1];
    if (cells[1] !== "" || previous === undefined) {
      const host = cells[0] !== "" ? cells[0]! : (previous?.host ?? "");
      rows.push({ host, check: cells[1]!, status: cells[2]!, what: cells[3]!, fix: cells[4]! });
      continue;
    }
    const join = (a: string, b: string) => [a, b].filter((part) => part !== "").join(" ");
    previous.host = join(previous.host, cells[0]!);
    previous.what = join(previous.what, cells[3]!);
    previous.fix = join(previous.fix, cells[4]!);
  }
  return rows;
}
