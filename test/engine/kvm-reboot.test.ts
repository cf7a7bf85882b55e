/**
 * A host reboot, for a pool of KvmProxies, through the real dynamic-provider
 * server: on a private hypervisor (test/lab/reboot-host.sh, a stock-host
 * profile under its own names) whose libvirtd can be restarted while the
 * shared lab's keeps serving the other suites. Every guest is powered off,
 * libvirtd restarts with empty once-per-boot markers (what a boot leaves),
 * and libvirt's autostart brings the proxies back: refresh + up proposes
 * nothing. A proxy whose autostart was turned off by hand stays off; the next
 * refresh + up starts it and turns autostart on again.
 */
import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { promisify } from "node:util";
import { engineCallMs } from "../lab/budgets";
import { LAB_SCRIPTS_DIR } from "../lab/fixture";
import { ensureProxyImage, serveImage, type RunningServer } from "../lab/kvm-support";
import type { StockHostEnv } from "../lab/stock-host";
import {
  captureResourceInputs,
  DynamicProviderServer,
  packIntoConsumerProject,
  type ConsumerProject,
  type Props,
} from "./harness";
import { stepSummary, upAll, upWithRefresh, type Member } from "./up-refresh";

const run = promisify(execFile);
const SCRIPT = resolve(LAB_SCRIPTS_DIR, "reboot-host.sh");
const HOST_DIR = process.env.REBOOT_HOST_DIR ?? "/tmp/egress-reboot-host";
const SIZE = 2;

async function rebootHost(mode: "up" | "reboot" | "down"): Promise<string> {
  try {
    const { stdout } = await run("bash", [SCRIPT, mode], { timeout: 180_000 });
    return stdout;
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `reboot-host.sh ${mode} failed: ${e.message}\n${e.stdout ?? ""}${e.stderr ?? ""}`,
    );
  }
}

describe("engine: a KvmProxy pool after a host reboot (private libvirtd, real dynamic-provider server)", function () {
  this.timeout(900_000);
  let project: ConsumerProject;
  let imageServer: RunningServer;
  let imageSha256: string;
  let server: DynamicProviderServer;
  let host: StockHostEnv;
  let socket: string;
  const members: Member[] = [];

  const virsh = (...args: string[]): string =>
    execFileSync("virsh", ["-q", "-c", `qemu:///system?socket=${socket}`, ...args], {
      encoding: "utf8",
    });
  const vmNameOf = (member: Member): string => String(member.stored!.outputs.vmName);
  const autostartOf = (member: Member): string | undefined =>
    /^Autostart:\s+(\S+)/m.exec(virsh("dominfo", vmNameOf(member)))?.[1];

  async function waitUntilRunning(names: string[], seconds = 120): Promise<void> {
    const until = Date.now() + seconds * 1000;
    for (;;) {
      const states = names.map((name) => virsh("domstate", name).trim());
      if (states.every((state) => state === "running")) return;
      if (Date.now() > until) throw new Error(`not all running after ${seconds} s: ${states}`);
      await new Promise((wait) => setTimeout(wait, 500));
    }
  }

  before(async () => {
    await rebootHost("up");
    host = JSON.parse(readFileSync(`${HOST_DIR}/env.json`, "utf8")) as StockHostEnv;
    socket = host.libvirtSocket;
    // What `egress-proxies doctor --fix` sets up on a stock host: a pool and the default network, both
    // started with the host.
    virsh("pool-define-as", "default", "dir", "--target", "/var/lib/libvirt/images");
    virsh("pool-start", "default");
    virsh("pool-autostart", "default");
    virsh("net-start", "default");
    virsh("net-autostart", "default");
    const image = await ensureProxyImage();
    imageSha256 = image.sha256;
    imageServer = await serveImage(image);
    project = packIntoConsumerProject();
    server = await DynamicProviderServer.start(project);
    server.callTimeoutMs = engineCallMs();
    await server.configure({});
    for (let index = 0; index < SIZE; index++) {
      const name = `reboot-${index}`;
      // Over SSH as the host's non-root libvirt user, the way a user reaches a hypervisor.
      const args: Props = {
        connection: {
          host: host.sshHost,
          port: host.sshPort,
          user: host.sshUser,
          privateKey: readFileSync(host.clientKey, "utf8"),
          knownHosts: readFileSync(host.knownHosts, "utf8"),
        },
        socketPath: socket,
        pool: "default",
        network: { name: "default" },
        domainType: "qemu",
        memoryMiB: 256,
        image: { url: imageServer.url, sha256: imageSha256 },
        userData: "#cloud-config\nruncmd: [echo reboot]\n",
        readiness: { mode: "none" },
        timeouts: { createSeconds: 300, readySeconds: 60, deleteSeconds: 120 },
      };
      const captured = await captureResourceInputs(project, "KvmProxy", name, args);
      members.push({ name, urn: captured.urn, program: captured.inputs });
    }
    assert.deepEqual(
      stepSummary(await upAll(server, members)),
      members.map((m) => `${m.name}:create`),
    );
  });

  after(async () => {
    for (const member of members)
      if (member.stored)
        await server
          ?.delete(member.urn, member.stored.id, member.stored.outputs)
          .catch(() => undefined);
    await server?.stop();
    await imageServer?.close();
    project?.remove();
    // Everything of the private host goes, whatever happened above: its daemons, guests, netns, user.
    await rebootHost("down");
  });

  it("autostart brings every proxy back after the reboot: refresh + up proposes nothing", async () => {
    const uuids = members.map((m) => m.stored!.outputs.libvirtUuid);
    for (const member of members) assert.equal(autostartOf(member), "enable");
    const log = await rebootHost("reboot");
    assert.match(log, /rebooted: libvirtd \d+ \(was \d+\)/);
    await waitUntilRunning(members.map(vmNameOf));
    assert.deepEqual(
      stepSummary(await upWithRefresh(server, members)),
      members.map((m) => `${m.name}:same`),
    );
    assert.deepEqual(
      members.map((m) => m.stored!.outputs.libvirtUuid),
      uuids,
    );
    for (const member of members) assert.equal(member.stored!.outputs.state, "running");
  });

  it("one whose autostart was turned off by hand stays off; refresh + up starts it and sets autostart", async () => {
    const [off, on] = members as [Member, Member];
    virsh("autostart", "--disable", vmNameOf(off));
    await rebootHost("reboot");
    await waitUntilRunning([vmNameOf(on)]);
    assert.equal(virsh("domstate", vmNameOf(off)).trim(), "shut off");
    assert.deepEqual(stepSummary(await upWithRefresh(server, members)), [
      `${off.name}:update`,
      `${on.name}:same`,
    ]);
    assert.equal(virsh("domstate", vmNameOf(off)).trim(), "running");
    assert.equal(autostartOf(off), "enable");
    assert.deepEqual(
      stepSummary(await upWithRefresh(server, members)),
      members.map((m) => `${m.name}:same`),
    );
  });
});
