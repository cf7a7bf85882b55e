/**
 * A gateway and its members on real squid (the Debian package), in a network
 * namespace the test makes and removes: it has no link but lo, so nothing
 * leaves it and no address of the machine is claimed. Inside:
 * - members: squids on 127.0.1.<i>:3128 with the pool's own member
 *   configuration (basic auth), each leaving from 127.0.2.<i>, its "exit
 *   address";
 * - an echo service on 127.0.3.1:8080 that answers with the caller's address;
 * - the gateway: the configuration the pool generates, run by the pod's own
 *   entrypoint (squid in the foreground, reloaded in place when its files
 *   change), listening on every address of the namespace (IPv4 and ::1).
 * Clients run inside too (gateway-probe.ts). Everything goes on close(), on
 * failure and on Ctrl-C: the processes in the namespace, the namespace, the
 * directory.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { squidConfig } from "../../workloads/squid-cloud-init";
import { htpasswdLine } from "../../workloads/password-hash";
import { gatewayFiles, type GatewayMember } from "../../workloads/gateway/squid-gateway";
import { gatewayEntrypointScript } from "../../workloads/gateway/pod";
import type { GatewayProbeRequest, ProbeCall, ProbeOutcome } from "./gateway-probe";

export const GATEWAY_PORT = 3130;
export const ECHO_TARGET = "127.0.3.1:8080";
/** The members' password: every character squid's login= must carry through escaped. */
export const MEMBER_LOGIN = { user: "member", password: "m3mber pass:%word@x" };
export const GATEWAY_USER = { name: "crawler", password: "crawler-password-1" };
const PROBE = join(__dirname, "gateway-probe.js");

export const exitOf = (index: number): string => `127.0.2.${index}`;
export const memberName = (index: number): string => `m${index}-0`;

let instances = 0;

export class GatewayNetns {
  readonly namespace = `egress-gw-${process.pid}`;
  /**
   * Directly under /tmp, not under $TMPDIR: squid drops to its own user
   * ("proxy"), which must reach its configuration, logs and pid file, and the
   * test command's $TMPDIR is a directory of mode 0700. The name starts with
   * egress- (what the machine-state check holds the run to removing).
   */
  readonly dir = mkdtempSync("/tmp/egress-gateway-");
  /**
   * squid names its shared memory in /dev/shm after its service name (`-n`):
   * one of ours per squid, so that no two share segments (nor with a squid of
   * the machine's) and close() removes what a killed squid could not.
   */
  private readonly servicePrefix = `egw${process.pid}x${++instances}`;
  private readonly members = new Map<number, ChildProcess>();
  private gateway: ChildProcess | undefined;
  private gatewayOutput = "";
  private readonly onSignal = () => {
    this.close();
    process.exit(130);
  };
  /** Whoever ends the process (another suite's signal handler, mocha's --exit), this goes with it. */
  private readonly onExit = () => this.close();

  constructor() {
    process.once("SIGINT", this.onSignal);
    process.once("SIGTERM", this.onSignal);
    process.once("exit", this.onExit);
    chmodSync(this.dir, 0o755);
    execFileSync("ip", ["netns", "add", this.namespace]);
    execFileSync("ip", ["-n", this.namespace, "link", "set", "lo", "up"]);
    this.spawnIn(process.execPath, [
      "-e",
      `require("http").createServer((q, s) => s.end(q.socket.remoteAddress)).listen(8080, "127.0.3.1")`,
    ]);
  }

  private spawnIn(command: string, args: string[]): ChildProcess {
    const child = spawn("ip", ["netns", "exec", this.namespace, command, ...args], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    child.stdout!.resume();
    child.stderr!.resume();
    return child;
  }

  /** A directory squid's unprivileged user ("proxy") can write. */
  private squidDir(name: string): string {
    const dir = join(this.dir, name);
    mkdirSync(dir, { recursive: true });
    chmodSync(dir, 0o777);
    return dir;
  }

  /** Member i: the pool's member configuration, on its own address, leaving from its own. */
  startMember(index: number): void {
    const dir = this.squidDir(memberName(index));
    const passwords = join(dir, "passwords");
    writeFileSync(passwords, htpasswdLine(MEMBER_LOGIN.user, MEMBER_LOGIN.password) + "\n");
    const config = squidConfig({
      port: 3128,
      allowedClientCidrs: ["127.0.0.0/8"],
      basicAuth: MEMBER_LOGIN,
      extraConfigLines: [],
    })
      .replace(/^http_port 3128$/m, `http_port 127.0.1.${index}:3128`)
      .replace(/\/etc\/squid\/egress-proxies\.htpasswd/, passwords);
    writeFileSync(
      join(dir, "squid.conf"),
      config +
        [
          `pid_filename ${dir}/squid.pid`,
          `cache_log ${dir}/cache.log`,
          `access_log stdio:${dir}/access.log`,
          `tcp_outgoing_address ${exitOf(index)}`,
          "",
        ].join("\n"),
    );
    this.members.set(
      index,
      this.spawnIn("squid", [
        "-N",
        "-n",
        `${this.servicePrefix}m${index}`,
        "-f",
        join(dir, "squid.conf"),
      ]),
    );
  }

  /** SIGKILL: the member's squid is gone at once, as in a crash. */
  killMember(index: number): void {
    this.members.get(index)?.kill("SIGKILL");
    this.members.delete(index);
  }

  /**
   * Requests member i's squid logged (what reached it, through the gateway or
   * not). Not the connections that carried none: the gateway's probes of a
   * member it counts dead, which squid logs as transaction-end-before-headers.
   */
  memberRequests(index: number): number {
    try {
      return readFileSync(join(this.dir, memberName(index), "access.log"), "utf8")
        .split("\n")
        .filter((line) => line !== "" && !line.includes("error:transaction-end-before-headers"))
        .length;
    } catch {
      return 0;
    }
  }

  /**
   * Every member's count once their logs are still: a member logs a request
   * when its transaction ends, which can be just after the client has its answer.
   */
  async settledMemberRequests(indices: readonly number[]): Promise<number[]> {
    let last = indices.map((index) => this.memberRequests(index));
    for (;;) {
      await new Promise((wake) => setTimeout(wake, 300));
      const now = indices.map((index) => this.memberRequests(index));
      if (now.every((count, at) => count === last[at])) return now;
      last = now;
    }
  }

  /** The gateway's member entry for member i, labelled as the pool labels it. */
  static member(index: number, labels: string[]): GatewayMember {
    return {
      name: memberName(index),
      address: `127.0.1.${index}`,
      port: 3128,
      labels,
      login: MEMBER_LOGIN,
    };
  }

  /**
   * Writes the gateway's files for these members; the first call starts the
   * pod's entrypoint, later ones are picked up by its reload loop. With
   * `metricsUdp`, squid also sends each log line to that host:port.
   */
  writeGateway(members: GatewayMember[], options: { metricsUdp?: string } = {}): void {
    const dir = this.squidDir("gateway");
    const files = gatewayFiles({
      port: GATEWAY_PORT,
      allowedClientCidrs: ["127.0.0.0/8", "::1/128"],
      users: [GATEWAY_USER],
      members,
      paths: {
        configDir: dir,
        accessLog: `stdio:${dir}/access.log`,
        cacheLog: `${dir}/cache.log`,
        pidFile: `${dir}/squid.pid`,
        ...(options.metricsUdp === undefined ? {} : { metricsUdp: options.metricsUdp }),
      },
    });
    for (const file of [files.users, files.authHelper, files.config])
      writeFileSync(file.path, file.content, { mode: 0o644 });
    if (this.gateway !== undefined) return;
    this.gateway = this.spawnIn("sh", [
      "-c",
      gatewayEntrypointScript(dir, `${this.servicePrefix}gw`),
    ]);
    this.gateway.stdout!.on("data", (chunk: Buffer) => (this.gatewayOutput += chunk.toString()));
    this.gateway.stderr!.on("data", (chunk: Buffer) => (this.gatewayOutput += chunk.toString()));
  }

  /** What the gateway's entrypoint printed (its reloads and refusals). */
  get gatewayLog(): string {
    return this.gatewayOutput;
  }

  /** The gateway squid's own log (dead and revived members). */
  gatewayCacheLog(): string {
    try {
      return readFileSync(join(this.dir, "gateway", "cache.log"), "utf8");
    } catch {
      return "";
    }
  }

  /** The gateway's access-log lines of one user (what it routed where), for a failure's message. */
  gatewayAccessLines(user: string): string[] {
    try {
      return readFileSync(join(this.dir, "gateway", "access.log"), "utf8")
        .split("\n")
        .filter((line) => line.split(" ")[3] === user);
    } catch {
      return [];
    }
  }

  /** The gateway squid's process id, from its pid file. */
  gatewayPid(): number {
    return Number(readFileSync(join(this.dir, "gateway", "squid.pid"), "utf8").trim());
  }

  /** Waits until something listens on each host:port in the namespace. */
  async waitForListeners(endpoints: string[], timeoutMs = 60_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const listening = execFileSync("ip", ["netns", "exec", this.namespace, "ss", "-Hltn"], {
        encoding: "utf8",
      });
      const missing = endpoints.filter(
        (endpoint) => !listening.split("\n").some((line) => line.split(/\s+/)[3] === endpoint),
      );
      if (missing.length === 0) return;
      if (Date.now() > deadline)
        throw new Error(
          `nothing listens on ${missing.join(", ")} after ${timeoutMs} ms:\n${listening}`,
        );
      await new Promise((wake) => setTimeout(wake, 100));
    }
  }

  /**
   * Waits until the gateway's entrypoint says it reloaded `count` times in
   * all, and squid has finished each (it accepts connections again). A
   * request squid is routing at the moment of a reload fails (502): what a
   * reload costs is measured apart (the bench), not mixed into routing.
   */
  async waitForReloads(count: number, timeoutMs = 60_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    const occurrences = (text: string, pattern: RegExp) => (text.match(pattern) ?? []).length;
    while (
      occurrences(this.gatewayOutput, /reloaded in place/g) < count ||
      occurrences(this.gatewayCacheLog(), /Reconfiguring Squid Cache/g) < count ||
      occurrences(this.gatewayCacheLog(), /Accepting HTTP Socket connections/g) < count + 1
    ) {
      if (Date.now() > deadline)
        throw new Error(
          `the gateway did not reload (${count}) within ${timeoutMs} ms:\n${this.gatewayOutput}`,
        );
      await new Promise((wake) => setTimeout(wake, 100));
    }
  }

  /**
   * Starts a long-running command in the namespace (a service under test);
   * close() ends it with everything else there. What it prints is kept.
   */
  startIn(command: string, args: string[]): { process: ChildProcess; output: () => string } {
    const child = this.spawnIn(command, args);
    let output = "";
    child.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()));
    child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()));
    return { process: child, output: () => output };
  }

  /** Runs a command in the namespace to its end, within `timeoutMs`; its stdout. */
  runIn(command: string, args: string[], timeoutMs = 10_000): string {
    return execFileSync("ip", ["netns", "exec", this.namespace, command, ...args], {
      encoding: "utf8",
      timeout: timeoutMs,
    });
  }

  /** Runs the client in the namespace. */
  probe(calls: ProbeCall[], options: Partial<GatewayProbeRequest> = {}): Promise<ProbeOutcome[]> {
    const request: GatewayProbeRequest = {
      proxy: { host: "127.0.0.10", port: GATEWAY_PORT },
      target: ECHO_TARGET,
      concurrency: 8,
      ...options,
      calls,
    };
    return new Promise((resolve, reject) => {
      const child = spawn("ip", ["netns", "exec", this.namespace, process.execPath, PROBE], {
        stdio: ["pipe", "pipe", "pipe"],
      });
      child.stdin!.end(JSON.stringify(request));
      let out = "";
      let err = "";
      child.stdout!.on("data", (chunk: Buffer) => (out += chunk.toString()));
      child.stderr!.on("data", (chunk: Buffer) => (err += chunk.toString()));
      child.on("exit", (code) =>
        code === 0
          ? resolve(JSON.parse(out) as ProbeOutcome[])
          : reject(new Error(`probe exited ${code}: ${err}`)),
      );
    });
  }

  /** Everything in the namespace, the namespace, the directory; safe to call twice. */
  close(): void {
    process.removeListener("SIGINT", this.onSignal);
    process.removeListener("SIGTERM", this.onSignal);
    process.removeListener("exit", this.onExit);
    let pids: string[] = [];
    try {
      pids = execFileSync("ip", ["netns", "pids", this.namespace], { encoding: "utf8" })
        .split("\n")
        .filter(Boolean);
    } catch {
      pids = [];
    }
    // Only processes inside the namespace this object made: the squids, the echo service, the probe.
    for (const pid of pids)
      try {
        process.kill(Number(pid), "SIGKILL");
      } catch {
        // already gone
      }
    try {
      execFileSync("ip", ["netns", "del", this.namespace]);
    } catch {
      // not there (closed before)
    }
    // A squid killed (here, or by a test) leaves its segments; they carry our service names only.
    for (const segment of readdirSync("/dev/shm"))
      if (
        segment.startsWith(`${this.servicePrefix}m`) ||
        segment.startsWith(`${this.servicePrefix}gw`)
      )
        rmSync(join("/dev/shm", segment), { force: true });
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** The same calls, plain HTTP and CONNECT taking turns. */
export const alternatingModes = (list: ProbeCall[]): ProbeCall[] =>
  list.map((call, index) => ({ ...call, mode: index % 2 === 0 ? "http" : "connect" }));

/** The requests that got no 200. */
export const failuresOf = (outcomes: readonly ProbeOutcome[]): ProbeOutcome[] =>
  outcomes.filter((outcome) => outcome.status !== 200);

/** `count` calls of one user and mode. */
export const calls = (count: number, user: string, mode: ProbeCall["mode"] = "http"): ProbeCall[] =>
  Array.from({ length: count }, () => ({ user, password: GATEWAY_USER.password, mode }));
