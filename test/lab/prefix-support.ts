/**
 * A routed IPv6 prefix spread over lab guests (test/lab/prefix-egress.test.ts
 * and the bench's prefix suite): a second unique-local /64, free on this
 * machine (free-ula.py, excluding the lab's own), routed from this machine's
 * lab leg to a guest's static IPv6 address, the way a user routes a
 * provider's prefix to a proxy (docs/many-exit-addresses.md); echo services
 * on the lab leg; and the undo of all of it.
 *
 * Only inside the lab: the route's next hop is a lab guest on lab-host, the
 * prefix is a ULA nothing else here uses, and nothing routes it further.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { poolUserData, squidCloudConfig } from "../../workloads/squid-cloud-init";
import { closeAllHosts } from "../../provider/kvm/connect";
import * as kvm from "../../provider/kvm/provider";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { getThroughProxy, startEchoServer, type RunningServer } from "../support/forward-proxy";
import { LAB_SCRIPTS_DIR, useLab, type LabEnv } from "./lab";
import {
  ensureProxyImage,
  labConnection,
  linkHostToLab,
  removeCachedBaseImage,
  serveImage,
  type ProxyImage,
  type RunningServer as ImageServer,
} from "./kvm-support";

export const AUTH = { user: "crawler", password: "prefix lab secret" };

export interface PrefixLab {
  lab: LabEnv;
  /** The lab's own /64 (without "::/64") and this machine's address in it. */
  prefix6: string;
  hostIpv6: string;
  /** The second /64, routed to a guest: "fdxx:…:1::/64". */
  routed: string;
  echo6: RunningServer;
  echo4: RunningServer;
  image: ProxyImage;
  imageServer: ImageServer;
  /** What `stopPrefixLab` undoes, newest first. */
  undo: Array<() => Promise<void>>;
}

export interface LabProxy {
  id: string;
  outs: Record<string, unknown>;
  ipv6: string;
}

export async function startPrefixLab(): Promise<PrefixLab> {
  const lab = await useLab();
  await linkHostToLab(lab);
  const prefix6 = readFileSync(join(lab.labDir, "subnet6"), "utf8").trim();
  const hostIpv6 = `${prefix6}::fe`;
  const free = execFileSync(
    "/usr/bin/python3",
    [join(LAB_SCRIPTS_DIR, "free-ula.py"), "--exclude", `${prefix6}::/64`],
    { encoding: "utf8" },
  ).trim();
  const env: Partial<PrefixLab> & { undo: PrefixLab["undo"] } = { undo: [] };
  try {
    env.image = await ensureProxyImage();
    const image = env.image;
    const imageServer = await serveImage(image);
    env.undo.push(async () => {
      const inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
      try {
        await removeCachedBaseImage(inspector, lab.pool, imageServer.url, image.sha256);
      } finally {
        await inspector.close();
        await imageServer.close();
      }
    });
    const echo6 = await startEchoServer(hostIpv6);
    env.undo.push(() => echo6.close());
    const echo4 = await startEchoServer(lab.hostAddress);
    env.undo.push(() => echo4.close());
    return {
      ...env,
      lab,
      prefix6,
      hostIpv6,
      routed: `${free}::/64`,
      echo6,
      echo4,
      imageServer,
    } as PrefixLab;
  } catch (error) {
    await stopPrefixLab(env as PrefixLab);
    throw error;
  }
}

/** Undoes everything, newest first, each step whatever the others did; logs what it could not. */
export async function stopPrefixLab(env: PrefixLab): Promise<void> {
  for (const step of env.undo.reverse())
    await step().catch((error: Error) =>
      process.stderr.write(`prefix lab: cleanup step failed: ${error.message}\n`),
    );
  env.undo.length = 0;
  await closeAllHosts();
}

/**
 * A dual-stack squid guest with a static IPv6 address; with `spread`, the
 * routed prefix spread over it (mode random) and routed to it before create,
 * so create's egress check samples it. Removal joins `env.undo` before create.
 */
export async function createLabProxy(
  env: PrefixLab,
  name: string,
  spread: boolean,
): Promise<LabProxy> {
  const { lab } = env;
  // In the canonical text form the provider reports (RFC 5952: no leading zeros in a group; as hex
  // bytes, one run in sixteen began with "0" and failed the comparison).
  const ipv6 = `${env.prefix6}::a:${(randomBytes(2).readUInt16BE(0) || 1).toString(16)}`;
  const prefixEgress = spread ? { prefix: env.routed, mode: "random" as const } : undefined;
  const userData = poolUserData(
    squidCloudConfig({
      port: 3128,
      allowedClientCidrs: [lab.subnet, `${env.prefix6}::/64`],
      basicAuth: AUTH,
      extraConfigLines: [],
      ...(prefixEgress === undefined ? {} : { prefixEgress }),
    }),
  );
  const { inputs, failures } = await kvm.check(
    {},
    {
      owner: { project: "egress-lab", stack: "prefix-egress", resource: name },
      vmName: `${name}-${Date.now().toString(36)}`,
      connection: labConnection(lab),
      pool: lab.pool,
      network: { bridge: lab.bridge },
      domainType: "qemu",
      memoryMiB: 512,
      image: { url: env.imageServer.url, sha256: env.image.sha256 },
      userData,
      ipFamilies: ["ipv4", "ipv6"],
      ipv6: { mode: "static", address: `${ipv6}/64` },
      readiness: { mode: "port", port: 3128 },
      egressCheck: {
        url: `http://${lab.hostAddress}:${env.echo4.port}/`,
        ipv6Url: `http://[${env.hostIpv6}]:${env.echo6.port}/`,
        ...(prefixEgress === undefined ? {} : { ipv6Prefix: prefixEgress, ipv6Samples: 20 }),
        proxyAuth: AUTH,
      },
      timeouts: { createSeconds: 720, readySeconds: 660, deleteSeconds: 120 },
    },
  );
  assert.deepEqual(failures, []);
  let recorded: LabProxy = {
    id: `hosts/${lab.sshHost}:${lab.sshPort}/domains/${String(inputs.vmName)}`,
    outs: inputs,
    ipv6,
  };
  // Recorded before create, so a failed create still gets its VM removed.
  env.undo.push(async () => {
    await kvm.remove(recorded.id, recorded.outs);
  });
  if (spread) {
    // The host route the docs tell a user to add: the prefix to the VM, over the lab leg only.
    execFileSync("ip", ["-6", "route", "add", env.routed, "via", ipv6, "dev", "lab-host"]);
    env.undo.push(async () => {
      execFileSync("ip", ["-6", "route", "del", env.routed, "via", ipv6, "dev", "lab-host"]);
    });
  }
  const created = await kvm.create(inputs);
  recorded = { ...created, ipv6 };
  return recorded;
}

/** `count` requests through the proxy, `concurrency` at a time: the echo's answers, and each one's ms. */
export async function manyThroughProxy(
  proxy: { host: string; port: number },
  url: string,
  count: number,
  concurrency: number,
): Promise<{ answers: string[]; ms: number[] }> {
  const answers: string[] = [];
  const ms: number[] = [];
  let next = 0;
  const worker = async () => {
    while (next < count) {
      next++;
      const started = performance.now();
      const answer = await getThroughProxy(proxy, url, AUTH);
      ms.push(performance.now() - started);
      assert.equal(answer.status, 200, answer.body.slice(0, 200));
      answers.push(answer.body.trim());
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return { answers, ms };
}
