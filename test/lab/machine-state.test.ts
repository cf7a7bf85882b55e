/**
 * The test command's before/after check (test/machine-state.sh) must be able
 * to fail, and fail only on what the run made and did not undo: a link, a
 * route, a namespace, a /tmp/egress- file, a process of the run and the socket
 * it listens on, each left behind on purpose, are reported, and once removed
 * none of them is; /tmp entries of other names, whoever makes or removes them,
 * and other programs' processes (an sshd, a sleep) are not held against the
 * run. And the labs' address picker (test/lab/free-subnet.py) never takes a
 * range this machine already routes: with a route claiming the range it would
 * pick, it picks another; the route stays. test-needs: root
 */
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";

const REPO = resolve(__dirname, "..", "..", "..");
const MACHINE_STATE = join(REPO, "test", "machine-state.sh");
const FREE_SUBNET = join(REPO, "test", "lab", "free-subnet.py");

/**
 * These tests claim ranges with routes of their own while other suites run. The regular lab routes its
 * /24 into this namespace only once a suite links to it (host-link.sh), so until then the picker sees
 * that /24 as free, and a claim on it would make the link refuse (as it must: the range is routed
 * elsewhere). So the claims come from the far end of the picker's list, which a lab reaches only when
 * forty ranges before it are taken, and never from a /24 a lab of this run has written down.
 */
const FAR_CANDIDATES = ["192.168.254", "192.168.253", "172.31.248", "172.31.217"];
function labSubnetsOfThisRun(): string[] {
  return ["/tmp/egress-lab", "/tmp/egress-stock-lab", "/tmp/egress-reboot-host"].flatMap((dir) => {
    try {
      return [`${readFileSync(join(dir, "subnet"), "utf8").trim()}.0/24`];
    } catch {
      return []; // that lab is not up
    }
  });
}
function pickFar(): string {
  const args = ["--candidates", FAR_CANDIDATES.join(" ")];
  for (const cidr of labSubnetsOfThisRun()) args.push("--exclude", cidr);
  return sh("/usr/bin/python3", FREE_SUBNET, ...args).trim();
}

function sh(command: string, ...args: string[]): string {
  return execFileSync(command, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

/** machine-state.sh diff: exit status and output. */
function diff(before: string, after: string): { status: number; output: string } {
  const result = spawnSync("bash", [MACHINE_STATE, "diff", before, after], { encoding: "utf8" });
  return { status: result.status ?? -1, output: result.stdout + result.stderr };
}

/** The changes the diff holds against the run, and those it prints as other programs'. */
function verdicts(output: string): { run: string[]; ignored: string[] } {
  const run: string[] = [];
  const ignored: string[] = [];
  let block: string[] | undefined;
  for (const line of output.split("\n")) {
    if (line.startsWith("[machine-state] ignored")) block = ignored;
    else if (line.startsWith("[machine-state] the run changed")) block = run;
    else if (line.startsWith("[machine-state]")) block = undefined;
    else if (line.trim() !== "") block?.push(line.trim());
  }
  return { run, ignored };
}

/** This environment without the runner's EGRESS_TEST_RUN (mocha inherits it in a full run), plus `extra`. */
function otherEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.EGRESS_TEST_RUN;
  return { ...env, ...extra };
}

/** The parent of `pid`, read from /proc (undefined once it is gone). */
function parentOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
  } catch {
    return undefined;
  }
}

/**
 * Starts `command` outside this process's tree (the snapshots leave the caller's tree out, so a child of
 * mocha would never be seen): bash starts it through setsid in the background and exits at once, so it is
 * handed to the machine's reaper. Its PID, once checked to be no descendant of this process.
 */
function startDetached(env: NodeJS.ProcessEnv, command: string, ...args: string[]): number {
  const pid = Number(
    execFileSync(
      "bash",
      ["-c", 'setsid "$@" </dev/null >/dev/null 2>&1 & echo $!', "detach", command, ...args],
      { encoding: "utf8", env },
    ).trim(),
  );
  for (
    let up: number | undefined = pid, hops = 0;
    up !== undefined && up > 1 && hops < 64;
    hops++
  ) {
    up = parentOf(up);
    assert.notEqual(up, process.pid, `${command} (${pid}) must not descend from mocha`);
  }
  return pid;
}

function kill(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // already gone
  }
}

async function waitFor<T>(what: string, probe: () => T | undefined): Promise<T> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const value = probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await new Promise((done) => setTimeout(done, 50));
  }
}

/** Gone, or a zombie its new parent has not reaped yet (neither is a running process). */
const ended = (pid: number) => {
  try {
    return /^\S+ \(.*\) Z /.test(readFileSync(`/proc/${pid}/stat`, "utf8")) || undefined;
  } catch {
    return true;
  }
};

/**
 * A process that sleeps two minutes (so one a failed test could not kill ends on its own), started
 * detached. With COMM it renames itself (an "sshd" as a login would start); with LISTEN it listens on a
 * free port of 127.0.0.1; with CHILD it starts a sleep with an empty environment (as sshd's sessions carry
 * nothing of their listener's). It writes {port, child} to READY once all that is done.
 * Nothing about it is on its command line but what `args` adds.
 */
const HELPER = `
import json, os, socket, subprocess, time
info = {}
if os.environ.get("COMM"):
    with open("/proc/self/comm", "w") as comm:
        comm.write(os.environ["COMM"])
if os.environ.get("LISTEN"):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    info["port"] = server.getsockname()[1]
if os.environ.get("CHILD"):
    info["child"] = subprocess.Popen(["/usr/bin/sleep", "120"], env={}).pid
with open(os.environ["READY"] + ".part", "w") as ready:
    json.dump(info, ready)
os.rename(os.environ["READY"] + ".part", os.environ["READY"])
time.sleep(120)
`;

describe("the test command's before/after check (test-needs: root)", function () {
  this.timeout(60_000);
  /** The run these snapshots are for: its processes carry EGRESS_TEST_RUN=<this>. */
  const RUN = `machine-state-test-${process.pid}`;
  let dir: string;
  let serial = 0;
  const snapshot = (name: string) => {
    const file = join(dir, name);
    sh("bash", MACHINE_STATE, "snapshot", file, String(process.pid), RUN);
    return file;
  };
  /**
   * The diff of two snapshots cut down to the lines `mine` picks: the labs and suites of a full run
   * come and go beside this one, so its exit status says something about this test's changes only so.
   */
  const diffOf = (before: string, after: string, mine: (line: string) => boolean) => {
    const cut = (file: string) => {
      const copy = join(dir, `cut-${serial++}`);
      const lines = readFileSync(file, "utf8").split("\n").filter(mine);
      writeFileSync(copy, lines.map((line) => `${line}\n`).join(""));
      return copy;
    };
    return diff(cut(before), cut(after));
  };
  const naming =
    (...names: string[]) =>
    (line: string) =>
      names.some((name) => line.includes(name));

  /** A detached HELPER with the given environment and extra command-line arguments; its READY record. */
  const helper = async (env: NodeJS.ProcessEnv, ...args: string[]) => {
    const ready = join(dir, `ready-${serial++}`);
    const pid = startDetached({ ...env, READY: ready }, "/usr/bin/python3", "-c", HELPER, ...args);
    started.push(pid);
    const info = await waitFor(`process ${pid} to be ready`, () =>
      existsSync(ready)
        ? (JSON.parse(readFileSync(ready, "utf8")) as { port?: number; child?: number })
        : undefined,
    );
    if (info.child !== undefined) started.push(info.child);
    return { pid, ...info };
  };
  let started: number[] = [];

  before(() => {
    // Not under /tmp: the snapshots list /tmp, and these files are the test's own.
    mkdirSync(join(REPO, ".tmp"), { recursive: true });
    dir = mkdtempSync(join(REPO, ".tmp", "machine-state-test-"));
  });
  afterEach(() => {
    for (const pid of started) kill(pid);
    started = [];
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("reports a leaked link, route, namespace and /tmp/egress- file, and nothing once they are gone", () => {
    const before = snapshot("before");
    const leak = `eleak-${process.pid % 100000}`; // link names have at most 15 characters
    const tmpFile = join("/tmp", `egress-leak-${process.pid}`);
    const claimed = `${pickFar()}.77`;
    try {
      sh("ip", "link", "add", leak, "type", "veth", "peer", "name", `${leak}p`);
      sh("ip", "route", "add", "blackhole", `${claimed}/32`);
      sh("ip", "netns", "add", leak);
      writeFileSync(tmpFile, "left behind\n");
      const during = snapshot("during");
      const result = diff(before, during);
      assert.equal(result.status, 1, "a difference fails the check");
      const { run } = verdicts(result.output);
      assert.ok(
        run.some((line) => line.startsWith(`+ link ${leak} `)),
        result.output,
      );
      assert.ok(run.includes(`+ route4 blackhole ${claimed}`), result.output);
      assert.ok(run.includes(`+ netns ${leak}`), result.output);
      assert.ok(run.includes(`+ file ${tmpFile} f`), result.output);
    } finally {
      rmSync(tmpFile, { force: true });
      execFileSync("bash", [
        "-c",
        `ip link del "$0"; ip route del blackhole "$1/32"; ip netns del "$0"; true`,
        leak,
        claimed,
      ]);
    }
    // Other suites of the run may come and go meanwhile: only this test's leaks are looked for.
    const result = diff(before, snapshot("after"));
    for (const gone of [leak, `blackhole ${claimed}`, tmpFile])
      assert.ok(!result.output.includes(gone), `${gone} is still reported:\n${result.output}`);
  });

  describe("/tmp: only a new egress- entry is the run's", () => {
    const other = (script: string, ...args: string[]) =>
      execFileSync("sh", ["-c", script, "other", ...args], { env: otherEnv() });

    it("a /tmp file another process removes during the run is printed as ignored, not a failure", () => {
      const gone = `/tmp/ms-gone-${process.pid}`;
      const goneOurs = `/tmp/egress-ms-gone-${process.pid}`;
      writeFileSync(gone, "there before the run\n");
      writeFileSync(goneOurs, "there before the run\n");
      try {
        const before = snapshot("tmp-gone-before");
        other('rm "$1" "$2"', gone, goneOurs);
        const after = snapshot("tmp-gone-after");
        const { ignored, run } = verdicts(diff(before, after).output);
        assert.ok(ignored.includes(`- file ${gone} f`), ignored.join("\n"));
        assert.ok(ignored.includes(`- file ${goneOurs} f`), ignored.join("\n"));
        assert.ok(!run.some(naming(gone, goneOurs)), run.join("\n"));
        assert.equal(diffOf(before, after, naming(gone, goneOurs)).status, 0);
      } finally {
        rmSync(gone, { force: true });
        rmSync(goneOurs, { force: true });
      }
    });

    it("a /tmp file another process makes and removes during the run is no failure", () => {
      const passing = `/tmp/ms-passing-${process.pid}`;
      const passingOurs = `/tmp/egress-ms-passing-${process.pid}`;
      try {
        const before = snapshot("tmp-passing-before");
        other(': >"$1"; : >"$2"', passing, passingOurs);
        const during = snapshot("tmp-passing-during");
        // Seen while it is there (so the snapshot does list it)...
        assert.match(readFileSync(during, "utf8"), new RegExp(`^file ${passingOurs} f$`, "m"));
        other('rm "$1" "$2"', passing, passingOurs);
        // ...and not at all once it is gone.
        const result = diff(before, snapshot("tmp-passing-after"));
        assert.ok(!naming(passing, passingOurs)(result.output), result.output);
      } finally {
        rmSync(passing, { force: true });
        rmSync(passingOurs, { force: true });
      }
    });

    it("a /tmp file of another name left by another process is printed as ignored, not a failure", () => {
      const left = `/tmp/ms-left-${process.pid}`;
      try {
        const before = snapshot("tmp-left-before");
        other(': >"$1"', left);
        const after = snapshot("tmp-left-after");
        const { ignored, run } = verdicts(diff(before, after).output);
        assert.ok(ignored.includes(`+ file ${left} f`), ignored.join("\n"));
        assert.ok(!run.some(naming(left)), run.join("\n"));
        assert.equal(diffOf(before, after, naming(left)).status, 0);
      } finally {
        rmSync(left, { force: true });
      }
    });

    it("a /tmp/egress- file left behind fails the check, named", () => {
      const left = `/tmp/egress-ms-left-${process.pid}`;
      const dirLeft = `/tmp/egress-ms-dir-${process.pid}`;
      try {
        const before = snapshot("tmp-ours-before");
        other(': >"$1"; mkdir "$2"', left, dirLeft);
        const after = snapshot("tmp-ours-after");
        const result = diff(before, after);
        assert.equal(result.status, 1, result.output);
        const { run } = verdicts(result.output);
        assert.ok(run.includes(`+ file ${left} f`), result.output);
        assert.ok(run.includes(`+ file ${dirLeft} d`), result.output);
        assert.equal(diffOf(before, after, naming(left)).status, 1);
      } finally {
        rmSync(left, { force: true });
        rmSync(dirLeft, { recursive: true, force: true });
      }
    });
  });

  it("reports the run's processes left running and the sockets they listen on, not other programs', and not once they are gone", async () => {
    const before = snapshot("processes-before");
    // The run's: one carrying the run's EGRESS_TEST_RUN, listening, with a child that carries nothing
    // (as sshd's sessions)...
    const daemon = await helper(otherEnv({ EGRESS_TEST_RUN: RUN, LISTEN: "1", CHILD: "1" }));
    // ...and one that carries nothing but names a lab file on its command line (as libvirtd's qemu).
    const qemu = await helper(otherEnv(), `/tmp/egress-ms-disk-${process.pid}.qcow2`);
    // Not the run's: an "sshd" (a contributor's login), a listener, a sleep, and a process of another run.
    const sshd = await helper(otherEnv({ COMM: "sshd" }));
    const listener = await helper(otherEnv({ LISTEN: "1" }));
    const sleep = startDetached(otherEnv(), "/usr/bin/sleep", "120");
    started.push(sleep);
    const otherRun = await helper(otherEnv({ EGRESS_TEST_RUN: `${RUN}-other` }));
    assert.equal(readFileSync(`/proc/${sshd.pid}/comm`, "utf8").trim(), "sshd");
    assert.ok(
      daemon.port !== undefined && daemon.child !== undefined && listener.port !== undefined,
    );

    // A snapshot's line or a diff's (with its sign) about that process or socket.
    const processLine = (pid: number) => (line: string) =>
      new RegExp(`^(?:[-+] )?process \\S+ ${pid} `).test(line);
    const listenLine = (port: number) => (line: string) =>
      new RegExp(`^(?:[-+] )?listen tcp 127\\.0\\.0\\.1:${port}$`).test(line);
    const during = snapshot("processes-during");
    const result = diff(before, during);
    assert.equal(result.status, 1, result.output);
    const { run } = verdicts(result.output);
    const ours = {
      "the process carrying EGRESS_TEST_RUN": processLine(daemon.pid),
      "its child with an empty environment": processLine(daemon.child),
      "the process naming /tmp/egress- on its command line": processLine(qemu.pid),
      "the socket the run's process listens on": listenLine(daemon.port),
    };
    for (const [what, pick] of Object.entries(ours))
      assert.ok(
        run.some((line) => line.startsWith("+ ") && pick(line)),
        `${what} is reported:\n${result.output}`,
      );
    const lines = result.output.split("\n").map((line) => line.trim());
    for (const [what, pick] of [
      ["the sshd", processLine(sshd.pid)],
      ["the other listener", processLine(listener.pid)],
      ["its socket", listenLine(listener.port)],
      ["the sleep", processLine(sleep)],
      ["the other run's process", processLine(otherRun.pid)],
    ] as const)
      assert.ok(!lines.some(pick), `${what} is not the run's:\n${result.output}`);

    // Once stopped, the run's processes and socket are gone: printed as ignored, no failure.
    for (const pid of started) kill(pid);
    for (const pid of started) await waitFor(`process ${pid} to end`, () => ended(pid));
    const after = snapshot("processes-after");
    const gone = diff(during, after);
    const { ignored } = verdicts(gone.output);
    for (const [what, pick] of Object.entries(ours))
      assert.ok(
        ignored.some((line) => line.startsWith("- ") && pick(line)),
        `${what}, gone, is ignored:\n${gone.output}`,
      );
    const picks = Object.values(ours);
    assert.equal(diffOf(during, after, (line) => picks.some((pick) => pick(line))).status, 0);
  });
});

describe("the labs' address picker (test-needs: root)", () => {
  const pick = (...args: string[]) => sh("/usr/bin/python3", FREE_SUBNET, ...args).trim();

  it("skips a range this machine already routes, and leaves that route alone", () => {
    const usual = pickFar();
    assert.match(usual, /^\d+\.\d+\.\d+$/);
    sh("ip", "route", "add", "blackhole", `${usual}.0/24`);
    try {
      const picked = pickFar();
      assert.notEqual(picked, usual, `${usual}.0/24 is routed now and must not be taken`);
      assert.match(sh("ip", "-4", "route", "show", `${usual}.0/24`), /blackhole/);
    } finally {
      sh("ip", "route", "del", "blackhole", `${usual}.0/24`);
    }
  });

  it("skips the ranges of the machine's own addresses, its resolvers and the package registry", () => {
    const prefix = (address: string | undefined) =>
      /^(\d+\.\d+\.\d+)\.\d+$/.exec(address ?? "")?.[1];
    const own = /inet (\d+\.\d+\.\d+\.\d+)/.exec(
      sh("ip", "-4", "-o", "addr", "show", "scope", "global"),
    )?.[1];
    const resolver = /^nameserver\s+(\d+\.\d+\.\d+\.\d+)/m.exec(
      readFileSync("/etc/resolv.conf", "utf8"),
    )?.[1];
    const registry = /^(\d+\.\d+\.\d+\.\d+)/.exec(
      spawnSync("getent", ["ahostsv4", "registry.npmjs.org"], { encoding: "utf8" }).stdout,
    )?.[1];
    const taken = [own, resolver, registry].map(prefix).filter((p): p is string => p !== undefined);
    assert.ok(
      taken.length > 0,
      "this machine has an IPv4 address, a resolver or a registry to avoid",
    );
    const picked = pick("--candidates", [...taken, "127.0.0", "198.18.17", "198.18.34"].join(" "));
    assert.ok(!taken.includes(picked), `${picked} is in use on this machine (${taken.join(", ")})`);
    assert.ok(!picked.startsWith("127."), "loopback is never a lab range");
  });

  it("fails with the reason when every candidate is taken", () => {
    let error: { status?: number; stderr?: string } | undefined;
    try {
      sh(
        "/usr/bin/python3",
        FREE_SUBNET,
        "--candidates",
        "127.0.0",
        "--exclude",
        "198.51.100.0/24",
      );
    } catch (e) {
      error = e as { status?: number; stderr?: string };
    }
    assert.equal(error?.status, 1);
    assert.match(String(error?.stderr), /127\.0\.0\.0\/24: route 127\.0\.0\.0\/8/);
  });
});
