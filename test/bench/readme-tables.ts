/**
 * `node dist/test/bench/readme-tables.js <results.json>... [--write README.md]`:
 * the README's "Measured" tables, rendered from saved `bench-results.json`
 * files (one per run, e.g. one under Node.js 26 and one with `--node 22`)
 * instead of typed by hand. Without `--write` it prints the section; with it,
 * it replaces what follows the README's BENCH TABLES marker up to the next
 * heading of the same or a higher level.
 *
 * Rendering is a pure function of the parsed files (test/unit/bench-readme-tables.test.ts).
 */
import { readFileSync, writeFileSync } from "node:fs";

/** The part of a bench-results.json (run.ts) the tables show. */
export interface BenchRun {
  node: string;
  date: string;
  commit?: string;
  machine: {
    os: string;
    cpus: number;
    cpuModel: string;
    memoryGiB: number;
    loadAverageAtEnd: number[];
  };
  facts: Record<string, string>;
  goals: {
    key: string;
    goal: string;
    value?: number;
    verdict: "met" | "missed" | "not run" | "info";
  }[];
}

export const TABLES_MARKER = "<!-- BENCH TABLES";

/** An information row (no goal) shows its value alone. */
const VERDICT_MARK = { met: "✔ ", missed: "✘ ", "not run": "not run ", info: "" } as const;

export function parseBenchRun(text: string, source: string): BenchRun {
  const run = JSON.parse(text) as Partial<BenchRun>;
  for (const field of ["node", "date", "machine", "facts", "goals"] as const)
    if (run[field] === undefined)
      throw new Error(
        `${source} has no "${field}": is it a bench-results.json written by npm run bench?`,
      );
  return run as BenchRun;
}

function describeRun(run: BenchRun): string {
  const { machine, facts } = run;
  const load = machine.loadAverageAtEnd.map((value) => value.toFixed(2)).join(" ");
  const ssh =
    facts.ssh_cipher === undefined
      ? ""
      : `; SSH ${facts.ssh_cipher}, native binding ${facts.ssh_native_binding ?? "unknown"}`;
  const commit = run.commit === undefined ? "" : ` at ${run.commit}`;
  return (
    `Node.js ${run.node}, ${run.date.slice(0, 16).replace("T", " ")} UTC${commit}: ` +
    `${machine.cpus} × ${machine.cpuModel}, ${machine.memoryGiB} GiB, ${machine.os}, load at the end ${load}${ssh}`
  );
}

/**
 * One table with a column per run: each goal's value and verdict side by side
 * (an information row's value alone, and not counted among the goals).
 */
export function renderTables(runs: readonly BenchRun[]): string {
  if (runs.length === 0)
    throw new Error("no bench results given: pass one or more bench-results.json files");
  const keys: string[] = [];
  const goalText = new Map<string, string>();
  for (const run of runs)
    for (const goal of run.goals) {
      if (!goalText.has(goal.key)) keys.push(goal.key);
      if (!goalText.has(goal.key) || !/\d/.test(goalText.get(goal.key) ?? ""))
        goalText.set(goal.key, goal.goal);
    }
  const header = ["figure", ...runs.map((run) => `Node.js ${run.node}`), "goal"];
  const rows = keys.map((key) => [
    `\`${key}\``,
    ...runs.map((run) => {
      const goal = run.goals.find((candidate) => candidate.key === key);
      if (goal === undefined || goal.value === undefined) return "not run";
      return `${VERDICT_MARK[goal.verdict]}${goal.value}`;
    }),
    // A goal relative to another figure differs per run ("≤ 3 × check_1_proxy_seconds = 1.18"): keep its rule only.
    (goalText.get(key) ?? "").replace(/ = .*$/, ""),
  ]);
  const line = (cells: string[]): string => `| ${cells.join(" | ")} |`;
  const met = runs.map((run) => {
    const goals = run.goals.filter((goal) => goal.verdict !== "info");
    const count = goals.filter((goal) => goal.verdict === "met").length;
    return `Node.js ${run.node}: ${count} of ${goals.length} goals met`;
  });
  return [
    ...runs.map((run) => `- ${describeRun(run)}`),
    "",
    line(header),
    line(header.map(() => "---")),
    ...rows.map(line),
    "",
    `${met.join("; ")}.`,
  ].join("\n");
}

/** README text with the section after the marker's "#### Measured" heading replaced by `tables`. */
export function replaceMeasuredSection(readme: string, tables: string): string {
  const marker = readme.indexOf(TABLES_MARKER);
  if (marker < 0) throw new Error(`the README has no ${TABLES_MARKER} marker`);
  const heading = readme.indexOf("#### Measured", marker);
  if (heading < 0)
    throw new Error('the README has no "#### Measured" heading after its BENCH TABLES marker');
  const bodyStart = readme.indexOf("\n", heading) + 1;
  const rest = readme.slice(bodyStart);
  const next = rest.search(/^#{1,4} /m);
  const tail = next < 0 ? "" : rest.slice(next);
  return `${readme.slice(0, bodyStart)}\n${tables}\n${tail === "" ? "" : `\n${tail}`}`;
}

function main(args: string[]): void {
  const writeAt = args.indexOf("--write");
  const target = writeAt >= 0 ? args[writeAt + 1] : undefined;
  if (writeAt >= 0 && target === undefined) throw new Error("--write needs the README's path");
  const files = args.filter(
    (_, index) => writeAt < 0 || (index !== writeAt && index !== writeAt + 1),
  );
  const tables = renderTables(files.map((file) => parseBenchRun(readFileSync(file, "utf8"), file)));
  if (target === undefined) {
    console.log(tables);
    return;
  }
  writeFileSync(target, replaceMeasuredSection(readFileSync(target, "utf8"), tables));
  console.log(`# ${target}: measured tables from ${files.join(", ")}`);
}

if (require.main === module) {
  try {
    main(process.argv.slice(2));
  } catch (error) {
    console.error(error instanceof Error ? error.message : error);
    process.exit(1);
  }
}
