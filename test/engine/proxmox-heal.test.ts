/**
 * Heal on `pulumi up --refresh` for a pool of ProxmoxProxies on the
 * simulator, through the real dynamic-provider server: each member broken
 * out of band (as `qm stop`, `qm destroy`, a disk or ISO removed, a node
 * reboot would), then refresh + up, and the pool is back at full strength
 * with the node holding exactly what state records: the VMs and seed ISOs of
 * the members, nothing else. The KVM side is engine/kvm-heal.test.ts.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseConfig } from "../../reaper/config";
import { EXIT, runSweep } from "../../reaper/sweep";
import type { PveSimulator } from "../pve-sim/simulator";
import { simulatorProxyArgs, useEngineFixture } from "./engine-fixture";
import {
  captureResourceInputs,
  CONSUMER_IDENTITY,
  type DynamicProviderServer,
  type Props,
} from "./harness";
import { refreshAll, stepSummary, upAll, upWithRefresh, type Member } from "./up-refresh";

const SIZE = 2;

describe("engine: a ProxmoxProxy pool heals on refresh + up (simulator, real dynamic-provider server)", function () {
  this.timeout(120_000);
  const fixture = useEngineFixture();
  let sim: PveSimulator;
  let server: DynamicProviderServer;
  const members: Member[] = [];

  const vmidOf = (member: Member): number => Number(member.stored!.outputs.vmid);
  const vmOf = (member: Member) => sim.vms.get(vmidOf(member))!;
  const seedOf = (member: Member): string => String(member.stored!.outputs.seedVolume);
  /** A replacement may reuse the freed VMID (candidates follow the name): the mark's time tells VMs apart. */
  const bornOf = (member: Member): string => String(member.stored!.outputs.createdAt);

  /**
   * Each `pulumi refresh` or `up --refresh` below is a command of its own, run
   * by a provider process of its own as the engine runs it: a change made out
   * of band before it is never hidden by a listing the previous one shared.
   */
  async function nextDeployment(): Promise<DynamicProviderServer> {
    server = await fixture.nextDeployment(server);
    return server;
  }

  async function declare(overrides: Props = {}): Promise<void> {
    for (let index = 0; index < SIZE; index++) {
      const name = `pve-heal-${index}`;
      const args = simulatorProxyArgs(sim, {
        apiToken: sim.tokenFor(),
        userData: "#cloud-config\nruncmd: [echo heal]\n",
        ...overrides,
      });
      const captured = await captureResourceInputs(fixture.project, "ProxmoxProxy", name, args);
      const member = members.find((m) => m.name === name);
      if (member === undefined) members.push({ name, urn: captured.urn, program: captured.inputs });
      else member.program = captured.inputs;
    }
  }

  /** The node's VMs (templates aside) and the seed storage's ISOs are exactly those of the members in state. */
  function assertNodeHoldsExactlyState(): void {
    const inState = members.filter((m) => m.stored !== undefined);
    const vms = [...sim.vms.values()]
      .filter((vm) => vm.config.template !== "1")
      .map((vm) => vm.vmid)
      .sort();
    assert.deepEqual(vms, inState.map(vmidOf).sort(), "VMs on the node = VMs in state");
    const isos = [...sim.storages.get("seeds")!.files.keys()].sort();
    assert.deepEqual(isos, inState.map(seedOf).sort(), "seed ISOs on the node = seeds in state");
  }

  async function assertFullStrength(): Promise<void> {
    for (const member of members) {
      assert.ok(member.stored, `${member.name} is in state`);
      assert.equal(member.stored.initErrors, undefined, `${member.name} has no init errors`);
      assert.equal(member.stored.outputs.state, "running", `${member.name} is running`);
      assert.equal(member.stored.outputs.replaceBecause, undefined);
      assert.equal(vmOf(member).status, "running");
    }
    assertNodeHoldsExactlyState();
    assert.deepEqual(
      stepSummary(await upWithRefresh(await nextDeployment(), members)),
      members.map((m) => `${m.name}:same`),
      "refresh + up of the healed pool proposes nothing",
    );
  }

  before(async () => {
    sim = await fixture.startSimulator();
    server = await fixture.startServer({ config: {} });
    await declare();
    assert.deepEqual(
      stepSummary(await upAll(server, members)),
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
  });

  it("a VM stopped out of band: refresh shows it stopped, up starts the same VMID", async () => {
    const [stopped, untouched] = members as [Member, Member];
    const vmid = vmidOf(stopped);
    Object.assign(vmOf(stopped), { status: "stopped", startedAt: undefined });
    const refreshed = await refreshAll(await nextDeployment(), members);
    assert.equal(refreshed[0]!.outputs!.state, "stopped");
    assert.deepEqual(stepSummary(await upAll(server, members)), [
      `${stopped.name}:update`,
      `${untouched.name}:same`,
    ]);
    assert.equal(vmidOf(stopped), vmid);
    await assertFullStrength();
  });

  it("a node reboot: onboot brings every VM back and refresh + up proposes nothing", async () => {
    const vmids = members.map(vmidOf);
    sim.rebootNode();
    assert.deepEqual(
      stepSummary(await upWithRefresh(await nextDeployment(), members)),
      members.map((m) => `${m.name}:same`),
    );
    assert.deepEqual(members.map(vmidOf), vmids);
    // One with onboot turned off by hand stays off after the reboot; up starts it and sets onboot again.
    vmOf(members[1]!).config.onboot = "0";
    sim.rebootNode();
    assert.equal(vmOf(members[1]!).status, "stopped");
    assert.deepEqual(stepSummary(await upWithRefresh(await nextDeployment(), members)), [
      `${members[0]!.name}:same`,
      `${members[1]!.name}:update`,
    ]);
    assert.equal(vmOf(members[1]!).config.onboot, "1");
    await assertFullStrength();
  });

  it("a VM destroyed out of band leaves its seed: refresh keeps it, up replaces it and the seed goes", async () => {
    const [deleted] = members as [Member];
    const vmid = vmidOf(deleted);
    const seed = seedOf(deleted);
    sim.removeVmOutOfBand(vmid);
    const refreshed = await refreshAll(await nextDeployment(), members);
    assert.equal(refreshed[0]!.dropped, false);
    assert.match(
      String(refreshed[0]!.outputs!.replaceBecause),
      /VM \d+ gone .* seed .* left behind/,
    );
    assert.deepEqual(stepSummary(await upAll(server, members)), [
      `${deleted.name}:replace(delete first)`,
      `${members[1]!.name}:same`,
    ]);
    assert.equal(seedOf(deleted), seed, "the same name, so the same seed volume, made anew");
    await assertFullStrength();
  });

  it("a VM destroyed with its seed: refresh drops it, up creates it again", async () => {
    const [, deleted] = members as [Member, Member];
    sim.removeVmOutOfBand(vmidOf(deleted));
    sim.storages.get("seeds")!.files.delete(seedOf(deleted));
    const refreshed = await refreshAll(await nextDeployment(), members);
    assert.equal(refreshed[1]!.dropped, true);
    assert.deepEqual(stepSummary(await upAll(server, members)), [
      `${members[0]!.name}:same`,
      `${deleted.name}:create`,
    ]);
    await assertFullStrength();
  });

  it("a boot disk or a seed removed out of band: refresh shows it, up replaces the VM", async () => {
    const [noDisk, noSeed] = members as [Member, Member];
    const births = members.map(bornOf);
    delete vmOf(noDisk).config.scsi0;
    Object.assign(vmOf(noDisk), { status: "stopped", startedAt: undefined });
    sim.storages.get("seeds")!.files.delete(seedOf(noSeed));
    const refreshed = await refreshAll(await nextDeployment(), members);
    assert.match(String(refreshed[0]!.outputs!.replaceBecause), /boot disk gone/);
    assert.match(String(refreshed[1]!.outputs!.replaceBecause), /seed .*-seed\.iso gone/);
    assert.deepEqual(stepSummary(await upAll(server, members)), [
      `${noDisk.name}:replace(delete first)`,
      `${noSeed.name}:replace(delete first)`,
    ]);
    members.forEach((member, index) => assert.notEqual(bornOf(member), births[index]));
    await assertFullStrength();
  });

  it("a VM started again that does not become ready in its budget is replaced once, never in a loop", async () => {
    const [slow, other] = members as [Member, Member];
    const vmid = vmidOf(slow);
    const born = bornOf(slow);
    Object.assign(vmOf(slow), { status: "stopped", startedAt: undefined });
    sim.options.agentNeverUp = true;
    try {
      await declare({ timeouts: { createSeconds: 60, readySeconds: 3, deleteSeconds: 60 } });
      const first = await upWithRefresh(await nextDeployment(), members);
      assert.deepEqual(stepSummary(first), [`${slow.name}:update!`, `${other.name}:update`]);
      assert.match(first[0]!.error!, /not ready \d+ s after `up` started it again/);
      assert.match(String(slow.stored!.outputs.replaceBecause), /not ready/);
      assert.equal(vmidOf(slow), vmid);
      const second = await upWithRefresh(await nextDeployment(), members);
      assert.deepEqual(stepSummary(second), [
        `${slow.name}:replace(delete first)!`,
        `${other.name}:same`,
      ]);
      const replacement = bornOf(slow);
      assert.notEqual(replacement, born, "a new VM");
      assert.equal(slow.stored!.outputs.createIncomplete, true);
      assertNodeHoldsExactlyState();
      const third = await upWithRefresh(await nextDeployment(), members);
      assert.deepEqual(stepSummary(third), [`${slow.name}:update!`, `${other.name}:same`]);
      assert.equal(bornOf(slow), replacement, "continued, not replaced again");
    } finally {
      sim.options.agentNeverUp = false;
    }
    await declare();
    assert.deepEqual(stepSummary(await upWithRefresh(await nextDeployment(), members)), [
      `${slow.name}:update`,
      `${other.name}:update`,
    ]);
    await assertFullStrength();
  });

  it("a node gone for good: delete fails with the way out; listed in goneHosts it gives up, says what it leaves, and the reaper removes that when the node is back", async () => {
    const member = members[1]!;
    const stored = member.stored!;
    const goneName = String(stored.outputs.vmName);
    const deadPort = await new Promise<number>((resolvePort) => {
      const probe = createServer().listen(0, "127.0.0.1", () => {
        const { port } = probe.address() as { port: number };
        probe.close(() => resolvePort(port));
      });
    });
    const goneOutputs = {
      ...stored.outputs,
      apiEndpoint: `https://127.0.0.1:${deadPort}`,
      timeouts: { createSeconds: 60, readySeconds: 20, deleteSeconds: 10 },
    };
    await assert.rejects(
      server.delete(member.urn, stored.id, goneOutputs),
      /if 127\.0\.0\.1:\d+ is gone for good, list it in egress-proxies:goneHosts/,
    );
    const engine = await fixture.startEngine();
    const released = await fixture.startServer({
      engine,
      config: { "egress-proxies:goneHosts": `127.0.0.1:${deadPort}` },
    });
    const refreshed = await released.read(member.urn, stored.id, goneOutputs, stored.inputs);
    assert.equal(refreshed.id, stored.id);
    await released.delete(member.urn, stored.id, goneOutputs);
    const deadline = Date.now() + 5000;
    while (!engine.logs.some((l) => /left behind/.test(l.message)) && Date.now() < deadline)
      await new Promise((wait) => setTimeout(wait, 100));
    const warning = engine.logs.find((l) => /left behind/.test(l.message));
    assert.ok(warning, JSON.stringify(engine.logs));
    assert.ok(warning.message.includes(`VM ${vmidOf(member)} (`), warning.message);
    assert.ok(warning.message.includes(`seed ${seedOf(member)}`), warning.message);
    // Left behind indeed. The "node comes back" (the simulator never went away): the reaper, given the
    // stack's state without it, finds the VM and its seed as orphans of this stack and removes them.
    assert.ok(sim.vms.has(vmidOf(member)));
    member.stored = undefined;
    const workDir = mkdtempSync(join(tmpdir(), "pve-heal-reaper-"));
    try {
      const { project, stack } = CONSUMER_IDENTITY;
      const stateFile = join(workDir, "state.json");
      const tokenFile = join(workDir, "token");
      const caCertFile = join(workDir, "ca.pem");
      writeFileSync(tokenFile, `${sim.tokenFor()}\n`);
      writeFileSync(caCertFile, sim.caCertPem);
      const kept = members.filter((m) => m.stored !== undefined);
      writeFileSync(
        stateFile,
        JSON.stringify({
          version: 3,
          deployment: {
            resources: [
              { urn: `urn:pulumi:${stack}::${project}::pulumi:pulumi:Stack::${project}-${stack}` },
              ...kept.map((m) => ({
                urn: m.urn,
                id: m.stored!.id,
                custom: true,
                outputs: { vmName: m.stored!.outputs.vmName },
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
          proxmox: [
            {
              name: "pve",
              apiEndpoint: sim.endpoint,
              apiTokenFile: tokenFile,
              caCertFile,
              nodes: [{ node: sim.node, seedStorage: "seeds" }],
              deleteTimeoutSeconds: 30,
            },
          ],
        }),
        { apply: true, json: true, minAgeMs: 0, pruneImages: false, project },
        { out: (text) => (out += text), err: (text) => (err += `${text}\n`) },
        { openKvm: () => Promise.reject(new Error("no KVM backends here")) },
      );
      assert.equal(status, EXIT.ok, err);
      const report = JSON.parse(out) as { removed: Array<{ name: string; outcome: string }> };
      assert.ok(
        report.removed.some((r) => r.name === goneName && r.outcome === "removed"),
        JSON.stringify(report.removed),
      );
    } finally {
      rmSync(workDir, { recursive: true, force: true });
    }
    assertNodeHoldsExactlyState();
  });
});
