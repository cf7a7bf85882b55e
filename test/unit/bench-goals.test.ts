import assert from "node:assert/strict";
import {
  describeComparison,
  evaluateGoal,
  evaluateGoals,
  formatGoalTable,
  GOALS,
  type Goal,
} from "../bench/goals";
import { parseBenchArgs } from "../bench/other-node";

const figures = (entries: Record<string, number>) => new Map(Object.entries(entries));
const goal = (key: string): Goal => GOALS.find((candidate) => candidate.key === key)!;

describe("bench goals: each figure against issue 18's Done when", () => {
  it("holds every goal of the issue once, in its order, each with the issue's words", () => {
    assert.deepEqual(
      GOALS.map((candidate) => candidate.key),
      [
        "upload_ratio_vs_host_cpu",
        "upload_host_cpu_ms",
        "upload_ours_cpu_ms_per_mib",
        "upload_time_ratio_vs_virsh",
        "upload_time_ratio_vs_ssh",
        "upload_peak_rss_mb",
        "upload_2gib_peak_rss_mb",
        "create_overhead_ratio_vs_virsh",
        "create_rpc_count",
        "metadata_sweep_speedup_vs_virsh",
        "pve_api_calls_per_create",
        "pve_parallel10_ratio_vs_one",
        "reaper_sweep_500_seconds",
        "seed_build_speedup_vs_genisoimage",
        "check_200_proxies_seconds",
        "preflight_extra_round_trips",
        "refresh_200_proxies_seconds",
        "prefix_exit_addresses_per_1000",
        "gateway_added_latency_p50_ms",
        "gateway_added_latency_p99_ms",
        "gateway_rps_ratio_vs_direct",
        "gateway_rps_ratio_vs_direct_shared_cores",
        "gateway_sticky_percent",
        "gateway_sessions_moved_percent_on_member_loss",
        "gateway_failover_error_percent",
        "scale_refresh_seconds_per_member_1000",
        "scale_refresh_growth_1000_vs_10",
        "scale_static_refresh_growth_1000_vs_10",
        "scale_calls_per_member_refresh_1000",
        "scale_listings_per_node_refresh_1000",
        "scale_calls_per_member_refresh_1000_vs_10",
        "scale_dials_per_refresh_1000",
        "scale_provider_peak_rss_mb_1000",
        "scale_state_bytes_per_member",
        "scale_program_seconds_1000",
        "scale_server_concurrency",
      ],
    );
    for (const candidate of GOALS) assert.ok(candidate.issue.length > 0, candidate.key);
  });

  it("the upload is held to the host's own CPU (≤ 1.10×) and our client to ≤ 1 ms per MiB", () => {
    const host = goal("upload_ratio_vs_host_cpu");
    assert.equal(evaluateGoal(host, figures({ upload_ratio_vs_host_cpu: 1.1 })).verdict, "met");
    assert.equal(
      evaluateGoal(host, figures({ upload_ratio_vs_host_cpu: 1.101 })).verdict,
      "missed",
    );
    assert.equal(evaluateGoal(host, figures({ upload_ratio_vs_host_cpu: 1.1 })).goal, "≤ 1.1");
    const client = goal("upload_ours_cpu_ms_per_mib");
    assert.equal(evaluateGoal(client, figures({ upload_ours_cpu_ms_per_mib: 1 })).verdict, "met");
    assert.equal(
      evaluateGoal(client, figures({ upload_ours_cpu_ms_per_mib: 1.5 })).verdict,
      "missed",
    );
  });

  it("the ratios to virsh and ssh cat, the host's CPU and the scale bench's explaining figures are information: no verdict, whatever the value", () => {
    for (const key of [
      "upload_time_ratio_vs_virsh",
      "upload_time_ratio_vs_ssh",
      "upload_host_cpu_ms",
      "gateway_rps_ratio_vs_direct_shared_cores",
      "scale_refresh_seconds_per_member_1000",
      "scale_program_seconds_1000",
      "scale_server_concurrency",
    ]) {
      assert.equal(goal(key).comparison.kind, "information", key);
      for (const value of [0.1, 0.6, 1000, Number.NaN])
        assert.deepEqual(evaluateGoal(goal(key), figures({ [key]: value })), {
          key,
          goal: "no goal (information)",
          issue: goal(key).issue,
          value,
          verdict: "info",
        });
      assert.equal(evaluateGoal(goal(key), figures({})).verdict, "info");
      assert.equal(evaluateGoal(goal(key), figures({})).value, undefined);
    }
    assert.equal(
      GOALS.filter((candidate) => candidate.comparison.kind === "information").length,
      7,
    );
  });

  it("a refresh of 1000 members dials each host at most 4 times (the client's bound): its dials are held to 4 × scale_hosts", () => {
    const dials = goal("scale_dials_per_refresh_1000");
    const run = (value: number) =>
      evaluateGoal(dials, figures({ scale_dials_per_refresh_1000: value, scale_hosts: 4 }));
    assert.equal(run(16).verdict, "met");
    assert.equal(run(17).verdict, "missed");
    assert.equal(run(16).goal, "≤ 4 × scale_hosts = 16");
    assert.equal(
      evaluateGoal(dials, figures({ scale_dials_per_refresh_1000: 4 })).verdict,
      "not run",
    );
  });

  it("node listings are held to one VM index and one seed listing per listing window the refresh spans", () => {
    const listings = goal("scale_listings_per_node_refresh_1000");
    const run = (value: number, windows: number) =>
      evaluateGoal(
        listings,
        figures({
          scale_listings_per_node_refresh_1000: value,
          scale_listing_windows_refresh_1000: windows,
        }),
      ).verdict;
    assert.equal(run(2, 1), "met");
    assert.equal(run(3, 1), "missed");
    assert.equal(run(4, 2), "met");
  });

  it("a prefix proxy meets its goal at 900 exit addresses per 1000 requests, not at 899", () => {
    const prefix = goal("prefix_exit_addresses_per_1000");
    assert.equal(
      evaluateGoal(prefix, figures({ prefix_exit_addresses_per_1000: 900 })).verdict,
      "met",
    );
    assert.equal(
      evaluateGoal(prefix, figures({ prefix_exit_addresses_per_1000: 899 })).verdict,
      "missed",
    );
  });

  it("an upper bound is met at the bound and missed above it", () => {
    const calls = goal("pve_api_calls_per_create");
    assert.equal(evaluateGoal(calls, figures({ pve_api_calls_per_create: 30 })).verdict, "met");
    assert.equal(evaluateGoal(calls, figures({ pve_api_calls_per_create: 31 })).verdict, "missed");
    assert.equal(
      evaluateGoal(
        goal("pve_parallel10_ratio_vs_one"),
        figures({ pve_parallel10_ratio_vs_one: 1.051 }),
      ).verdict,
      "missed",
    );
  });

  it("a lower bound is met at the bound and missed below it", () => {
    const seed = goal("seed_build_speedup_vs_genisoimage");
    assert.equal(
      evaluateGoal(seed, figures({ seed_build_speedup_vs_genisoimage: 20 })).verdict,
      "met",
    );
    assert.equal(
      evaluateGoal(seed, figures({ seed_build_speedup_vs_genisoimage: 19.99 })).verdict,
      "missed",
    );
  });

  it("check 200 is judged against three times check 1 of the same run", () => {
    const check = goal("check_200_proxies_seconds");
    const met = evaluateGoal(
      check,
      figures({ check_200_proxies_seconds: 2.4, check_1_proxy_seconds: 0.8 }),
    );
    assert.equal(met.verdict, "met");
    assert.equal(met.goal, "≤ 3 × check_1_proxy_seconds = 2.4");
    assert.equal(
      evaluateGoal(check, figures({ check_200_proxies_seconds: 2.5, check_1_proxy_seconds: 0.8 }))
        .verdict,
      "missed",
    );
  });

  it("the 2 GiB upload's peak RSS must lie within 10 % of the 512 MiB one's, either way", () => {
    const flat = goal("upload_2gib_peak_rss_mb");
    const verdict = (big: number) =>
      evaluateGoal(flat, figures({ upload_peak_rss_mb: 70, upload_2gib_peak_rss_mb: big })).verdict;
    assert.equal(verdict(77), "met");
    assert.equal(verdict(63), "met");
    assert.equal(verdict(77.5), "missed");
    assert.equal(verdict(62), "missed");
    assert.equal(
      evaluateGoal(flat, figures({ upload_peak_rss_mb: 70, upload_2gib_peak_rss_mb: 71 })).goal,
      "within 10 % of upload_peak_rss_mb = 63–77",
    );
  });

  it("a figure not measured, or one whose reference was not, is not run: never a pass", () => {
    assert.deepEqual(evaluateGoal(goal("create_rpc_count"), figures({})), {
      key: "create_rpc_count",
      goal: "≤ 13",
      issue: "create with ≤ 13 RPCs (preflight included)",
      verdict: "not run",
    });
    const alone = evaluateGoal(
      goal("check_200_proxies_seconds"),
      figures({ check_200_proxies_seconds: 1 }),
    );
    assert.equal(alone.verdict, "not run");
    assert.equal(alone.value, 1);
  });

  it("a figure that is no finite number misses its goal", () => {
    assert.equal(
      evaluateGoal(goal("upload_peak_rss_mb"), figures({ upload_peak_rss_mb: Number.NaN })).verdict,
      "missed",
    );
    assert.equal(
      evaluateGoal(
        goal("metadata_sweep_speedup_vs_virsh"),
        figures({ metadata_sweep_speedup_vs_virsh: Number.POSITIVE_INFINITY }),
      ).verdict,
      "missed",
    );
  });

  it("describes each kind of comparison", () => {
    assert.equal(describeComparison({ kind: "at most", limit: 0.5 }), "≤ 0.5");
    assert.equal(describeComparison({ kind: "at least", limit: 10 }), "≥ 10");
    assert.equal(
      describeComparison({ kind: "within", fraction: 0.1, of: "upload_peak_rss_mb" }),
      "within 10 % of upload_peak_rss_mb",
    );
    assert.equal(describeComparison({ kind: "information" }), "no goal (information)");
  });

  it("prints one row per goal with ✔, ✘, not run or · (information), and the count of each", () => {
    const table = formatGoalTable(
      evaluateGoals(
        figures({
          pve_api_calls_per_create: 28,
          pve_parallel10_ratio_vs_one: 1.2,
          upload_time_ratio_vs_virsh: 0.6,
        }),
      ),
    );
    const lines = table.split("\n");
    assert.equal(lines.length, GOALS.length + 3);
    assert.match(
      lines.find((line) => line.includes("pve_api_calls_per_create"))!,
      /^✔ .* 28 +≤ 30 /,
    );
    assert.match(
      lines.find((line) => line.includes("pve_parallel10_ratio"))!,
      /^✘ .* 1\.2 +≤ 1\.05 /,
    );
    assert.match(
      lines.find((line) => line.includes("reaper_sweep"))!,
      /^not run .* - +≤ 0\.5 /,
    );
    assert.match(
      lines.find((line) => line.includes("upload_time_ratio_vs_virsh"))!,
      /^· .* 0\.6 +no goal \(information\) /,
    );
    assert.equal(lines.at(-1), "# goals: 1 met, 1 missed, 27 not run; 7 for information, no goal");
  });
});

describe("bench arguments", () => {
  it("takes suites, and --node <major> (or --node=<major>) anywhere among them", () => {
    assert.deepEqual(parseBenchArgs([]), { suites: [] });
    assert.deepEqual(parseBenchArgs(["pve", "seed"]), { suites: ["pve", "seed"] });
    assert.deepEqual(parseBenchArgs(["--node", "22", "pve"]), { nodeMajor: 22, suites: ["pve"] });
    assert.deepEqual(parseBenchArgs(["seed", "--node=22"]), { nodeMajor: 22, suites: ["seed"] });
  });

  it("refuses a --node without a major, and unknown options, with the usage", () => {
    assert.throws(() => parseBenchArgs(["--node"]), /--node takes a Node\.js major version/);
    assert.throws(() => parseBenchArgs(["--node", "v22"]), /got v22/);
    assert.throws(() => parseBenchArgs(["--fast"]), /unknown option --fast \(usage: npm run bench/);
  });
});
