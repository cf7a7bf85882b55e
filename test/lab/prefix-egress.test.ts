/**
 * A routed IPv6 prefix spread over one squid VM, in the lab (one TCG guest):
 * a second unique-local /64, free on this machine (free-ula.py, excluding the
 * lab's own), is routed from this machine's lab leg to the VM's static IPv6
 * address, the way a user routes a provider's prefix to a proxy
 * (docs/many-exit-addresses.md). The VM runs squid with the prefix dialer
 * (mode random); 1000 requests through it to the echo service on this
 * machine's lab leg must show at least 900 distinct source addresses, all in
 * the prefix, and the egress check at create must have counted more than one.
 *
 * Only inside the lab: the route's next hop is a lab guest on lab-host, the
 * prefix is a ULA nothing else here uses, and nothing routes it further. The
 * guest, the route, the echo server and the cached base image are removed in
 * `after`, also when a test fails. The guest has no package mirror: squid and
 * python3 are in the lab image, and the cloud-config's `packages` must not fail
 * on them (asserted: cloud-init reports no error).
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { poolUserData, squidCloudConfig } from "../../components/squid-cloud-init";
import { inIpv6Prefix } from "../../provider/common/egress-samples";
import { closeAllHosts } from "../../provider/kvm/connect";
import * as kvm from "../../provider/kvm/provider";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { getThroughProxy, startEchoServer, type RunningServer } from "../support/forward-proxy";
import { LAB_SCRIPTS_DIR, useLab, type LabEnv } from "./fixture";
import {
  ensureProxyImage,
  labConnection,
  linkHostToLab,
  removeCachedBaseImage,
  serveImage,
  type ProxyImage,
  type RunningServer as ImageServer,
} from "./kvm-support";

const AUTH = { user: "crawler", password: "prefix lab secret" };
const owner = { project: "egress-lab", stack: "prefix-egress-test", resource: "proxy" };
const REQUESTS = 1000;
const CONCURRENCY = 16;

/** A command in the guest through its agent (virsh), its exit code and output once it ended. */
async function inGuest(
  lab: LabEnv,
  vmName: string,
  path: string,
  args: string[],
): Promise<{ exitcode: number; out: string }> {
  const agent = (command: object) =>
    JSON.parse(
      execFileSync(
        "virsh",
        ["-q", "-c", lab.uri, "qemu-agent-command", vmName, JSON.stringify(command)],
        { encoding: "utf8" },
      ),
    ) as { return: Record<string, unknown> };
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

/** `count` requests through the proxy, `concurrency` at a time; the echo's answers in order. */
async function manyThroughProxy(
  proxy: { host: string; port: number },
  url: string,
  count: number,
  concurrency: number,
): Promise<string[]> {
  const answers: string[] = [];
  let next = 0;
  const worker = async () => {
    while (next < count) {
      next++;
      const answer = await getThroughProxy(proxy, url, AUTH);
      assert.equal(answer.status, 200, answer.body.slice(0, 200));
      answers.push(answer.body.trim());
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return answers;
}

describe("a routed IPv6 prefix spread over one proxy, in the lab", function () {
  this.timeout(900_000);
  let lab: LabEnv;
  let prefix6: string;
  let hostIpv6: string;
  let routed: string;
  let vmIpv6: string;
  let route: string[] | undefined;
  let image: ProxyImage;
  let imageServer: ImageServer | undefined;
  let echo: RunningServer | undefined;
  let echo4: RunningServer | undefined;
  let created: { id: string; outs: Record<string, unknown> } | undefined;

  before(async () => {
    lab = await useLab();
    await linkHostToLab(lab);
    prefix6 = readFileSync(join(lab.labDir, "subnet6"), "utf8").trim();
    hostIpv6 = `${prefix6}::fe`;
    // A second /64 that no route or address of this machine overlaps, and not the lab's.
    const free = execFileSync(
      "/usr/bin/python3",
      [join(LAB_SCRIPTS_DIR, "free-ula.py"), "--exclude", `${prefix6}::/64`],
      { encoding: "utf8" },
    ).trim();
    routed = `${free}::/64`;
    // A static address, so the route can be in place before create's egress check samples.
    vmIpv6 = `${prefix6}::a:${randomBytes(2).toString("hex")}`;
    image = await ensureProxyImage();
    imageServer = await serveImage(image);
    echo = await startEchoServer(hostIpv6);
    echo4 = await startEchoServer(lab.hostAddress);
    const userData = poolUserData(
      squidCloudConfig({
        port: 3128,
        allowedClientCidrs: [lab.subnet, `${prefix6}::/64`],
        basicAuth: AUTH,
        extraConfigLines: [],
        prefixEgress: { prefix: routed, mode: "random" },
      }),
    );
    const { inputs, failures } = await kvm.check(
      {},
      {
        owner,
        vmName: `pfx-${Date.now().toString(36)}`,
        connection: labConnection(lab),
        pool: lab.pool,
        network: { bridge: lab.bridge },
        domainType: "qemu",
        memoryMiB: 512,
        image: { url: imageServer.url, sha256: image.sha256 },
        userData,
        ipFamilies: ["ipv4", "ipv6"],
        ipv6: { mode: "static", address: `${vmIpv6}/64` },
        readiness: { mode: "port", port: 3128 },
        egressCheck: {
          url: `http://${lab.hostAddress}:${echo4.port}/`,
          ipv6Url: `http://[${hostIpv6}]:${echo.port}/`,
          ipv6Prefix: { prefix: routed, mode: "random" },
          ipv6Samples: 20,
          proxyAuth: AUTH,
        },
        timeouts: { createSeconds: 720, readySeconds: 660, deleteSeconds: 120 },
      },
    );
    assert.deepEqual(failures, []);
    // The host route the docs tell a user to add: the prefix to the VM, over the lab leg only.
    route = ["-6", "route", "add", routed, "via", vmIpv6, "dev", "lab-host"];
    execFileSync("ip", route);
    created = {
      id: `hosts/${lab.sshHost}:${lab.sshPort}/domains/${String(inputs.vmName)}`,
      outs: inputs,
    };
    created = await kvm.create(inputs);
  });

  after(async function () {
    this.timeout(300_000);
    if (route !== undefined)
      try {
        execFileSync("ip", ["-6", "route", "del", routed, "via", vmIpv6, "dev", "lab-host"]);
      } catch (error) {
        process.stderr.write(`prefix lab: could not remove the route of ${routed}: ${error}\n`);
      }
    if (created !== undefined)
      await kvm.remove(created.id, created.outs).catch((error: Error) => {
        process.stderr.write(`prefix lab: could not remove ${created!.id}: ${error.message}\n`);
      });
    await echo?.close();
    await echo4?.close();
    if (imageServer !== undefined) {
      const inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
      try {
        await removeCachedBaseImage(inspector, lab.pool, imageServer.url, image.sha256);
      } finally {
        await inspector.close();
        await imageServer.close();
      }
    }
    await closeAllHosts();
  });

  it("the VM took its static IPv6 address, and the egress check saw the prefix spread", () => {
    const outs = created!.outs;
    assert.equal(outs.ipv6Address, vmIpv6);
    assert.ok(inIpv6Prefix(String(outs.egressIpv6), routed), `${outs.egressIpv6} in ${routed}`);
    assert.equal(typeof outs.egressIpv6Distinct, "number");
    assert.ok(Number(outs.egressIpv6Distinct) > 1, `distinct: ${outs.egressIpv6Distinct}`);
  });

  it("cloud-init finished without an error offline (packages squid and python3 are in the image)", async () => {
    const status = await inGuest(lab, String(created!.outs.vmName), "/usr/bin/cloud-init", [
      "status",
      "--long",
    ]);
    assert.match(status.out, /status: done/, status.out);
    assert.doesNotMatch(status.out, /errors?:\s*\n\s+-|status: error/, status.out);
    assert.equal(status.exitcode, 0, status.out);
  });

  it(`${REQUESTS} requests through the proxy leave from at least 900 addresses of the prefix`, async () => {
    const started = Date.now();
    const answers = await manyThroughProxy(
      { host: String(created!.outs.ip), port: 3128 },
      `http://[${hostIpv6}]:${echo!.port}/`,
      REQUESTS,
      CONCURRENCY,
    );
    const outside = answers.filter((address) => !inIpv6Prefix(address, routed));
    const distinct = new Set(answers).size;
    process.stdout.write(
      `      prefix_exit_addresses_per_1000=${distinct} (${Date.now() - started} ms, ${outside.length} outside)\n`,
    );
    assert.equal(answers.length, REQUESTS);
    assert.deepEqual(outside.slice(0, 5), [], "every request left from the prefix");
    assert.ok(distinct >= 900, `${distinct} distinct source addresses of ${REQUESTS}`);
  });
});
