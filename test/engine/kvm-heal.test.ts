/**
 * Heal on `pulumi up --refresh`, for a pool of KvmProxies on the lab's
 * libvirtd, through the real dynamic-provider server: each member broken by
 * hand with virsh as an operator (or a host) would, then refresh + up, and
 * the pool is back at full strength with the host holding exactly what state
 * records: the domains and per-VM volumes of the members, nothing else.
 * What refresh finds and what up does are the rules of docs/day2.md.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { overlayVolumeName, seedVolumeName } from "../../provider/kvm/naming";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { parseConfig } from "../../reaper/config";
import { EXIT, runSweep } from "../../reaper/sweep";
import { engineCallMs } from "../lab/budgets";
import { useLab, type LabEnv } from "../lab/fixture";
import { LabGuests } from "../lab/guests";
import {
  ensureProxyImage,
  labConnection,
  removeCachedBaseImage,
  serveImage,
  type RunningServer,
  assertHostHoldsExactly,
  waitOutHostListings,
} from "../lab/kvm-support";
import {
  captureResourceInputs,
  CONSUMER_IDENTITY,
  DynamicProviderServer,
  FakeEngine,
  packIntoConsumerProject,
  type ConsumerProject,
  type Props,
} from "./harness";
import { refreshAll, stepSummary, upAll, upWithRefresh, type Member } from "./up-refresh";

/** Resource names of this suite; their generated VM names start with them. */
const PREFIX = "heal";
const SIZE = 2;

describe("engine: a KvmProxy pool heals on refresh + up (lab, real dynamic-provider server)", function () {
  this.timeout(900_000);
  let project: ConsumerProject;
  let lab: LabEnv;
  let imageServer: RunningServer;
  let imageSha256: string;
  let server: DynamicProviderServer;
  const guests = new LabGuests();
  const members: Member[] = [];

  const virsh = (...args: string[]): string =>
    execFileSync("virsh", ["-q", "-c", lab.uri, ...args], { encoding: "utf8" });
  const vmNameOf = (member: Member): string => String(member.stored!.outputs.vmName);
  const uuidOf = (member: Member): string => String(member.stored!.outputs.libvirtUuid);

  function programArgs(overrides: Props = {}): Props {
    return {
      connection: labConnection(lab),
      pool: lab.pool,
      network: { bridge: lab.bridge },
      domainType: "qemu",
      memoryMiB: 256,
      image: { url: imageServer.url, sha256: imageSha256 },
      userData: "#cloud-config\nruncmd: [echo heal]\n",
      readiness: { mode: "none" },
      timeouts: { createSeconds: 300, readySeconds: 60, deleteSeconds: 120 },
      ...overrides,
    };
  }

  /** The program for every member (a pool's `count` members, the same arguments). */
  async function declare(overrides: Props = {}): Promise<void> {
    for (let index = 0; index < SIZE; index++) {
      const name = `${PREFIX}-${index}`;
      const captured = await captureResourceInputs(
        project,
        "KvmProxy",
        name,
        programArgs(overrides),
      );
      const member = members.find((m) => m.name === name);
      if (member === undefined) members.push({ name, urn: captured.urn, program: captured.inputs });
      else member.program = captured.inputs;
    }
  }

  /** Everything this suite's members own on the host, and what state says they own. */
  function assertHostHoldsExactlyState(): void {
    assertHostHoldsExactly(
      lab,
      `${PREFIX}-`,
      members.filter((m) => m.stored !== undefined).map(vmNameOf),
    );
  }

  /** Full strength: every member in state, complete, running on the host, and a quiet next plan. */
  async function assertFullStrength(): Promise<void> {
    for (const member of members) {
      assert.ok(member.stored, `${member.name} is in state`);
      assert.equal(member.stored.initErrors, undefined, `${member.name} has no init errors`);
      assert.equal(member.stored.outputs.state, "running", `${member.name} is running`);
      assert.equal(virsh("domstate", vmNameOf(member)).trim(), "running");
    }
    assertHostHoldsExactlyState();
    assert.deepEqual(
      stepSummary(await upWithRefresh(server, members)),
      members.map((m) => `${m.name}:same`),
      "refresh + up of the healed pool proposes nothing",
    );
  }

  function track(): void {
    for (const member of members) if (member.stored) guests.add(vmNameOf(member));
  }

  before(async () => {
    lab = await useLab();
    const image = await ensureProxyImage();
    imageSha256 = image.sha256;
    imageServer = await serveImage(image);
    project = packIntoConsumerProject();
    server = await DynamicProviderServer.start(project);
    server.callTimeoutMs = engineCallMs();
    await server.configure({});
    await declare();
    const created = await upAll(server, members);
    track();
    assert.deepEqual(
      stepSummary(created),
      members.map((m) => `${m.name}:create`),
    );
    await assertFullStrength();
  });

  after(async () => {
    for (const member of members)
      if (member.stored)
        await server
          ?.delete(member.urn, member.stored.id, member.stored.outputs)
          .catch(() => undefined);
    await server?.stop();
    // Whatever delete could not remove goes by name, and is verified gone.
    if (lab) await guests.removeAll(lab);
    // This run's image URL is new (a new port): its cached base is this run's to remove.
    if (lab && imageServer) {
      const inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
      try {
        await removeCachedBaseImage(inspector, lab.pool, imageServer.url, imageSha256);
      } finally {
        await inspector.close();
      }
    }
    await imageServer?.close();
    project?.remove();
  });

  it("a VM stopped by hand (virsh destroy): refresh shows it stopped, up starts the same VM", async () => {
    const [stopped, untouched] = members as [Member, Member];
    const uuid = uuidOf(stopped);
    virsh("destroy", vmNameOf(stopped));
    await waitOutHostListings(); // one provider serves every refresh of this suite
    const refreshed = await refreshAll(server, members);
    assert.equal(refreshed[0]!.outputs!.state, "stopped");
    assert.equal(refreshed[0]!.inputs!.running, false);
    assert.deepEqual(stepSummary(await upAll(server, members)), [
      `${stopped.name}:update`,
      `${untouched.name}:same`,
    ]);
    assert.equal(uuidOf(stopped), uuid, "the same VM, started again");
    await assertFullStrength();
  });

  it("every VM stopped at once (the host went down): up starts them all, same VMs", async () => {
    const uuids = members.map(uuidOf);
    for (const member of members) virsh("destroy", vmNameOf(member));
    await waitOutHostListings();
    assert.deepEqual(
      stepSummary(await upWithRefresh(server, members)),
      members.map((m) => `${m.name}:update`),
    );
    assert.deepEqual(members.map(uuidOf), uuids);
    for (const member of members)
      assert.equal(virsh("dominfo", vmNameOf(member)).match(/^Autostart:\s+(\S+)/m)?.[1], "enable");
    await assertFullStrength();
  });

  it("a VM deleted by hand that left its volumes: refresh keeps it, up replaces it and its volumes go", async () => {
    const [deleted] = members as [Member];
    const vmName = vmNameOf(deleted);
    const uuid = uuidOf(deleted);
    virsh("destroy", vmName);
    virsh("undefine", vmName, "--nvram");
    await waitOutHostListings();
    const refreshed = await refreshAll(server, members);
    assert.equal(refreshed[0]!.dropped, false, "kept: its volumes are still on the host");
    assert.match(String(refreshed[0]!.outputs!.replaceBecause), /domain .* gone .* left behind/);
    assert.match(String(refreshed[0]!.inputs!.replaceBecause), /gone/, "the plan shows why");
    assert.deepEqual(stepSummary(await upAll(server, members)), [
      `${deleted.name}:replace(delete first)`,
      `${members[1]!.name}:same`,
    ]);
    assert.equal(vmNameOf(deleted), vmName, "the replacement keeps the name");
    assert.notEqual(uuidOf(deleted), uuid, "a new VM");
    assert.equal(deleted.stored!.outputs.replaceBecause, undefined);
    await assertFullStrength();
  });

  it("a VM deleted with its storage: refresh drops it, up creates it again under a new name", async () => {
    const [, deleted] = members as [Member, Member];
    const vmName = vmNameOf(deleted);
    virsh("destroy", vmName);
    virsh("undefine", vmName, "--nvram", "--remove-all-storage");
    await waitOutHostListings();
    const refreshed = await refreshAll(server, members);
    assert.equal(refreshed[1]!.dropped, true);
    const steps = await upAll(server, members);
    track();
    assert.deepEqual(stepSummary(steps), [`${members[0]!.name}:same`, `${deleted.name}:create`]);
    assert.notEqual(vmNameOf(deleted), vmName);
    await assertFullStrength();
  });

  it("a disk or a seed deleted by hand (vol-delete): refresh shows it, up replaces the VM", async () => {
    const [noDisk, noSeed] = members as [Member, Member];
    const uuids = members.map(uuidOf);
    virsh("destroy", vmNameOf(noDisk));
    virsh("vol-delete", "--pool", lab.pool, overlayVolumeName(vmNameOf(noDisk)));
    virsh("vol-delete", "--pool", lab.pool, seedVolumeName(vmNameOf(noSeed)));
    await waitOutHostListings();
    const refreshed = await refreshAll(server, members);
    assert.match(String(refreshed[0]!.outputs!.replaceBecause), /\.qcow2 gone/);
    assert.match(String(refreshed[1]!.outputs!.replaceBecause), /-seed\.iso gone/);
    // A replacement, not a start that would fail on the missing disk.
    assert.deepEqual(stepSummary(await upAll(server, members)), [
      `${noDisk.name}:replace(delete first)`,
      `${noSeed.name}:replace(delete first)`,
    ]);
    members.forEach((member, index) => assert.notEqual(uuidOf(member), uuids[index]));
    await assertFullStrength();
  });

  it("a VM started again that does not become ready in its budget is replaced once, never in a loop", async () => {
    const [slow, other] = members as [Member, Member];
    const uuid = uuidOf(slow);
    virsh("destroy", vmNameOf(slow));
    await waitOutHostListings();
    // Readiness by the guest agent's address within 3 s: a TCG guest is nowhere near booted by then.
    await declare({
      readiness: { mode: "address" },
      timeouts: { createSeconds: 300, readySeconds: 3, deleteSeconds: 120 },
    });
    const first = await upWithRefresh(server, members);
    track();
    assert.deepEqual(stepSummary(first), [`${slow.name}:update!`, `${other.name}:update`]);
    assert.match(
      first[0]!.error!,
      /not ready \d+ s after `up` started it again.*next `pulumi up` replaces it/,
    );
    assert.equal(slow.stored!.outputs.state, "running", "stored as it is: running");
    assert.match(String(slow.stored!.outputs.replaceBecause), /not ready/);
    assert.equal(uuidOf(slow), uuid);

    // The next up replaces it; the replacement is not ready in 3 s either: a failed create, recorded.
    const second = await upWithRefresh(server, members);
    track();
    assert.deepEqual(stepSummary(second), [
      `${slow.name}:replace(delete first)!`,
      `${other.name}:same`,
    ]);
    const replacement = uuidOf(slow);
    assert.notEqual(replacement, uuid);
    assert.equal(slow.stored!.outputs.createIncomplete, true);
    assertHostHoldsExactlyState();

    // And the one after continues that create (an update): it is not replaced again.
    const third = await upWithRefresh(server, members);
    assert.deepEqual(stepSummary(third), [`${slow.name}:update!`, `${other.name}:same`]);
    assert.equal(uuidOf(slow), replacement, "the same replacement, waited for again");

    // With a budget it can meet, the next up completes it.
    await declare();
    assert.deepEqual(stepSummary(await upWithRefresh(server, members)), [
      `${slow.name}:update`,
      `${other.name}:update`,
    ]);
    assert.equal(uuidOf(slow), replacement);
    await assertFullStrength();
  });

  it("a host gone for good: delete fails with the way out; listed in goneHosts, it gives up and says what it leaves", async () => {
    const member = members[1]!;
    const stored = member.stored!;
    const vmName = vmNameOf(member);
    // The host "went away": state names an address where nothing listens any more.
    const deadPort = await new Promise<number>((resolvePort) => {
      const probe = createServer().listen(0, "127.0.0.1", () => {
        const { port } = probe.address() as { port: number };
        probe.close(() => resolvePort(port));
      });
    });
    const goneId = `hosts/127.0.0.1:${deadPort}/domains/${vmName}`;
    const goneOutputs = {
      ...stored.outputs,
      connection: {
        ...(stored.outputs.connection as Props),
        port: deadPort,
        dialTimeoutSeconds: 2,
      },
      timeouts: { createSeconds: 300, readySeconds: 60, deleteSeconds: 10 },
    };
    await assert.rejects(
      server.delete(member.urn, goneId, goneOutputs),
      /did not finish within 10 s.*if 127\.0\.0\.1:\d+ is gone for good, list it in egress-proxies:goneHosts/s,
    );

    const engine = await FakeEngine.start();
    const released = await DynamicProviderServer.start(
      project,
      undefined,
      process.env,
      engine.address,
    );
    try {
      await released.configure({ "egress-proxies:goneHosts": `127.0.0.1:${deadPort}` });
      // Refresh does not ask it (no failure, state as recorded); delete gives up at once and says what it leaves.
      const refreshed = await released.read(member.urn, goneId, goneOutputs, stored.inputs);
      assert.equal(refreshed.id, goneId);
      assert.equal(refreshed.properties.libvirtUuid, stored.outputs.libvirtUuid);
      const started = Date.now();
      await released.delete(member.urn, goneId, goneOutputs);
      assert.ok(Date.now() - started < 3000, "no connection attempted");
      const deadline = Date.now() + 5000;
      while (!engine.logs.some((l) => /left behind/.test(l.message)) && Date.now() < deadline)
        await new Promise((wait) => setTimeout(wait, 100));
      const warning = engine.logs.find((l) => /left behind/.test(l.message));
      assert.ok(warning, `logs: ${JSON.stringify(engine.logs)}`);
      assert.equal(warning.severity, 2, "a warning");
      for (const thing of [
        `domain ${vmName} (libvirt UUID ${uuidOf(member)})`,
        `volume ${lab.pool}/${overlayVolumeName(vmName)}`,
        `volume ${lab.pool}/${seedVolumeName(vmName)}`,
      ])
        assert.ok(warning.message.includes(thing), `${thing} in: ${warning.message}`);
    } finally {
      await released.stop();
      await engine.stop();
    }

    // The host "comes back" (it is the lab's, still there): the reaper finds the VM as an orphan of this
    // stack, since state no longer names it. A dry run only: other suites' VMs of the same test stack
    // share this pool, so the removal is the provider's delete on the real address.
    const workDir = mkdtempSync(join(tmpdir(), "heal-reaper-"));
    try {
      const { project: projectName, stack } = CONSUMER_IDENTITY;
      const stateFile = join(workDir, "state.json");
      const kept = members.filter((m) => m !== member && m.stored !== undefined);
      writeFileSync(
        stateFile,
        JSON.stringify({
          version: 3,
          deployment: {
            resources: [
              {
                urn: `urn:pulumi:${stack}::${projectName}::pulumi:pulumi:Stack::${projectName}-${stack}`,
              },
              ...kept.map((m) => ({
                urn: m.urn,
                id: m.stored!.id,
                custom: true,
                outputs: { vmName: vmNameOf(m) },
              })),
            ],
          },
        }),
      );
      let out = "";
      let err = "";
      const status = await runSweep(
        parseConfig({
          states: [{ checkpointFile: stateFile }],
          kvm: [
            {
              name: "lab",
              connection: {
                host: lab.sshHost,
                port: lab.sshPort,
                user: lab.sshUser,
                privateKeyFile: lab.clientKey,
                knownHostsFile: lab.knownHosts,
              },
              socketPath: lab.libvirtSocket,
              pools: [lab.pool],
            },
          ],
        }),
        { apply: false, json: true, minAgeMs: 0, pruneImages: false, project: projectName },
        { out: (text) => (out += text), err: (text) => (err += `${text}\n`) },
      );
      assert.equal(status, EXIT.ok, err);
      const report = JSON.parse(out) as {
        items: Array<{ name: string; action: string; why: string }>;
      };
      const item = report.items.find((i) => i.name === vmName);
      assert.equal(item?.action, "reap", `${stack}: ${JSON.stringify(item)}`);
      for (const m of kept)
        assert.notEqual(report.items.find((i) => i.name === vmNameOf(m))?.action, "reap");
    } finally {
      rmSync(workDir, { recursive: true, force: true });
    }
    await server.delete(member.urn, stored.id, stored.outputs);
    member.stored = undefined;
    assertHostHoldsExactlyState();
  });
});
