import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import {
  clockTicksPerSecond,
  descendantsOf,
  newDescendants,
  parseProcStat,
  processKey,
  readAllProcStats,
  readProcStat,
  sumTicks,
  ticksBetween,
  ticksToMs,
  type ProcStat,
} from "../bench/proc-cpu";

/** A /proc/<pid>/stat line as Linux writes it (52 fields), with the fields this module reads set. */
function statLine(stat: Partial<ProcStat> & { pid: number; comm: string }): string {
  const fields = [
    ...[stat.state ?? "S", stat.ppid ?? 1, 28092, 21806, 0, -1, 4194304, 101, 0, 0, 0],
    ...[stat.utime ?? 0, stat.stime ?? 0, stat.cutime ?? 0, stat.cstime ?? 0],
    ...[20, 0, 1, 0, stat.starttime ?? 56876, 3133440, 363, "18446744073709551615"],
    ...Array.from({ length: 27 }, () => 0),
  ];
  return `${stat.pid} (${stat.comm}) ${fields.join(" ")}\n`;
}

const stat = (pid: number, ppid: number, ticks: Partial<ProcStat> = {}): ProcStat => ({
  pid,
  comm: `p${pid}`,
  state: "S",
  ppid,
  utime: 0,
  stime: 0,
  cutime: 0,
  cstime: 0,
  starttime: 1000 + pid,
  ...ticks,
});

describe("bench /proc CPU: parsing /proc/<pid>/stat", () => {
  it("reads the PID, the name, the parent, the four times and the start time", () => {
    assert.deepEqual(
      parseProcStat(
        statLine({ pid: 5782, comm: "sshd", ppid: 1, utime: 47, stime: 3, cutime: 2, cstime: 1 }),
      ),
      {
        pid: 5782,
        comm: "sshd",
        state: "S",
        ppid: 1,
        utime: 47,
        stime: 3,
        cutime: 2,
        cstime: 1,
        starttime: 56876,
      },
    );
    const real =
      "1 (process_api) S 0 0 0 0 -1 4194560 21508 780351 0 176 56 331 30690 3200 10 -10 18 0 25 49999872 2857 18446744073709551615 1 1 0 0 0 0 0 4096 1256 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0";
    const parsed = parseProcStat(real);
    assert.deepEqual(
      [parsed.ppid, parsed.utime, parsed.stime, parsed.cutime, parsed.cstime, parsed.starttime],
      [0, 56, 331, 30690, 3200, 25],
    );
  });

  it("takes the name from the first ( to the last ), spaces and parentheses included", () => {
    for (const comm of ["sshd: root@notty", "a) b (c", ") S 99 (", "((x))", "x)", " "]) {
      const parsed = parseProcStat(statLine({ pid: 42, comm, ppid: 7, utime: 11, stime: 5 }));
      assert.equal(parsed.comm, comm);
      assert.equal(parsed.ppid, 7, comm);
      assert.equal(parsed.utime, 11, comm);
      assert.equal(parsed.stime, 5, comm);
    }
  });

  it("refuses what is no stat line, naming the field", () => {
    assert.throws(() => parseProcStat("nothing here"), /not a \/proc\/<pid>\/stat line/);
    assert.throws(() => parseProcStat("12 (x) S 1 2 3"), /field 14 is no integer/);
    assert.throws(() => parseProcStat(statLine({ pid: 0, comm: "x" })), /no PID/);
  });
});

describe("bench /proc CPU: summing a process tree", () => {
  //   1 ── 10 (listener) ── 11 (connection) ── 12 (its child) ── 13
  //   └── 20 (unrelated)    └── 14 (an older connection)
  const tree = [
    stat(1, 0),
    stat(10, 1),
    stat(11, 10, { utime: 40, stime: 7, cutime: 3 }),
    stat(12, 11, { utime: 5, cstime: 1 }),
    stat(13, 12, { stime: 2 }),
    stat(14, 10, { utime: 900 }),
    stat(20, 1, { utime: 1000 }),
  ];

  it("finds every process below the root, not the root or another branch", () => {
    assert.deepEqual(
      descendantsOf(10, tree)
        .map((process) => process.pid)
        .sort(),
      [11, 12, 13, 14],
    );
    assert.deepEqual(descendantsOf(13, tree), []);
  });

  it("counts only what appeared since the window opened, each one's own and waited-for time once", () => {
    const before = new Set([stat(14, 10)].map(processKey));
    const fresh = newDescendants(10, before, tree);
    assert.deepEqual(
      fresh.map((process) => process.pid),
      [11, 12, 13],
    );
    assert.equal(sumTicks(fresh), 40 + 7 + 3 + 5 + 1 + 2);
  });

  it("tells a reused PID from the process that had it before", () => {
    const before = new Set([processKey(stat(11, 10, { starttime: 5 }))]);
    assert.deepEqual(
      newDescendants(10, before, tree)
        .map((process) => process.pid)
        .sort(),
      [11, 12, 13, 14],
    );
  });

  it("takes a long-lived process's difference, and refuses one that was replaced", () => {
    const earlier = stat(30, 1, { utime: 100, stime: 20, cutime: 1 });
    const later = stat(30, 1, { utime: 145, stime: 31, cutime: 4 });
    assert.equal(ticksBetween(earlier, later), 45 + 11 + 3);
    assert.throws(
      () => ticksBetween(earlier, { ...later, starttime: 99_999 }),
      /process 30 \(p30\) was replaced/,
    );
  });
});

/**
 * Burns `ms` of this process's CPU, then prints its own CPU (process.cpuUsage, all of it since
 * it started) as `label=<ms>`.
 */
const burner = (ms: number, label: string) =>
  `const s = process.cpuUsage(); for (;;) { const u = process.cpuUsage(s); if ((u.user + u.system) / 1000 >= ${ms}) break; }
   const t = process.cpuUsage(); console.log("${label}=" + (t.user + t.system) / 1000);`;

describe("bench /proc CPU: a child burning CPU, measured from /proc", function () {
  this.timeout(60_000);

  it("finds the CPU of a child, of the grandchild it waited for and of one still running", async () => {
    assert.equal(ticksToMs(clockTicksPerSecond()), 1000);
    const before = new Set(descendantsOf(process.pid, readAllProcStats()).map(processKey));
    // The child: runs a grandchild to its end (spawnSync waits for it: its time goes to the child's
    // cutime), burns CPU itself, starts a second grandchild that burns and stays, then reports.
    const child = spawn(
      process.execPath,
      [
        "-e",
        `const { spawn, spawnSync } = require("node:child_process");
         const done = spawnSync(process.execPath, ["-e", ${JSON.stringify(burner(200, "done"))}], { encoding: "utf8" }).stdout;
         ${burner(200, "child")}
         const staying = spawn(process.execPath, ["-e", ${JSON.stringify(`${burner(200, "staying")} process.stdin.resume();`)}], { stdio: ["pipe", "pipe", "inherit"] });
         staying.stdout.once("data", (line) => {
           const t = process.cpuUsage();
           process.stdout.write(done + line + "child=" + (t.user + t.system) / 1000 + "\\nstaying_pid=" + staying.pid + "\\n");
         });
         process.stdin.on("end", () => staying.stdin.end());
         process.stdin.resume();`,
      ],
      { stdio: ["pipe", "pipe", "inherit"] },
    );
    const exited = new Promise((resolve) => child.once("exit", resolve));
    try {
      let output = "";
      await new Promise<void>((resolve, reject) => {
        child.stdout.on("data", (data: Buffer) => {
          output += data.toString();
          if (output.includes("staying_pid=") && output.endsWith("\n")) resolve();
        });
        child.once("exit", (code) => reject(new Error(`the child exited ${code}: ${output}`)));
      });
      const reported = Object.fromEntries(
        output
          .trim()
          .split("\n")
          .map((line) => line.split("=") as [string, string]),
      );
      const fresh = newDescendants(process.pid, before, readAllProcStats());
      assert.deepEqual(
        fresh.map((process) => process.pid).sort(),
        [child.pid, Number(reported.staying_pid)].sort(),
      );
      assert.equal(readProcStat(Number(reported.staying_pid))?.ppid, child.pid);
      const measured = ticksToMs(sumTicks(fresh));
      // What the three processes say they spent (the child's own figure without the grandchild
      // it waited for). /proc truncates each of its six times to a 10 ms tick (up to 60 ms short);
      // the finished grandchild spent a little more after it reported, while it exited.
      const expected = Number(reported.done) + Number(reported.child) + Number(reported.staying);
      assert.ok(expected >= 600, `the three burned ${expected} ms`);
      assert.ok(
        measured >= expected - 70 && measured <= expected + 60,
        `/proc says ${measured} ms, the processes say ${expected} ms (${output.trim().replaceAll("\n", ", ")})`,
      );
    } finally {
      child.stdin.end();
      await exited;
    }
  });
});
