/**
 * The egress re-check on refresh and the rule the next `up` follows, through
 * the real dynamic-provider gRPC server: ProxmoxProxy on the simulator, whose
 * guest "reports" 127.0.0.2, where a squid-like proxy with basic auth listens
 * and leaves from 127.0.0.3; the echo service on 127.0.0.1 tells the address.
 * The proxy is then moved to another exit address, silenced, or left silent
 * through a restart; and VMs are rotated by name and by age, the new one
 * ready first.
 */
import assert from "node:assert/strict";
import type { PveSimulator } from "../pve-sim/simulator";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";
import { simulatorProxyArgs, useEngineFixture } from "./engine-fixture";
import {
  captureResourceInputs,
  EngineCallError,
  type CapturedResource,
  type DynamicProviderServer,
  type Props,
} from "./harness";
import { planSummary, refreshThenPlan, type StoredResource } from "./resync";

const AUTH = { user: "crawler", password: "engine recheck secret" };

describe("engine: egress re-checked on refresh, healed by up (ProxmoxProxy, simulator)", function () {
  this.timeout(180_000);
  const fixture = useEngineFixture();
  let sim: PveSimulator;
  let echo: RunningServer;
  let proxy: ForwardProxy;
  let server: DynamicProviderServer;
  let captured: CapturedResource;

  before(async () => {
    sim = await fixture.startSimulator({ guestAddress: () => "127.0.0.2" });
    echo = await startEchoServer("127.0.0.1");
    proxy = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress: "127.0.0.3" });
    captured = await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      "edge-recheck",
      simulatorProxyArgs(sim, {
        readiness: { mode: "port", port: proxy.port },
        egressCheck: { url: `http://127.0.0.1:${echo.port}/`, proxyAuth: AUTH },
        egressRecheck: true,
        timeouts: { createSeconds: 60, readySeconds: 8, deleteSeconds: 60 },
      }),
    );
    server = await fixture.startServer({
      config: { "egress-proxies:proxmoxApiToken": sim.tokenFor() },
    });
  });

  after(async () => {
    await proxy?.close();
    await echo?.close();
  });

  /** The proxy again on the same port (a VM's squid back, or leaving from another address). */
  async function proxyAgain(egressAddress: string): Promise<void> {
    const port = proxy.port;
    await proxy.close();
    proxy = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress, port });
  }

  /** Silences the proxy (squid dead on a running VM): connections to its port are refused. */
  const silence = () => proxy.close();

  async function createProxy(program: Props = captured.inputs): Promise<StoredResource> {
    const checked = await server.check(captured.urn, {}, program);
    assert.deepEqual(checked.failures, []);
    const created = await server.create(captured.urn, checked.inputs);
    return { id: created.id, outputs: created.properties, inputs: checked.inputs };
  }

  /** `pulumi up`'s plan against refreshed state. */
  async function planAfter(
    stored: StoredResource,
    refreshed: { properties: Props; inputs: Props },
    program: Props = captured.inputs,
  ) {
    const checked = await server.check(captured.urn, refreshed.inputs, program);
    const diff = await server.diff(captured.urn, stored.id, refreshed.properties, checked.inputs);
    return { checked, diff };
  }

  const vmidOf = (stored: StoredResource) => Number(stored.outputs.vmid);

  it("a healthy proxy: refresh + plan is quiet three times; only checkedAt moves, to each check's time", async () => {
    const stored = await createProxy();
    assert.equal(stored.outputs.egressIp, "127.0.0.3");
    const rounds = await refreshThenPlan(server, captured.urn, stored, captured.inputs);
    assert.deepEqual(planSummary(rounds), ["none", "none", "none"]);
    let before = String(stored.outputs.checkedAt);
    for (const round of rounds) {
      assert.ok(
        String(round.stored.outputs.checkedAt) > before,
        "the time of the last check that ran",
      );
      before = String(round.stored.outputs.checkedAt);
      assert.equal(round.stored.outputs.egressIp, "127.0.0.3");
      assert.equal(round.stored.outputs.egressProblem, null);
    }
    await server.delete(captured.urn, stored.id, rounds.at(-1)!.stored.outputs);
  });

  it("a changed exit address shows on refresh and is accepted: republished, nothing replaced", async () => {
    const stored = await createProxy();
    await proxyAgain("127.0.0.4");
    const refreshed = await server.read(captured.urn, stored.id, stored.outputs, stored.inputs);
    assert.equal(refreshed.properties.egressIp, "127.0.0.4");
    assert.notEqual(refreshed.properties.checkedAt, stored.outputs.checkedAt);
    assert.equal(refreshed.properties.egressProblem, null);
    const { checked, diff } = await planAfter(stored, refreshed);
    assert.equal(diff.changes, "none");
    const next = { id: stored.id, outputs: refreshed.properties, inputs: checked.inputs };
    const rounds = await refreshThenPlan(server, captured.urn, next, captured.inputs, 2);
    assert.deepEqual(planSummary(rounds), ["none", "none"]);
    assert.ok(
      String(rounds.at(-1)!.stored.outputs.checkedAt) > String(refreshed.properties.checkedAt),
    );
    await proxyAgain("127.0.0.3");
    await server.delete(captured.urn, stored.id, next.outputs);
  });

  it("a proxy that stopped answering is drift; up restarts the same VM and it answers again", async () => {
    const stored = await createProxy();
    const vmid = vmidOf(stored);
    await silence();
    const refreshed = await server.read(captured.urn, stored.id, stored.outputs, stored.inputs);
    const problem = refreshed.properties.egressProblem as Record<string, string>;
    assert.match(problem.reason, /127\.0\.0\.2/);
    // Corroborated: the guest's agent (agent/file-read of /proc/net/tcp) sees nothing on the port either.
    assert.equal(problem.kind, "unanswered");
    assert.match(
      problem.reason,
      new RegExp(`the guest agent reports nothing listening on port ${proxy.port}$`),
    );
    assert.equal(refreshed.properties.state, "running");
    assert.equal(refreshed.properties.egressIp, "127.0.0.3", "the last known address stays");
    const { checked, diff } = await planAfter(stored, refreshed);
    assert.deepEqual([diff.changes, diff.replaces], ["some", []]);

    // The restart shuts the VM down (not a hard stop: the guest powers off); squid comes back with it.
    const startedBefore = sim.vms.get(vmid)!.startedAt;
    const requestsBefore = sim.requestLog.length;
    const back = (async () => {
      while (sim.vms.get(vmid)!.status !== "stopped") await new Promise((r) => setTimeout(r, 10));
      await proxyAgain("127.0.0.3");
    })();
    const healed = await server.update(
      captured.urn,
      stored.id,
      refreshed.properties,
      checked.inputs,
    );
    await back;
    assert.equal(healed.egressProblem, null);
    assert.equal(healed.egressIp, "127.0.0.3");
    assert.equal(healed.vmid, vmid, "the same VM");
    assert.notEqual(sim.vms.get(vmid)!.startedAt, startedBefore, "started again");
    assert.deepEqual(
      sim.requestLog
        .slice(requestsBefore)
        .filter((line) => line.includes(`/qemu/${vmid}/status/`) && line.startsWith("POST"))
        .map((line) => line.replace(/^.*\/status\//, "")),
      ["shutdown", "start"],
    );
    const after = { id: stored.id, outputs: healed, inputs: checked.inputs };
    const rounds = await refreshThenPlan(server, captured.urn, after, captured.inputs);
    assert.deepEqual(planSummary(rounds), ["none", "none", "none"]);
    await server.delete(captured.urn, stored.id, healed);
  });

  it("silent from here while the guest listens (its agent's socket tables): path unknown, not restarted; a restart once the guest's port is closed too", async () => {
    const stored = await createProxy();
    const vmid = vmidOf(stored);
    const port = proxy.port;
    await silence();
    sim.guestListens = (id) => (id === vmid ? [22, port] : [22]);
    try {
      const refreshed = await server.read(captured.urn, stored.id, stored.outputs, stored.inputs);
      const problem = refreshed.properties.egressProblem as Record<string, string>;
      assert.equal(problem.kind, "path-unknown");
      assert.match(problem.reason, new RegExp(`the guest agent reports port ${port} listening$`));
      assert.ok(
        sim.requestLog.includes(`GET /api2/json/nodes/pve/qemu/${vmid}/agent/file-read`),
        "asked the guest",
      );
      // Nothing to do in place, and again on the next refresh (the time it was first seen is kept).
      const { checked, diff } = await planAfter(stored, refreshed);
      assert.equal(diff.changes, "none", "a restart cannot mend a path");
      const again = await server.read(
        captured.urn,
        stored.id,
        refreshed.properties,
        checked.inputs,
      );
      assert.equal((again.properties.egressProblem as Record<string, string>).since, problem.since);
      assert.equal((await planAfter(stored, again)).diff.changes, "none");

      // The guest's port closes as well: now it is dead, and the next up restarts it.
      sim.guestListens = () => [22];
      const dead = await server.read(captured.urn, stored.id, again.properties, checked.inputs);
      assert.equal((dead.properties.egressProblem as Record<string, string>).kind, "unanswered");
      assert.deepEqual((await planAfter(stored, dead)).diff.changes, "some");
    } finally {
      sim.guestListens = () => [22];
      await proxyAgain("127.0.0.3");
    }
    await server.delete(captured.urn, stored.id, stored.outputs);
  });

  it("still silent after the restart: recorded, then the next refresh + up replaces it, new VM first", async () => {
    const stored = await createProxy();
    await silence();
    const refreshed = await server.read(captured.urn, stored.id, stored.outputs, stored.inputs);
    const { checked } = await planAfter(stored, refreshed);
    const failed = await server
      .update(captured.urn, stored.id, refreshed.properties, checked.inputs)
      .then(
        () => assert.fail("the restart cannot bring a silent proxy back"),
        (error: unknown) => error as EngineCallError,
      );
    assert.ok(failed.initFailure, failed.message);
    assert.match(failed.message, /next `pulumi up --refresh` replaces it/);
    const recorded = failed.initFailure.properties;
    assert.ok((recorded.egressProblem as Record<string, string>).restartedAt);

    // An `up` without a refresh in between restarts it no second time.
    const noRefresh = await server.diff(captured.urn, stored.id, recorded, checked.inputs);
    assert.equal(noRefresh.changes, "none");
    // The engine keeps the VM with those outputs; the next `up --refresh` reports it for rotation.
    const failedState = { id: stored.id, outputs: recorded, inputs: checked.inputs };
    const again = await server.read(captured.urn, stored.id, recorded, checked.inputs);
    assert.match(String(again.inputs.rotation), /^replace: no egress answer after the restart at /);
    const plan = await planAfter(failedState, again);
    assert.ok(plan.diff.replaces.includes("rotation"), plan.diff.replaces.join());
    assert.equal(plan.diff.deleteBeforeReplace, false);
    assert.notEqual(plan.checked.inputs.vmName, stored.inputs.vmName, "a new name: no collision");

    // Create-before-delete, as the engine runs it: the new VM is ready and checked while the old one stays.
    await proxyAgain("127.0.0.3");
    const replacement = await server.create(captured.urn, plan.checked.inputs);
    assert.equal(replacement.properties.egressIp, "127.0.0.3");
    assert.equal(sim.vms.has(vmidOf(stored)), true, "the old VM is still there");
    await server.delete(captured.urn, stored.id, again.properties);
    assert.equal(sim.vms.has(vmidOf(stored)), false);
    await server.delete(captured.urn, replacement.id, replacement.properties);
  });

  it("rotation by name (the pool's `rotate`): only that member is replaced, the new VM ready before the old one goes", async () => {
    const members = [await createProxy(), await createProxy()];
    const ready = () =>
      [...sim.vms.values()].filter((vm) => vm.status === "running" && vm.config.template !== "1")
        .length;
    const count = members.length;
    assert.equal(ready(), count);
    // The pool sets `rotation` on the member its `rotate` names; the other's inputs stay as they were.
    const programs = [captured.inputs, { ...captured.inputs, rotation: "2026-12-03" }];
    const plans = await Promise.all(
      members.map(async (stored, index) => {
        const refreshed = await server.read(captured.urn, stored.id, stored.outputs, stored.inputs);
        return { stored, refreshed, ...(await planAfter(stored, refreshed, programs[index])) };
      }),
    );
    assert.deepEqual(
      plans.map(({ diff }) => planSummary([{ diff, stored: undefined as never }])[0]),
      ["none", "some (replaces: vmName,rotation)"],
    );
    const { stored, refreshed, checked, diff } = plans[1]!;
    assert.equal(diff.deleteBeforeReplace, false);
    assert.notEqual(checked.inputs.vmName, stored.inputs.vmName, "a new name: no collision");

    // Create before delete: the pool has count + 1 ready VMs until the old one goes, never fewer than count.
    const replacement = await server.create(captured.urn, checked.inputs);
    assert.equal(replacement.properties.egressIp, "127.0.0.3", "checked before the old one goes");
    assert.equal(ready(), count + 1, "old and new side by side");
    await server.delete(captured.urn, stored.id, refreshed.properties);
    assert.equal(ready(), count);

    // The entry kept: the same text rotates nothing more.
    const next = { id: replacement.id, outputs: replacement.properties, inputs: checked.inputs };
    const rounds = await refreshThenPlan(server, captured.urn, next, programs[1]!, 2);
    assert.deepEqual(planSummary(rounds), ["none", "none"]);
    await server.delete(captured.urn, replacement.id, rounds.at(-1)!.stored.outputs);
    await server.delete(captured.urn, members[0]!.id, plans[0]!.refreshed.properties);
  });

  it("rotation by exit address (`rotateEgress`): only the member leaving from it is replaced, old VM first, and not again", async () => {
    // Two members on two exit addresses: the first leaves from .3, the second (made after the proxy moved) from .4.
    const first = await createProxy();
    await proxyAgain("127.0.0.4");
    const second = await createProxy();
    assert.deepEqual([first.outputs.egressIp, second.outputs.egressIp], ["127.0.0.3", "127.0.0.4"]);
    // The pool gives every VM member the same address entries. A plain `up` (no refresh): state decides.
    const program = { ...captured.inputs, rotateEgress: { "127.0.0.4": "burned-2026-12-05" } };
    const plans = await Promise.all(
      [first, second].map(async (stored) => ({
        stored,
        ...(await planAfter(
          stored,
          { properties: stored.outputs, inputs: stored.inputs },
          program,
        )),
      })),
    );
    assert.deepEqual(
      plans.map(({ diff }) => planSummary([{ diff, stored: undefined as never }])[0]),
      ["none", "some (replaces: rotateEgress)"],
    );
    const { stored, checked, diff } = plans[1]!;
    assert.equal(diff.deleteBeforeReplace, true, "check cannot rename: the old VM goes first");
    assert.equal(checked.inputs.vmName, stored.inputs.vmName);
    await server.delete(captured.urn, stored.id, stored.outputs);
    assert.equal(sim.vms.has(vmidOf(stored)), false);
    const replacement = await server.create(captured.urn, checked.inputs);
    // The new VM still leaves from .4 (one proxy here, as one NAT for a whole network): never replaced again.
    assert.equal(replacement.properties.egressIp, "127.0.0.4");
    const next = { id: replacement.id, outputs: replacement.properties, inputs: checked.inputs };
    const rounds = await refreshThenPlan(server, captured.urn, next, program, 2);
    assert.deepEqual(planSummary(rounds), ["none", "none"]);
    // A new text rotates again; more entries for other addresses change nothing on either member.
    const again = await planAfter(
      next,
      { properties: next.outputs, inputs: next.inputs },
      {
        ...program,
        rotateEgress: { "127.0.0.4": "burned-again" },
      },
    );
    assert.equal(
      planSummary([{ diff: again.diff, stored: undefined as never }])[0],
      "some (replaces: rotateEgress)",
    );
    const more = {
      ...captured.inputs,
      rotateEgress: { "127.0.0.4": "burned-2026-12-05", "127.0.0.9": "x" },
    };
    for (const member of [next, first]) {
      const plan = await planAfter(
        member,
        { properties: member.outputs, inputs: member.inputs },
        more,
      );
      assert.equal(plan.diff.changes, "none");
    }
    await proxyAgain("127.0.0.3");
    await server.delete(captured.urn, replacement.id, next.outputs);
    await server.delete(captured.urn, first.id, first.outputs);
  });

  it("rotation by age: only the aged members are replaced, each new VM ready before an old one goes", async () => {
    // Three members, two of them with an age limit they pass at once.
    const aged = { ...captured.inputs, rotateAfterDays: 0.000001 };
    const members = [await createProxy(aged), await createProxy(aged), await createProxy()];
    const programs = [aged, aged, captured.inputs];
    const ready = () =>
      [...sim.vms.values()].filter((vm) => vm.status === "running" && vm.config.template !== "1")
        .length;
    const floor = members.length;
    assert.equal(ready(), floor);
    await new Promise((resolve) => setTimeout(resolve, 200));

    const plans = await Promise.all(
      members.map(async (stored, index) => {
        const refreshed = await server.read(captured.urn, stored.id, stored.outputs, stored.inputs);
        return { stored, refreshed, ...(await planAfter(stored, refreshed, programs[index])) };
      }),
    );
    assert.deepEqual(
      plans.map(({ diff }) => planSummary([{ diff, stored: undefined as never }])[0]),
      ["some (replaces: vmName,rotation)", "some (replaces: vmName,rotation)", "none"],
    );
    for (const { diff, refreshed } of plans.slice(0, 2)) {
      assert.equal(diff.deleteBeforeReplace, false);
      assert.match(
        String(refreshed.inputs.rotation),
        /^replace: older than 0.000001 days \(created /,
      );
    }

    // The engine's order for create-before-delete: every replacement created (ready) first, then the deletes.
    const replacements = await Promise.all(
      plans.slice(0, 2).map(({ checked }) => server.create(captured.urn, checked.inputs)),
    );
    assert.equal(ready(), floor + 2, "old and new side by side");
    for (const [index, { stored, refreshed }] of plans.slice(0, 2).entries()) {
      await server.delete(captured.urn, stored.id, refreshed.properties);
      assert.ok(ready() >= floor, `after deleting old member ${index}: ${ready()} ready`);
    }
    assert.equal(ready(), floor);
    for (const replacement of replacements)
      await server.delete(captured.urn, replacement.id, replacement.properties);
    await server.delete(captured.urn, members[2]!.id, members[2]!.outputs);
  });
});
