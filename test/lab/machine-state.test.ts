/**
 * The test command's before/after check (test/machine-state.sh) must be able
 * to fail: a link, a route, a namespace, a listening socket and a file left
 * behind on purpose are each reported, and once removed none of them is. And the labs' address picker (test/lab/free-subnet.py) never
 * takes a range this machine already routes: with a route claiming the range
 * it would pick, it picks another; the route stays. test-needs: root
 */
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import type { AddressInfo } from "node:net";
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

describe("the test command's before/after check (test-needs: root)", function () {
  this.timeout(60_000);
  let dir: string;
  const snapshot = (name: string) => {
    const file = join(dir, name);
    sh("bash", MACHINE_STATE, "snapshot", file, String(process.pid));
    return file;
  };

  before(() => {
    // Not under /tmp: the snapshots list /tmp, and these files are the test's own.
    mkdirSync(join(REPO, ".tmp"), { recursive: true });
    dir = mkdtempSync(join(REPO, ".tmp", "machine-state-test-"));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("reports a leaked link, route, namespace, listening socket and /tmp file, and nothing once they are gone", async () => {
    const before = snapshot("before");
    const leak = `eleak-${process.pid % 100000}`; // link names have at most 15 characters
    const tmpFile = join("/tmp", `egress-leak-${process.pid}`);
    const server = createServer();
    await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
    const port = (server.address() as AddressInfo).port;
    const claimed = `${pickFar()}.77`;
    try {
      sh("ip", "link", "add", leak, "type", "veth", "peer", "name", `${leak}p`);
      sh("ip", "route", "add", "blackhole", `${claimed}/32`);
      sh("ip", "netns", "add", leak);
      writeFileSync(tmpFile, "left behind\n");
      const during = snapshot("during");
      const result = diff(before, during);
      assert.equal(result.status, 1, "a difference fails the check");
      assert.match(result.output, new RegExp(`\\+ link ${leak} `));
      assert.ok(
        result.output.includes(`+ route4 blackhole ${claimed}`),
        `the route to ${claimed} is reported:\n${result.output}`,
      );
      assert.match(result.output, new RegExp(`\\+ netns ${leak}$`, "m"));
      assert.match(result.output, new RegExp(`\\+ listen tcp 127\\.0\\.0\\.1:${port}$`, "m"));
      assert.match(result.output, new RegExp(`\\+ file ${tmpFile} f`));
    } finally {
      await new Promise((done) => server.close(done));
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
    for (const gone of [leak, `blackhole ${claimed}`, `127.0.0.1:${port}`, tmpFile])
      assert.ok(!result.output.includes(gone), `${gone} is still reported:\n${result.output}`);
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
