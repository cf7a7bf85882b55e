/**
 * The real prefix dialer (workloads/prefix-dialer/dialer.py, run by the
 * system's python3) in a network namespace this test makes and removes: a
 * unique-local /64 routed `local` on the namespace's lo, ip_nonlocal_bind on,
 * an echo service on another address of the namespace that answers with the
 * caller's address. 1000 requests (plain HTTP and CONNECT) show one fresh
 * source address per connection in random mode; pool mode stays within its
 * count; sticky mode gives each credential (or client) one address. It also
 * prints what the dialer adds to a request's time, against a direct request
 * in the same namespace (not asserted: it depends on the machine).
 *
 * Nothing leaves the namespace: it has no link but lo. The namespace, and
 * every process in it, goes on success, failure and Ctrl-C.
 * test-needs: root (ip netns)
 */
import assert from "node:assert/strict";
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { BlockList } from "node:net";
import { join } from "node:path";
import { PREFIX_DIALER_PORT } from "../../workloads/prefix-egress";
import type { ProbeRequest, ProbeResult } from "../support/prefix-probe";

const REPOSITORY = join(__dirname, "..", "..", "..");
const DIALER = join(REPOSITORY, "workloads", "prefix-dialer", "dialer.py");
const PROBE = join(__dirname, "..", "support", "prefix-probe.js");
const NAMESPACE = `egress-prefix-${process.pid}`;
/** An IPv4-only destination inside the namespace (a documentation address: nothing outside sees it). */
const IPV4_ECHO = "192.0.2.1";

interface IpNetwork {
  address: string;
  length: number;
}

/** Every IPv6 network this machine routes or carries, in any table. */
function hostIpv6Networks(): IpNetwork[] {
  const json = (args: string[]) =>
    JSON.parse(execFileSync("ip", ["-j", "-6", ...args], { encoding: "utf8" }) || "[]") as Array<
      Record<string, unknown>
    >;
  const networks: IpNetwork[] = [];
  for (const route of json(["route", "show", "table", "all"])) {
    const dst = String(route.dst ?? "");
    if (dst === "" || dst === "default" || dst === "::/0") continue;
    const [address, length] = dst.split("/");
    networks.push({ address: address!, length: length === undefined ? 128 : Number(length) });
  }
  for (const link of json(["addr"]))
    for (const info of (link.addr_info ?? []) as Array<{ local: string; prefixlen: number }>)
      networks.push({ address: info.local, length: info.prefixlen });
  return networks;
}

/** A random unique-local /48 (RFC 4193: fd + 40 random bits) that overlaps none of `taken`. */
function freeUla48(taken: readonly IpNetwork[]): string {
  const holders = new BlockList();
  for (const network of taken) holders.addSubnet(network.address, network.length, "ipv6");
  for (let attempt = 0; attempt < 100; attempt++) {
    const bits = randomBytes(5).toString("hex");
    // Groups without leading zeros: the form addresses come back in (RFC 5952).
    const group = (hex: string) => parseInt(hex, 16).toString(16);
    const base = `fd${bits.slice(0, 2)}:${group(bits.slice(2, 6))}:${group(bits.slice(6, 10))}`;
    const candidate = new BlockList();
    candidate.addSubnet(`${base}::`, 48, "ipv6");
    // Overlap either way: a host network inside the candidate, or the candidate inside one.
    const collides =
      holders.check(`${base}::`, "ipv6") ||
      taken.some((network) => candidate.check(network.address, "ipv6"));
    if (!collides) return base;
  }
  throw new Error("no free unique-local /48 after 100 tries");
}

const inNamespace = (...args: string[]) =>
  execFileSync("ip", ["netns", "exec", NAMESPACE, ...args], { encoding: "utf8" });

/** Everything the test started, then the namespace; safe to call twice and from a signal. */
function removeNamespace(): void {
  let pids: string[] = [];
  try {
    pids = execFileSync("ip", ["netns", "pids", NAMESPACE], { encoding: "utf8" })
      .split("\n")
      .filter(Boolean);
  } catch {
    return; // no namespace: nothing to remove
  }
  // Only processes inside our own namespace: the dialer and the probe this test started.
  for (const pid of pids)
    try {
      process.kill(Number(pid), "SIGKILL");
    } catch {
      // already gone
    }
  execFileSync("ip", ["netns", "del", NAMESPACE]);
}

const onInterrupt = () => {
  removeNamespace();
  process.exit(130);
};

describe("prefix dialer in a network namespace", function () {
  this.timeout(180_000);
  let prefix: string; // e.g. fdxx:xxxx:xxxx:1::/64
  let prefixBase: string; // fdxx:xxxx:xxxx:1:
  let echoHost: string;
  let dialer: ChildProcess | undefined;

  before(() => {
    process.once("SIGINT", onInterrupt);
    process.once("SIGTERM", onInterrupt);
    const ula = freeUla48(hostIpv6Networks());
    prefixBase = `${ula}:1:`;
    prefix = `${ula}:1::/64`;
    echoHost = `${ula}:ffff::1`;
    execFileSync("ip", ["netns", "add", NAMESPACE]);
    execFileSync("ip", ["-n", NAMESPACE, "link", "set", "lo", "up"]);
    execFileSync("ip", ["-n", NAMESPACE, "addr", "add", `${echoHost}/128`, "dev", "lo"]);
    execFileSync("ip", ["-n", NAMESPACE, "addr", "add", `${IPV4_ECHO}/32`, "dev", "lo"]);
    // What the guest's route unit and sysctl file do: the whole prefix local, bindable.
    execFileSync("ip", ["-n", NAMESPACE, "-6", "route", "add", "local", prefix, "dev", "lo"]);
    inNamespace("sysctl", "-qw", "net.ipv6.ip_nonlocal_bind=1");
  });

  afterEach(() => stopDialer());

  after(() => {
    removeNamespace();
    process.removeListener("SIGINT", onInterrupt);
    process.removeListener("SIGTERM", onInterrupt);
  });

  async function startDialer(args: string[]): Promise<void> {
    const child = spawn(
      "ip",
      [
        "netns",
        "exec",
        NAMESPACE,
        "/usr/bin/python3",
        DIALER,
        "--prefix",
        prefix,
        "--listen",
        "127.0.0.1",
        "--port",
        String(PREFIX_DIALER_PORT),
        ...args,
      ],
      { stdio: ["ignore", "ignore", "pipe"] },
    );
    dialer = child;
    await new Promise<void>((resolve, reject) => {
      let said = "";
      const timer = setTimeout(() => reject(new Error(`dialer did not start: ${said}`)), 10_000);
      child.stderr!.setEncoding("utf8");
      child.stderr!.on("data", (chunk: string) => {
        said += chunk;
        if (/prefix dialer: \w+ mode over/.test(said)) {
          clearTimeout(timer);
          resolve();
        }
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`dialer exited ${code}: ${said}`));
      });
    });
  }

  /** Stops the dialer and waits for it, so the next one finds its port free. */
  async function stopDialer(): Promise<void> {
    const child = dialer;
    dialer = undefined;
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    // `ip netns exec` execs python in place: this PID is the dialer's own.
    child.kill("SIGTERM");
    await exited;
  }

  function probe(
    requests: ProbeRequest[],
    concurrency = 16,
    target = echoHost,
  ): Promise<ProbeResult> {
    const spec = { dialerPort: PREFIX_DIALER_PORT, echoHost: target, concurrency, requests };
    return new Promise((resolve, reject) => {
      const child = spawn(
        "ip",
        ["netns", "exec", NAMESPACE, process.execPath, PROBE, JSON.stringify(spec)],
        { stdio: ["ignore", "pipe", "pipe"] },
      );
      let out = "";
      let err = "";
      child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
      child.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
      child.once("exit", (code) =>
        code === 0
          ? resolve(JSON.parse(out) as ProbeResult)
          : reject(new Error(`probe exited ${code}: ${err}`)),
      );
    });
  }

  const inPrefix = (address: string) => address.startsWith(prefixBase);
  const half = (count: number, via: "http" | "connect", extra: Partial<ProbeRequest> = {}) =>
    Array.from({ length: count }, () => ({ via, ...extra }));

  it("random: 1000 requests (plain HTTP and CONNECT) leave from ≥ 900 distinct addresses of the prefix", async () => {
    await startDialer(["--mode", "random"]);
    const { sources } = await probe([...half(500, "http"), ...half(500, "connect")]);
    assert.equal(sources.length, 1000);
    const outside = sources.filter((source) => !inPrefix(source));
    assert.deepEqual(outside, [], "every source is an address of the prefix");
    const distinct = new Set(sources).size;
    console.log(`      prefix_exit_addresses_per_1000=${distinct}`);
    assert.ok(distinct >= 900, `${distinct} distinct source addresses`);
    // Both request kinds go through the prefix, not one of them only.
    assert.ok(new Set(sources.slice(0, 500)).size >= 450);
    assert.ok(new Set(sources.slice(500)).size >= 450);
  });

  it("pool: 400 requests stay within prefix+1 .. prefix+count", async () => {
    await startDialer(["--mode", "pool", "--count", "5"]);
    const { sources } = await probe([...half(200, "http"), ...half(200, "connect")]);
    const allowed = new Set([1, 2, 3, 4, 5].map((n) => `${prefixBase}:${n}`));
    const seen = new Set(sources);
    assert.ok(seen.size <= 5, [...seen].join(" "));
    assert.deepEqual(
      [...seen].filter((source) => !allowed.has(source)),
      [],
      "only the pool's addresses",
    );
    // 400 draws from 5 leave one out with probability ~5 * 0.8^400: they all show up.
    assert.equal(seen.size, 5, [...seen].join(" "));
  });

  it("sticky: each proxy user, and each client without one, keeps one address of its own", async () => {
    await startDialer(["--mode", "sticky"]);
    const users = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"];
    const clients = ["10.0.0.7", "10.0.0.8", "2001:db8::9"];
    const requests: ProbeRequest[] = [];
    for (let round = 0; round < 20; round++) {
      for (const user of users) requests.push({ via: round % 2 === 0 ? "http" : "connect", user });
      // A credential wins over the client header; the header wins over the peer address.
      for (const client of clients)
        requests.push({ via: round % 2 === 0 ? "connect" : "http", client });
      requests.push({ via: "http", user: "alice", client: "10.0.0.99" });
    }
    const { sources } = await probe(requests);
    const byKey = new Map<string, Set<string>>();
    requests.forEach((request, index) => {
      const key = request.user !== undefined ? `user ${request.user}` : `client ${request.client}`;
      if (!byKey.has(key)) byKey.set(key, new Set());
      byKey.get(key)!.add(sources[index]!);
    });
    for (const [key, addresses] of byKey)
      assert.equal(addresses.size, 1, `${key}: ${[...addresses].join(" ")}`);
    const addresses = [...byKey.values()].map((set) => [...set][0]!);
    assert.ok(addresses.every(inPrefix), addresses.join(" "));
    assert.equal(
      new Set(addresses).size,
      users.length + clients.length,
      "each key its own address",
    );

    // The mapping is stable across a restart of the dialer (same prefix, same user, same address).
    await stopDialer();
    await startDialer(["--mode", "sticky"]);
    const again = await probe([{ via: "connect", user: "alice" }], 1);
    assert.equal(again.sources[0], [...byKey.get("user alice")!][0]);
  });

  it("reaches an IPv4-only destination over IPv4, from the machine's own address", async () => {
    await startDialer(["--mode", "random"]);
    const { sources } = await probe([...half(10, "http"), ...half(10, "connect")], 4, IPV4_ECHO);
    // Inside the namespace the kernel's IPv4 source for a local destination is that address itself.
    assert.deepEqual(new Set(sources), new Set([IPV4_ECHO]));
  });

  it("prints the time the dialer adds to a request against a direct one (not asserted)", async () => {
    await startDialer(["--mode", "random"]);
    // Warm both paths, then sequential requests: each one's full time, connection set-up included.
    await probe(
      [...half(20, "http"), ...Array.from({ length: 20 }, () => ({ via: "direct" as const }))],
      4,
    );
    const direct = await probe(
      Array.from({ length: 200 }, () => ({ via: "direct" as const })),
      1,
    );
    const http = await probe(half(200, "http"), 1);
    const connect = await probe(half(200, "connect"), 1);
    const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1]!;
    const directMs = median(direct.elapsedMs);
    assert.ok(
      direct.sources.every((source) => source === echoHost),
      "direct requests skip the dialer",
    );
    console.log(
      `      median per request: direct ${directMs.toFixed(2)} ms, ` +
        `via dialer HTTP ${median(http.elapsedMs).toFixed(2)} ms (+${(median(http.elapsedMs) - directMs).toFixed(2)}), ` +
        `CONNECT ${median(connect.elapsedMs).toFixed(2)} ms (+${(median(connect.elapsedMs) - directMs).toFixed(2)})`,
    );
  });
});
