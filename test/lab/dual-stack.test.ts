/**
 * A KvmProxy's life in the lab, dual stack, one TCG guest, over SSH: the
 * image comes from a server that sends no length (one download, its progress
 * reported), the seed's network-config turns IPv6 on (SLAAC from the router
 * advertisements host-link.sh starts on br-lab), create waits for an address
 * of each family from the guest agent and for squid's port on both, and the
 * egress check reaches the echo service on this machine's lab leg once by its
 * IPv4 literal through the VM's IPv4 address and once by its IPv6 literal
 * through the VM's IPv6 address. Refresh follows a changed address; delete
 * leaves nothing of the VM and keeps the cached base. One guest for all of it
 * (a boot under TCG is most of a lab suite's cost; the plain IPv4 path is what
 * every other lab suite boots). The guest, the echo servers and the cached base
 * image are removed in `after`, also when a test fails.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { poolUserData, squidCloudConfig } from "../../workloads/squid-cloud-init";
import { eui64InterfaceId, ipv6Bytes } from "../../provider/common/ip-families";
import { closeAllHosts } from "../../provider/kvm/connect";
import { overlayVolumeName, seedVolumeName } from "../../provider/kvm/naming";
import * as kvm from "../../provider/kvm/provider";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { getThroughProxy, startEchoServer, type RunningServer } from "../support/forward-proxy";
import { useLab, type LabEnv } from "./fixture";
import { dhcpAddressPattern } from "./lab";
import {
  ensureProxyImage,
  inGuest,
  labConnection,
  linkHostToLab,
  refreshWithRecheck,
  removeCachedBaseImage,
  serveImage,
  type ProxyImage,
  type RunningServer as ImageServer,
} from "./kvm-support";

const AUTH = { user: "crawler", password: "dual stack lab secret" };
const owner = { project: "egress-lab", stack: "dual-stack-test", resource: "proxy" };

describe("a KvmProxy's life in the lab, dual stack (one squid VM over IPv4 and IPv6, over SSH)", function () {
  this.timeout(900_000);
  let lab: LabEnv;
  let prefix6: string;
  let hostIpv6: string;
  let image: ProxyImage;
  let imageServer: ImageServer | undefined;
  let echo4: RunningServer | undefined;
  let echo6: RunningServer | undefined;
  let created: { id: string; outs: Record<string, unknown> } | undefined;
  const progress: string[] = [];

  before(async () => {
    lab = await useLab();
    // Also brings IPv6 up on a lab started before it had any (idempotent).
    await linkHostToLab(lab);
    prefix6 = readFileSync(join(lab.labDir, "subnet6"), "utf8").trim();
    hostIpv6 = `${prefix6}::fe`;
    image = await ensureProxyImage();
    // No Content-Length: the download is measured as it goes (image.maxMiB), its progress reported.
    imageServer = await serveImage(image, { chunked: true });
    kvm.setProgressLog((line) => progress.push(line));
    // The echo service on this machine's lab leg, one per family.
    echo4 = await startEchoServer(lab.hostAddress);
    echo6 = await startEchoServer(hostIpv6);
    const userData = poolUserData(
      squidCloudConfig({
        port: 3128,
        allowedClientCidrs: [lab.subnet, `${prefix6}::/64`],
        basicAuth: AUTH,
        extraConfigLines: [],
      }),
    );
    const { inputs, failures } = await kvm.check(
      {},
      {
        owner,
        vmName: `ds6-${Date.now().toString(36)}`,
        connection: labConnection(lab),
        pool: lab.pool,
        network: { bridge: lab.bridge },
        domainType: "qemu",
        memoryMiB: 512,
        image: { url: imageServer.url, sha256: image.sha256 },
        userData,
        ipFamilies: ["ipv4", "ipv6"],
        readiness: { mode: "port", port: 3128 },
        egressCheck: {
          url: `http://${lab.hostAddress}:${echo4.port}/`,
          ipv6Url: `http://[${hostIpv6}]:${echo6.port}/`,
          proxyAuth: AUTH,
        },
        timeouts: { createSeconds: 720, readySeconds: 660, deleteSeconds: 120 },
      },
    );
    assert.deepEqual(failures, []);
    // Recorded before create, so a failed create still gets its VM removed in `after`.
    created = {
      id: `hosts/${lab.sshHost}:${lab.sshPort}/domains/${String(inputs.vmName)}`,
      outs: inputs,
    };
    created = await kvm.create(inputs);
  });

  after(async function () {
    this.timeout(300_000);
    if (created !== undefined)
      await kvm.remove(created.id, created.outs).catch((error: Error) => {
        process.stderr.write(`dual-stack lab: could not remove ${created!.id}: ${error.message}\n`);
      });
    await echo4?.close();
    await echo6?.close();
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

  it("was made over SSH from one download, its progress reported, and runs", () => {
    const outs = created!.outs;
    assert.equal(outs.host, `${lab.sshHost}:${lab.sshPort}`);
    assert.equal(created!.id, `hosts/${lab.sshHost}:${lab.sshPort}/domains/${String(outs.vmName)}`);
    assert.equal(outs.state, "running");
    assert.match(String(outs.libvirtUuid), /^[0-9a-f-]{36}$/);
    assert.equal(imageServer!.requests.filter((r) => r.method === "GET").length, 1, "one download");
    assert.ok(!imageServer!.requests.some((r) => r.method === "HEAD"), "no HEAD request");
    assert.ok(
      progress.some((line) => /MiB.*at .* MiB\/s/.test(line)),
      `download progress was reported: ${progress.join(" | ")}`,
    );
  });

  it("gets an IPv4 lease and a SLAAC address from the lab's /64, made from its MAC", () => {
    const outs = created!.outs;
    assert.match(String(outs.ip), dhcpAddressPattern(lab.subnet));
    const ipv6 = String(outs.ipv6Address);
    assert.ok(ipv6.startsWith(`${prefix6}:`), `${ipv6} in ${prefix6}::/64`);
    assert.ok(
      ipv6Bytes(ipv6)!
        .subarray(8)
        .equals(eui64InterfaceId(String(outs.mac))),
    );
    assert.equal(outs.endpoint, `http://${String(outs.ip)}:3128`);
  });

  it("the egress check saw each family's exit address: the VM's own, one per family", () => {
    const outs = created!.outs;
    assert.equal(outs.egressIp, outs.ip);
    assert.equal(outs.egressIpv6, outs.ipv6Address);
  });

  it("squid answers clients over IPv4 and over IPv6", async () => {
    const outs = created!.outs;
    const over4 = await getThroughProxy(
      { host: String(outs.ip), port: 3128 },
      `http://[${hostIpv6}]:${echo6!.port}/`,
      AUTH,
    );
    assert.deepEqual([over4.status, over4.body.trim()], [200, outs.ipv6Address]);
    const over6 = await getThroughProxy(
      { host: String(outs.ipv6Address), port: 3128 },
      `http://${lab.hostAddress}:${echo4!.port}/`,
      AUTH,
    );
    assert.deepEqual([over6.status, over6.body.trim()], [200, outs.ip]);
  });

  it("refresh looks each family up again: unchanged it plans nothing; a new IPv6 address is read, re-checked and accepted in place", async () => {
    const { id } = created!;
    const refresh = (olds: Record<string, unknown>) => refreshWithRecheck(id, olds);
    const outs = created!.outs;
    const quiet = await refresh(outs);
    assert.equal(quiet.props.ipv6Address, outs.ipv6Address);
    assert.equal(quiet.props.egressIpv6, outs.egressIpv6);
    assert.ok(String(quiet.props.checkedAt) > String(outs.checkedAt), "the time of this check");
    assert.equal(quiet.changes, false);

    // The VM's IPv6 address changes (a new one from the /64, the SLAAC one gone and not made again).
    const moved = `${prefix6}::beef`;
    const vmName = String(outs.vmName);
    const script = [
      "for nic in /sys/class/net/*; do",
      `  [ "$(cat "$nic/address")" = "${String(outs.mac)}" ] && dev=\${nic##*/}`,
      "done",
      'sysctl -qw "net.ipv6.conf.$dev.autoconf=0"',
      `ip -6 addr add ${moved}/64 dev "$dev" nodad`,
      `ip -6 addr del ${String(outs.ipv6Address)}/64 dev "$dev"`,
    ].join("\n");
    const changed = await inGuest(lab, vmName, "/bin/sh", ["-ec", script]);
    assert.equal(changed.exitcode, 0, changed.out);
    const refreshed = await refresh(quiet.props);
    assert.equal(refreshed.props.ipv6Address, moved, "refresh read the VM's new IPv6 address");
    assert.equal(refreshed.props.egressIpv6, moved, "and the re-check saw it leave from there");
    assert.equal(refreshed.props.ip, outs.ip, "IPv4 untouched");
    assert.equal(refreshed.changes, false, "accepted in place: nothing to replace");
    const over6 = await getThroughProxy(
      { host: moved, port: 3128 },
      `http://${lab.hostAddress}:${echo4!.port}/`,
      AUTH,
    );
    assert.equal(over6.status, 200);
    created = { id, outs: refreshed.props };
  });
  it("deletes cleanly: no domain, overlay or seed left, the base stays cached; a second delete is fine and read finds nothing", async () => {
    const { id, outs } = created!;
    const vmName = String(outs.vmName);
    await kvm.remove(id, outs);
    const virsh = (...args: string[]) =>
      execFileSync("virsh", ["-q", "-c", lab.uri, ...args], { encoding: "utf8" });
    assert.ok(!virsh("list", "--all", "--name").split("\n").includes(vmName), "no domain left");
    const volumes = virsh("vol-list", lab.pool)
      .split("\n")
      .map((line) => line.trim().split(/\s+/)[0]);
    assert.ok(
      !volumes.includes(overlayVolumeName(vmName)) && !volumes.includes(seedVolumeName(vmName)),
      volumes.join(","),
    );
    assert.ok(volumes.includes(String(outs.imageVolume)), "the base image stays cached");
    await kvm.remove(id, outs);
    assert.deepEqual(await kvm.read(id, outs), {});
    created = undefined;
  });
});
