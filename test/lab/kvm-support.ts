/**
 * What KvmProxy's lab tests share: the proxy image (built once from Debian's
 * packages by build-image.sh, then cached), an HTTP server that serves it the
 * way image mirrors do, a target web server on the lab bridge, inputs
 * shaped like a user's, commands in a guest through its agent, and a refresh
 * with the pool's egress re-check.
 */
import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { createReadStream, readFileSync, statSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { resolve } from "node:path";
import { promisify } from "node:util";
import { HOST_LISTING_WINDOW_MS } from "../../provider/kvm/host-listings";
import * as kvm from "../../provider/kvm/provider";
import { Procedures, type LibvirtConnection } from "../../provider/libvirt-rpc-xdr";
import {
  baseImageMarkerName,
  baseImageVolumeName,
  overlayVolumeName,
  seedVolumeName,
} from "../../provider/kvm/naming";
import { LAB_SCRIPTS_DIR, type LabEnv } from "./lab";

const run = promisify(execFile);

/**
 * After a change made behind the provider's back (virsh, another libvirt
 * client), waits out the window in which a provider process may still answer
 * a Read from a host listing asked before the change
 * (provider/kvm/host-listings.ts). The engine starts a provider per
 * deployment, so a real refresh never meets that; a test that keeps one
 * provider across refreshes does.
 */
export function waitOutHostListings(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, HOST_LISTING_WINDOW_MS + 250));
}

export interface ProxyImage {
  path: string;
  sha256: string;
  bytes: number;
}

/**
 * The image from build-image.sh's cache (keyed by the recipe's content), built
 * when missing (~2 min on a fresh machine; the test command builds it before
 * the lab suites start). Its digest was written by the build, last.
 */
export async function ensureProxyImage(): Promise<ProxyImage> {
  let path: string;
  try {
    const { stdout } = await run("bash", [resolve(LAB_SCRIPTS_DIR, "build-image.sh")], {
      timeout: 900_000,
      maxBuffer: 64 * 1024 * 1024,
    });
    path = stdout.trim().split("\n").at(-1)!;
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `building the lab proxy image failed: ${e.message}\n${(e.stderr ?? "").slice(-4000)}`,
    );
  }
  const sha256 = readFileSync(`${path}.sha256`, "utf8").trim();
  return { path, sha256, bytes: statSync(path).size };
}

/** The lab's sshd as a KvmProxy `connection`, the way a user describes a hypervisor. */
export function labConnection(lab: LabEnv): Record<string, unknown> {
  return {
    host: lab.sshHost,
    port: lab.sshPort,
    user: lab.sshUser,
    privateKey: readFileSync(lab.clientKey, "utf8"),
    knownHosts: readFileSync(lab.knownHosts, "utf8"),
  };
}

/** Runs test/lab/host-link.sh: this netns gets the lab's host address (<subnet>.254) on the lab bridge. */
export async function linkHostToLab(lab: LabEnv): Promise<string> {
  await run("bash", [resolve(LAB_SCRIPTS_DIR, "host-link.sh")], {
    env: { ...process.env, LAB_NETNS: lab.netns, LAB_DIR: lab.labDir },
  });
  return lab.hostAddress;
}

export interface RunningServer {
  url: string;
  requests: Array<{ method: string; url: string }>;
  close(): Promise<void>;
}

async function listen(server: Server, host: string): Promise<string> {
  await new Promise<void>((done) => server.listen(0, host, done));
  return `http://${host}:${(server.address() as AddressInfo).port}`;
}

function closer(server: Server): () => Promise<void> {
  return () =>
    new Promise((done) => {
      server.closeAllConnections();
      server.close(() => done());
    });
}

/**
 * Serves the image on loopback like a mirror: GET only (HEAD refused), with or
 * without Content-Length. `beforeBody` runs once the headers are out and
 * before the first body byte: the client has then seen the length, and
 * decided what it decides before reading (e.g. whether the pool has room).
 */
export async function serveImage(
  image: ProxyImage,
  options: { chunked?: boolean; beforeBody?: () => Promise<void> } = {},
): Promise<RunningServer> {
  const requests: RunningServer["requests"] = [];
  const server = createServer((req, res) => {
    requests.push({ method: req.method ?? "", url: req.url ?? "" });
    if (req.method !== "GET") return void res.writeHead(405).end();
    // Any query string: tests that need a fresh cache entry ask for the same bytes under a new URL.
    if (!req.url?.startsWith("/debian-proxy-base.qcow2")) return void res.writeHead(404).end();
    res.writeHead(
      200,
      options.chunked
        ? { "content-type": "application/octet-stream" }
        : { "content-length": image.bytes },
    );
    res.flushHeaders();
    void (options.beforeBody?.() ?? Promise.resolve()).then(
      () => createReadStream(image.path).pipe(res),
      () => res.destroy(),
    );
  });
  const base = await listen(server, "127.0.0.1");
  return { url: `${base}/debian-proxy-base.qcow2`, requests, close: closer(server) };
}

/** A web server on the lab bridge that guests reach through squid. */
export async function serveTarget(hostAddress: string, body: string): Promise<RunningServer> {
  const requests: RunningServer["requests"] = [];
  const server = createServer((req, res) => {
    requests.push({ method: req.method ?? "", url: req.url ?? "" });
    res.writeHead(200, { "content-type": "text/plain" }).end(body);
  });
  return { url: await listen(server, hostAddress), requests, close: closer(server) };
}

/** The squid cloud-config a user would write: its own packages and runcmd, a comment, a YAML 1.10. */
export const squidUserData = (lab: LabEnv): string => `#cloud-config
# squid for the egress pool (version pinned on purpose: 1.10 must stay 1.10)
x-egress-config-version: 1.10
packages: [squid]
write_files:
  - path: /etc/squid/conf.d/egress.conf
    content: |
      visible_hostname egress-proxy
      acl egress_clients src ${lab.subnet}
      http_access allow egress_clients
runcmd:
  - [systemctl, restart, squid]
  - [touch, /run/egress-user-runcmd-done]
`;

/**
 * Removes the cached base image (and its marker) of one image URL from a pool.
 * Lab tests serve the image on a new port each run, so the URL, and the base,
 * are that run's own: removing it never touches a base another run uses.
 */
export async function removeCachedBaseImage(
  inspector: LibvirtConnection,
  poolName: string,
  url: string,
  sha256: string,
): Promise<void> {
  const pool = await inspector.call(Procedures.storagePoolLookupByName, { name: poolName });
  const base = baseImageVolumeName({ url, sha256, format: "qcow2" });
  for (const name of [base, baseImageMarkerName(base)]) {
    const vol = await inspector
      .call(Procedures.storageVolLookupByName, { pool, name })
      .catch(() => undefined);
    if (vol) await inspector.call(Procedures.storageVolDelete, { vol, flags: 0 });
  }
}

/**
 * Fills `pool` once a volume named `volume` appears in it (the base an image
 * download is about to upload into: the download passed its free-space check),
 * so that less than `leaveBytes` stays free: the upload then runs out of room
 * for real, midway. `release` removes the filler.
 */
export function fillPoolOnceVolumeAppears(
  lab: LabEnv,
  pool: string,
  volume: () => string,
  leaveBytes: number,
): { fill: () => Promise<void>; release: () => Promise<void> } {
  const filler = `egress-test-filler-${process.pid}`;
  const virsh = (...args: string[]) => run("virsh", ["-q", "-c", lab.uri, ...args]);
  return {
    fill: async () => {
      for (let waited = 0; ; waited += 100) {
        const { stdout } = await virsh("vol-list", pool);
        if (stdout.split("\n").some((line) => line.trim().split(/\s+/)[0] === volume())) break;
        if (waited > 60_000) throw new Error(`${volume()} never appeared in pool ${pool}`);
        await new Promise((done) => setTimeout(done, 100));
      }
      // No pool-refresh: libvirt refuses one while the upload's stream is open. Its figure may be
      // a little behind the file system, so a filler that does not fit is tried smaller.
      const { stdout } = await virsh("pool-info", "--bytes", pool);
      const available = Number(/Available:\s+(\d+)/.exec(stdout)?.[1]);
      for (let size = available - leaveBytes; ; size -= 64 * 1024) {
        if (size < 64 * 1024) throw new Error(`no filler fits in pool ${pool}`);
        try {
          await virsh("vol-create-as", pool, filler, String(size), "--allocation", String(size));
          return;
        } catch {
          await virsh("vol-delete", "--pool", pool, filler).catch(() => undefined);
        }
      }
    },
    release: async () => {
      await virsh("vol-delete", "--pool", pool, filler).catch(() => undefined);
    },
  };
}

/**
 * The host holds exactly what state records: the domains and per-VM volumes
 * whose names start with `prefix` are those of the VMs named in `vmNamesInState`.
 */
export function assertHostHoldsExactly(
  lab: LabEnv,
  prefix: string,
  vmNamesInState: readonly string[],
): void {
  const virsh = (...args: string[]): string =>
    execFileSync("virsh", ["-q", "-c", lab.uri, ...args], { encoding: "utf8" });
  const names = (text: string): string[] =>
    text
      .split("\n")
      .map((line) => line.trim().split(/\s+/)[0]!)
      .filter((name) => name.startsWith(prefix))
      .sort();
  assert.deepEqual(
    names(virsh("list", "--all", "--name")),
    [...vmNamesInState].sort(),
    "domains on the host = domains in state",
  );
  assert.deepEqual(
    names(virsh("vol-list", lab.pool)),
    vmNamesInState.flatMap((vm) => [overlayVolumeName(vm), seedVolumeName(vm)]).sort(),
    "per-VM volumes on the host = those of the VMs in state",
  );
}

/** One guest agent command through virsh: another client than ours (libvirt's agent passthrough). */
function guestAgent(lab: LabEnv, vmName: string) {
  return (command: object) =>
    JSON.parse(
      execFileSync(
        "virsh",
        ["-q", "-c", lab.uri, "qemu-agent-command", vmName, JSON.stringify(command)],
        { encoding: "utf8" },
      ),
    ) as { return: Record<string, unknown> };
}

/** A file of the guest, whole, read through its agent (virsh). */
export function readGuestFile(lab: LabEnv, vmName: string, path: string): string {
  const agent = guestAgent(lab, vmName);
  const handle = agent({ execute: "guest-file-open", arguments: { path, mode: "r" } }).return;
  try {
    let text = "";
    for (;;) {
      const read = agent({ execute: "guest-file-read", arguments: { handle, count: 65536 } })
        .return as { "buf-b64": string; eof: boolean };
      text += Buffer.from(read["buf-b64"], "base64").toString();
      if (read.eof) return text;
    }
  } finally {
    agent({ execute: "guest-file-close", arguments: { handle } });
  }
}

/** A command in the guest through its agent (virsh), its exit code and output once it ended. */
export async function inGuest(
  lab: LabEnv,
  vmName: string,
  path: string,
  args: string[],
): Promise<{ exitcode: number; out: string }> {
  const agent = guestAgent(lab, vmName);
  const { pid } = agent({
    execute: "guest-exec",
    arguments: { path, arg: args, "capture-output": true },
  }).return as { pid: number };
  for (let tries = 0; tries < 60; tries++) {
    const status = agent({ execute: "guest-exec-status", arguments: { pid } }).return as {
      exited: boolean;
      exitcode?: number;
      "out-data"?: string;
    };
    if (status.exited)
      return {
        exitcode: status.exitcode ?? -1,
        out: Buffer.from(status["out-data"] ?? "", "base64").toString("utf8"),
      };
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  throw new Error(`${path} did not end within 60 s in ${vmName}`);
}

/**
 * A refresh as `up --refresh` runs it with the pool's default (every refresh
 * re-checks egress), then the plan: what the read found, the program's
 * inputs after it, and whether the diff sees a change.
 */
export async function refreshWithRecheck(id: string, olds: Record<string, unknown>) {
  const read = await kvm.read(id, { ...olds, egressRecheck: true });
  const news = (await kvm.check(read.inputs!, { ...read.inputs!, egressRecheck: true })).inputs;
  const diff = await kvm.diff(id, read.props!, news);
  return { props: read.props!, news, changes: diff.changes };
}
