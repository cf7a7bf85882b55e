/**
 * The disruption budget through the real dynamic-provider gRPC server:
 * four ProxmoxProxy members of one pool (disruptionBudget maxUnavailable 1,
 * as EgressProxyPool sets it) on the simulator, each `pulumi up` a fresh
 * server process as the engine starts one per deployment, asked in
 * registration order. Silent members that an earlier refresh found are
 * restarted one per `up`, and the warnings reach the engine's log naming the
 * others; an `up --refresh` that finds most members silent restarts none (the
 * runner is the likelier fault); a new
 * rotate text on every member rolls one per `up`; a scale-down delete waits
 * while another member's replacement holds the place.
 */
import assert from "node:assert/strict";
import { tryTcpConnect } from "../../provider/common/readiness";
import type { PveSimulator } from "../pve-sim/simulator";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";
import { captureSimulatorMembers, useEngineFixture } from "./engine-fixture";
import {
  type CapturedResource,
  type DynamicProviderServer,
  type FakeEngine,
  type Props,
} from "./harness";
import { planSummary, type StoredResource } from "./resync";

const AUTH = { user: "crawler", password: "engine budget secret" };
/** Each member's drain: long enough to see, short enough for a quick suite. */
const DRAIN_SECONDS = 1;
const MEMBERS = ["crawl-pve-0", "crawl-pve-1", "crawl-pve-2", "crawl-pve-3"];
const INDEXES = MEMBERS.map((_, index) => index);
const NOTHING_PLANNED = MEMBERS.map(() => "none");
const WARNING = 2;

/** Samples availability every second (and once at once) until stopped. */
class AvailabilitySampler {
  private readonly samples: Array<{ published: number; answering: number }> = [];
  private stopped = false;
  private readonly loop: Promise<void>;

  constructor(private readonly sample: () => Promise<{ published: number; answering: number }>) {
    this.loop = (async () => {
      while (!this.stopped) {
        const started = Date.now();
        this.samples.push(await this.sample());
        await new Promise((resolve) =>
          setTimeout(resolve, Math.max(0, 1000 - (Date.now() - started))),
        );
      }
    })();
  }

  async stop(): Promise<Array<{ published: number; answering: number }>> {
    this.stopped = true;
    await this.loop;
    return this.samples;
  }
}

describe("engine: the pool's disruption budget (ProxmoxProxy, simulator, one server per deployment)", function () {
  this.timeout(180_000);
  const fixture = useEngineFixture();
  let sim: PveSimulator;
  let echo: RunningServer;
  let proxy: ForwardProxy;
  let captured: CapturedResource[];
  let config: Record<string, string>;

  before(async () => {
    sim = await fixture.startSimulator({ guestAddress: () => "127.0.0.2" });
    echo = await startEchoServer("127.0.0.1");
    proxy = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress: "127.0.0.3" });
    captured = await captureSimulatorMembers(
      fixture.project,
      sim,
      MEMBERS,
      { proxyPort: proxy.port, echoPort: echo.port, auth: AUTH },
      { disruptionBudget: { group: "crawl", maxUnavailable: 1, drainSeconds: DRAIN_SECONDS } },
    );
    config = { "egress-proxies:proxmoxApiToken": sim.tokenFor() };
  });

  // A test that failed while the proxy was silenced must not fail the next ones: the path comes back.
  afterEach(async () => {
    const answers = await tryTcpConnect("127.0.0.2", proxy.port, 2000).then(
      () => true,
      () => false,
    );
    if (!answers)
      proxy = await startForwardProxy({
        host: "127.0.0.2",
        auth: AUTH,
        egressAddress: "127.0.0.3",
        port: proxy.port,
      });
  });

  after(async () => {
    await proxy?.close();
    await echo?.close();
  });

  /** One deployment: its own server process (and ledger), logging to its own engine. */
  async function deployment(): Promise<{ server: DynamicProviderServer; engine: FakeEngine }> {
    const engine = await fixture.startEngine();
    return { server: await fixture.startServer({ config, engine }), engine };
  }

  async function createMembers(server: DynamicProviderServer): Promise<StoredResource[]> {
    const stored: StoredResource[] = [];
    for (const member of captured) {
      const checked = await server.check(member.urn, {}, member.inputs);
      assert.deepEqual(checked.failures, []);
      const created = await server.create(member.urn, checked.inputs);
      stored.push({ id: created.id, outputs: created.properties, inputs: checked.inputs });
    }
    return stored;
  }

  /** `up`'s plan for every member in registration order: check, then diff, as the engine asks. */
  async function planAll(
    server: DynamicProviderServer,
    stored: StoredResource[],
    programs: Props[],
  ) {
    const plans = [];
    for (const [index, member] of captured.entries()) {
      const checked = await server.check(member.urn, stored[index]!.inputs, programs[index]!);
      assert.deepEqual(checked.failures, []);
      const diff = await server.diff(
        member.urn,
        stored[index]!.id,
        stored[index]!.outputs,
        checked.inputs,
      );
      plans.push({ checked, diff });
    }
    return plans;
  }

  const summaries = (plans: Array<{ diff: Parameters<typeof planSummary>[0][0]["diff"] }>) =>
    planSummary(plans.map(({ diff }) => ({ diff, stored: undefined as never })));
  const warnings = (engine: FakeEngine) =>
    engine.logs.filter((line) => line.severity === WARNING).map((line) => line.message);
  /** The provider sends its log lines without waiting for them: the engine sees them a moment later. */
  async function logged(engine: FakeEngine, wanted: (lines: string[]) => boolean): Promise<void> {
    for (
      let waited = 0;
      waited < 10_000 && !wanted(engine.logs.map((line) => line.message));
      waited += 50
    )
      await new Promise((resolve) => setTimeout(resolve, 50));
  }

  /** `pulumi destroy`: a deployment whose program registers nothing (so nothing drains). */
  async function removeAll(stored: StoredResource[]) {
    const { server } = await deployment();
    for (const [index, member] of stored.entries())
      await server.delete(captured[index]!.urn, member.id, member.outputs);
  }

  it("silent members a refresh found: each `up` restarts one member, the others are named and left alone", async () => {
    const first = await deployment();
    let stored = await createMembers(first.server);
    // The runner's path is gone: a refresh finds every member silent.
    await proxy.close();
    stored = await Promise.all(
      stored.map(async (member, index) => {
        const read = await first.server.read(
          captured[index]!.urn,
          member.id,
          member.outputs,
          member.inputs,
        );
        assert.equal((read.properties.egressProblem as { kind?: string }).kind, "unanswered");
        return { id: member.id, outputs: read.properties, inputs: read.inputs };
      }),
    );
    const programs = captured.map((member) => member.inputs);
    for (const [round, restarted] of INDEXES.entries()) {
      const { server, engine } = await deployment();
      const plans = await planAll(server, stored, programs);
      // Only members still asking are planned; the first of them gets the one place.
      assert.deepEqual(
        summaries(plans),
        MEMBERS.map((_, index) => (index === restarted ? "some (replaces: )" : "none")),
        `up ${round + 1}`,
      );
      const deferred = MEMBERS.slice(restarted + 1);
      await logged(engine, () => warnings(engine).length >= deferred.length);
      assert.deepEqual(
        warnings(engine).map((line) => line.split(":")[0]),
        deferred,
        `up ${round + 1} names the deferred members`,
      );
      for (const line of warnings(engine))
        assert.match(
          line,
          new RegExp(
            `restart \\(its proxy did not answer the last re-check\\) deferred by the disruption budget of pool "crawl" \\(maxUnavailable 1, held by ${MEMBERS[restarted]}\\)`,
          ),
        );
      // The restart: squid answers again once the VM is back (the path is back too).
      if (round === 0)
        proxy = await startForwardProxy({
          host: "127.0.0.2",
          auth: AUTH,
          egressAddress: "127.0.0.3",
          port: proxy.port,
        });
      const member = captured[restarted]!;
      const updated = await server.update(
        member.urn,
        stored[restarted]!.id,
        stored[restarted]!.outputs,
        plans[restarted]!.checked.inputs,
      );
      assert.equal(updated.egressProblem, null);
      stored[restarted] = {
        id: stored[restarted]!.id,
        outputs: updated,
        inputs: plans[restarted]!.checked.inputs,
      };
    }
    const { server } = await deployment();
    assert.deepEqual(summaries(await planAll(server, stored, programs)), NOTHING_PLANNED);
    await removeAll(stored);
  });

  it("`up --refresh` in a bad hour: the refresh finds most members silent, so no member is restarted at all", async () => {
    let stored = await createMembers((await deployment()).server);
    const programs = captured.map((member) => member.inputs);
    /** One `up --refresh`: every member read, then planned, in one server process. */
    async function upWithRefresh() {
      const { server, engine } = await deployment();
      stored = await Promise.all(
        stored.map(async (member, index) => {
          const read = await server.read(
            captured[index]!.urn,
            member.id,
            member.outputs,
            member.inputs,
          );
          return { id: member.id, outputs: read.properties, inputs: read.inputs };
        }),
      );
      return { server, engine, plans: await planAll(server, stored, programs) };
    }
    await proxy.close();
    const dark = await upWithRefresh();
    assert.deepEqual(summaries(dark.plans), NOTHING_PLANNED);
    await logged(dark.engine, () => warnings(dark.engine).length >= MEMBERS.length);
    assert.deepEqual(
      warnings(dark.engine).map((line) => line.split(":")[0]),
      MEMBERS,
    );
    for (const line of warnings(dark.engine))
      assert.match(
        line,
        new RegExp(
          `not restarted: ${MEMBERS.length} of the ${MEMBERS.length} members this refresh re-checked gave no answer: more likely this runner lost its path`,
        ),
      );
    // The path is back: the next resync finds every member answering and has nothing to do.
    proxy = await startForwardProxy({
      host: "127.0.0.2",
      auth: AUTH,
      egressAddress: "127.0.0.3",
      port: proxy.port,
    });
    const back = await upWithRefresh();
    assert.deepEqual(summaries(back.plans), NOTHING_PLANNED);
    for (const member of stored) assert.equal(member.outputs.egressProblem, null);
    await removeAll(stored);
  });

  it("a new rotate text on every member rolls one per `up`, each new VM ready before its old one goes: sampled every second, never fewer than count - 1 published and answering", async () => {
    let stored = await createMembers((await deployment()).server);
    const programs = captured.map((member) => ({ ...member.inputs, rotation: "2026-12-05" }));
    const originalVmids = stored.map((member) => member.outputs.vmid);
    // What the pool publishes: the members' VMs as state holds them, updated when the engine updates the
    // pool's dependents (after a replacement's create, before the replaced VM's delete).
    let published = stored.map((member) => Number(member.outputs.vmid));
    const sampler = new AvailabilitySampler(async () => {
      const port = await tryTcpConnect("127.0.0.2", proxy.port, 900).then(
        () => true,
        () => false,
      );
      const answering = published.filter(
        (vmid) => port && sim.vms.get(vmid)?.status === "running" && !sim.vms.get(vmid)?.paused,
      );
      return { published: published.length, answering: answering.length };
    });
    for (const rotated of INDEXES) {
      const { server } = await deployment();
      const plans = await planAll(server, stored, programs);
      assert.deepEqual(
        summaries(plans).map((line, index) =>
          index === rotated
            ? line.startsWith("some (replaces:") && plans[index]!.diff.replaces.includes("rotation")
            : line,
        ),
        MEMBERS.map((_, index) => (index === rotated ? true : "none")),
        `up ${rotated + 1}`,
      );
      // What state keeps for a deferred member: its old name and no rotation, so the next up asks again.
      for (const index of INDEXES.filter((other) => other > rotated)) {
        assert.equal(plans[index]!.checked.inputs.vmName, stored[index]!.inputs.vmName);
        assert.equal(plans[index]!.checked.inputs.rotation, undefined);
      }
      const member = captured[rotated]!;
      const replacement = await server.create(member.urn, plans[rotated]!.checked.inputs);
      assert.equal(
        sim.vms.has(Number(stored[rotated]!.outputs.vmid)),
        true,
        "old and new side by side",
      );
      published = published.map((vmid, index) =>
        index === rotated ? Number(replacement.properties.vmid) : vmid,
      );
      await server.delete(member.urn, stored[rotated]!.id, stored[rotated]!.outputs);
      stored[rotated] = {
        id: replacement.id,
        outputs: replacement.properties,
        inputs: plans[rotated]!.checked.inputs,
      };
      // Deferred members are stored as planned (the engine writes the checked inputs of a no-change step).
      stored = stored.map((old, index) =>
        index > rotated ? { ...old, inputs: plans[index]!.checked.inputs } : old,
      );
    }
    const samples = await sampler.stop();
    console.log(
      `      [budget] ${samples.length} samples over ${MEMBERS.length} ups: fewest published ` +
        `${Math.min(...samples.map((sample) => sample.published))}, fewest answering ` +
        `${Math.min(...samples.map((sample) => sample.answering))} (count ${MEMBERS.length}, maxUnavailable 1)`,
    );
    assert.ok(samples.length >= MEMBERS.length, `sampled throughout: ${samples.length}`);
    for (const sample of samples) {
      assert.equal(sample.published, MEMBERS.length, "the pool publishes count members");
      assert.ok(sample.answering >= MEMBERS.length - 1, JSON.stringify(sample));
    }
    assert.equal(
      new Set([...originalVmids, ...stored.map((member) => member.outputs.vmid)]).size,
      2 * MEMBERS.length,
    );
    const { server } = await deployment();
    assert.deepEqual(summaries(await planAll(server, stored, programs)), NOTHING_PLANNED);
    await removeAll(stored);
  });

  it("a scale-down delete waits while a replacement holds the place, then goes", async () => {
    const stored = await createMembers((await deployment()).server);
    const { server, engine } = await deployment();
    const programs = captured.map((member, index) =>
      index === 0 ? { ...member.inputs, rotation: "scale" } : member.inputs,
    );
    const [plan] = await planAll(server, stored, programs);
    assert.ok(plan!.diff.replaces.includes("rotation"));
    const replacement = await server.create(captured[0]!.urn, plan!.checked.inputs);
    // The pool shrank to one member: the engine deletes crawl-pve-2 while crawl-pve-0's old VM is still to go.
    let scaledDown = false;
    const deleting = server
      .delete(captured[2]!.urn, stored[2]!.id, stored[2]!.outputs)
      .then(() => (scaledDown = true));
    await logged(engine, (lines) =>
      lines.some((line) => line.startsWith("crawl-pve-2: delete waits")),
    );
    assert.equal(scaledDown, false, "waits for the place crawl-pve-0's replacement holds");
    assert.equal(sim.vms.has(Number(stored[2]!.outputs.vmid)), true);
    assert.ok(
      engine.logs.some((line) =>
        /crawl-pve-2: delete waits for the disruption budget of pool "crawl" \(maxUnavailable 1, held by crawl-pve-0\)/.test(
          line.message,
        ),
      ),
    );
    // The replaced VM is drained (the engine republished without it first), then goes; so is the scaled-down one.
    const started = Date.now();
    await server.delete(captured[0]!.urn, stored[0]!.id, stored[0]!.outputs);
    // (less a few milliseconds: Node may fire a timer early by the wall clock)
    const took = Date.now() - started;
    assert.ok(took >= DRAIN_SECONDS * 1000 - 10, `the replaced VM was drained (${took} ms)`);
    assert.equal(sim.vms.has(Number(stored[0]!.outputs.vmid)), false);
    await deleting;
    assert.equal(sim.vms.has(Number(stored[2]!.outputs.vmid)), false);
    const drained = (name: string) => (lines: string[]) =>
      lines.some((line) =>
        line.startsWith(
          `${name}: draining ${DRAIN_SECONDS} s before its VM is deleted (drainSeconds of pool "crawl")`,
        ),
      );
    for (const name of ["crawl-pve-0", "crawl-pve-2"]) {
      await logged(engine, drained(name));
      assert.ok(drained(name)(engine.logs.map((line) => line.message)), name);
    }
    await removeAll([
      { ...stored[0]!, id: replacement.id, outputs: replacement.properties },
      stored[1]!,
    ]);
  });
});
