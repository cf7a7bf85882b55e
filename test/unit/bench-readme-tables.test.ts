import assert from "node:assert/strict";
import {
  parseBenchRun,
  renderTables,
  replaceMeasuredSection,
  type BenchRun,
} from "../bench/readme-tables";

const run = (node: string, goals: BenchRun["goals"]): BenchRun => ({
  node,
  date: "2026-12-02T20:06:10.084Z",
  commit: "f6a2db7",
  machine: {
    os: "Linux 6.18 x64",
    cpus: 2,
    cpuModel: "Xeon",
    memoryGiB: 23.5,
    loadAverageAtEnd: [1.28, 0.39, 0.24],
  },
  facts: { ssh_cipher: "aes128-gcm@openssh.com", ssh_native_binding: "no" },
  goals,
});

describe("bench README tables: rendered from bench-results.json, not typed", () => {
  const current = run("26.12.1", [
    { key: "upload_time_ratio_vs_virsh", goal: "≤ 0.5", value: 0.7649, verdict: "missed" },
    {
      key: "upload_time_ratio_vs_ssh",
      goal: "no goal (information)",
      value: 0.5351,
      verdict: "info",
    },
    {
      key: "check_200_proxies_seconds",
      goal: "≤ 3 × check_1_proxy_seconds = 1.177",
      value: 0.5479,
      verdict: "met",
    },
  ]);
  const floor = run("22.23.5", [
    { key: "upload_time_ratio_vs_virsh", goal: "≤ 0.5", verdict: "not run" },
    { key: "upload_time_ratio_vs_ssh", goal: "no goal (information)", verdict: "info" },
    {
      key: "check_200_proxies_seconds",
      goal: "≤ 3 × check_1_proxy_seconds = 1.193",
      value: 0.6029,
      verdict: "met",
    },
  ]);

  it("puts each run in a column with its verdict, and keeps a relative goal's rule, not one run's bound", () => {
    const tables = renderTables([current, floor]);
    assert.match(tables, /^\| figure \| Node\.js 26\.12\.1 \| Node\.js 22\.23\.5 \| goal \|$/m);
    assert.match(tables, /^\| `upload_time_ratio_vs_virsh` \| ✘ 0\.7649 \| not run \| ≤ 0\.5 \|$/m);
    assert.match(
      tables,
      /^\| `check_200_proxies_seconds` \| ✔ 0\.5479 \| ✔ 0\.6029 \| ≤ 3 × check_1_proxy_seconds \|$/m,
    );
    assert.match(
      tables,
      /Node\.js 26\.12\.1: 1 of 2 goals met; Node\.js 22\.23\.5: 1 of 2 goals met\./,
    );
    assert.match(
      tables,
      /- Node\.js 26\.12\.1, 2026-12-02 20:06 UTC at f6a2db7: 2 × Xeon, 23\.5 GiB, .*load at the end 1\.28 0\.39 0\.24; SSH aes128-gcm@openssh\.com, native binding no/,
    );
  });

  it("shows an information row's value alone, and counts it as no goal", () => {
    const tables = renderTables([current, floor]);
    assert.match(
      tables,
      /^\| `upload_time_ratio_vs_ssh` \| 0\.5351 \| not run \| no goal \(information\) \|$/m,
    );
    const onlyInformation = run("26.12.1", [
      { key: "upload_host_cpu_ms", goal: "no goal (information)", value: 1030, verdict: "info" },
      { key: "upload_ratio_vs_host_cpu", goal: "≤ 1.1", value: 1.02, verdict: "met" },
    ]);
    assert.match(renderTables([onlyInformation]), /Node\.js 26\.12\.1: 1 of 1 goals met\./);
    assert.match(renderTables([onlyInformation]), /^\| `upload_host_cpu_ms` \| 1030 \| /m);
  });

  it("replaces only the Measured section after the marker, keeping what follows", () => {
    const readme =
      "# x\n<!-- BENCH TABLES: ... -->\n\n#### Measured\n\nold text\n\n## Next\nkept\n";
    const replaced = replaceMeasuredSection(readme, "NEW");
    assert.equal(
      replaced,
      "# x\n<!-- BENCH TABLES: ... -->\n\n#### Measured\n\nNEW\n\n## Next\nkept\n",
    );
    assert.equal(replaceMeasuredSection(replaced, "NEW"), replaced, "idempotent");
  });

  it("refuses a file that is not bench results, naming the missing field", () => {
    assert.throws(() => parseBenchRun('{"node":"26"}', "x.json"), /x\.json has no "date"/);
    assert.throws(() => renderTables([]), /no bench results given/);
    assert.throws(() => replaceMeasuredSection("no marker", "t"), /no <!-- BENCH TABLES marker/);
  });
});
