import assert from "node:assert/strict";
import type { PveSimulator } from "../pve-sim/simulator";
import { simulatorProxyArgs, useEngineFixture } from "./engine-fixture";
import { captureResourceInputs, EngineCallError, FakeEngine, Props } from "./harness";
import { planSummary, refreshAndHeal, refreshThenPlan } from "./resync";
import { STORED_PROVIDER_CLOSURES_0_1_0 } from "./stored-provider-closures";

const UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9";

/**
 * ProxmoxProxy driven through the real dynamic-provider gRPC server from
 * @pulumi/pulumi, installed from the packed package into a consumer project,
 * against the simulator: Configure → Check → Diff → Create → Read → Update →
 * Delete, plus a preview with unknowns and no credentials.
 */
describe("engine: ProxmoxProxy through the real dynamic-provider gRPC server", function () {
  this.timeout(120_000);
  const fixture = useEngineFixture();
  let sim: PveSimulator;

  before(async () => {
    sim = await fixture.startSimulator();
  });

  /** The user's program: the token comes from provider config, not from the resource. */
  function programArgs(overrides: Props = {}): Props {
    return simulatorProxyArgs(sim, {
      tags: ["Edge"],
      userData: "#cloud-config\nruncmd: [echo hi]\n",
      // On as in a pool (readiness "address" without an egress check re-checks nothing here;
      // egress-recheck.test.ts re-checks a proxy for real): the resync below stays quiet.
      egressRecheck: true,
      ...overrides,
    });
  }

  it("serializes a small provider closure that holds no credential", async () => {
    const captured = await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      "edge-a",
      programArgs({ apiToken: sim.tokenFor() }),
    );
    const serialized = String(captured.inputs.__provider);
    assert.equal(captured.type, "pulumi-nodejs:dynamic/egress-proxies:ProxmoxProxy");
    assert.deepEqual(captured.secretInputs.sort(), ["apiToken", "userData"]);
    assert.match(serialized, /require\("egress-proxies\/dist\/provider\/proxmox\/provider\.js"\)/);
    assert.doesNotMatch(serialized, new RegExp(sim.tokenFor().split("=")[1]));
    assert.ok(serialized.length < 20_000, `serialized provider is ${serialized.length} bytes`);
    console.log(`      serialized ProxmoxProxy provider: ${serialized.length} bytes`);
  });

  it("previews with unknown values and no credentials anywhere (check and diff offline)", async () => {
    const env = { ...process.env };
    delete env.PROXMOX_VE_ENDPOINT;
    delete env.PROXMOX_VE_API_TOKEN;
    const server = await fixture.startServer({ env });
    await server.configure({});
    const captured = await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      "edge-preview",
      programArgs({ apiEndpoint: undefined }),
    );
    const news = { ...captured.inputs, node: UNKNOWN, vlanTag: UNKNOWN };
    const checked = await server.check(captured.urn, {}, news);
    assert.deepEqual(checked.failures, []);
    assert.equal(checked.inputs.node, UNKNOWN);
    assert.match(String(checked.inputs.vmName), /^edge-preview-[a-z2-7]{10}$/);
    const diff = await server.diff(
      captured.urn,
      "nodes/pve/qemu/20001",
      { ...checked.inputs, node: "pve" },
      checked.inputs,
    );
    assert.equal(diff.changes, "some");
    assert.deepEqual(diff.replaces.sort(), ["node", "vlanTag"]);
  });

  it("reports check failures by property with the fix", async () => {
    const server = await fixture.startServer();
    await server.configure({});
    const captured = await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      "edge-bad",
      programArgs({ vlanTag: 5000 }),
    );
    const checked = await server.check(captured.urn, {}, captured.inputs);
    assert.deepEqual(checked.failures, [
      { property: "vlanTag", reason: "vlanTag must be at most 4094" },
    ]);
  });

  it("Configure → Check → Diff → Create → Read → Update → Delete against the simulator", async () => {
    const engine = await fixture.startEngine();
    let server = await fixture.startServer({
      engine,
      config: { "egress-proxies:proxmoxApiToken": sim.tokenFor() },
    });
    const captured = await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      "edge-b",
      programArgs(),
    );
    const { urn } = captured;

    const checked = await server.check(urn, {}, captured.inputs);
    assert.deepEqual(checked.failures, []);
    const inputs = checked.inputs;
    assert.deepEqual(inputs.tags, ["edge"]);

    const created = await server.create(urn, inputs);
    assert.match(created.id, /^nodes\/pve\/qemu\/\d+$/);
    const outputs = created.properties;
    assert.equal(outputs.state, "running");
    assert.match(String(outputs.ip), /^192\.168\./);
    assert.equal(outputs.__provider, inputs.__provider);
    const vmid = Number(outputs.vmid);
    // Progress reaches the user's `pulumi up` output through the engine's Log RPC
    // (fire and forget, so the last line may land a moment after create returns).
    const cloning = `ProxmoxProxy ${inputs.vmName}: cloning template 9000 into VMID ${vmid}`;
    const lines = await logLinesOnce(engine, (all) =>
      all.some((line) => /: address 192\.168\./.test(line)),
    );
    assert.ok(lines.includes(cloning), `progress lines: ${JSON.stringify(lines)}`);
    assert.ok(
      lines.some((line) => /: address 192\.168\./.test(line)),
      JSON.stringify(lines),
    );
    assert.ok(lines.every((line) => !line.includes(sim.tokenFor().split("=")[1])));
    assert.equal(sim.vms.get(vmid)?.config.name, inputs.vmName);

    // A second `pulumi up` with the same program: same name, no changes.
    const again = await server.check(urn, inputs, captured.inputs);
    assert.equal(again.inputs.vmName, inputs.vmName);
    assert.deepEqual(await server.diff(urn, created.id, outputs, again.inputs), {
      changes: "none",
      replaces: [],
      deleteBeforeReplace: false,
    });

    // `pulumi up --refresh` of the unchanged program, three times over (a resync loop): no change, and
    // the host was asked nothing that changes it.
    const vmBefore = JSON.stringify(sim.vms.get(vmid)?.config);
    const resync = await refreshThenPlan(
      server,
      urn,
      { id: created.id, outputs, inputs: again.inputs },
      captured.inputs,
    );
    assert.deepEqual(planSummary(resync), ["none", "none", "none"]);
    assert.equal(resync.at(-1)!.stored.outputs.state, "running");
    assert.equal(JSON.stringify(sim.vms.get(vmid)?.config), vmBefore);
    assert.equal(sim.vms.get(vmid)!.config.onboot, "1", "starts with the node");

    // onboot turned off by hand, then the VM stopped by hand: each shows on refresh and the next up
    // heals it in place (config written back; the same VMID started again and ready), then all is quiet.
    sim.vms.get(vmid)!.config.onboot = "0";
    server = await fixture.nextDeployment(server);
    const onboot = await refreshAndHeal(
      server,
      urn,
      { id: created.id, outputs, inputs: again.inputs },
      captured.inputs,
    );
    assert.equal(onboot.refreshed.inputs.startOnBoot, false);
    assert.equal(sim.vms.get(vmid)!.config.onboot, "1");
    const vm = sim.vms.get(vmid)!;
    vm.status = "stopped";
    vm.startedAt = undefined;
    server = await fixture.nextDeployment(server);
    const power = await refreshAndHeal(server, urn, onboot.healed, captured.inputs);
    assert.equal(power.refreshed.properties.state, "stopped");
    assert.equal(power.refreshed.inputs.running, false);
    assert.equal(power.healed.outputs.state, "running");
    assert.equal(power.healed.outputs.vmid, vmid);
    assert.equal(sim.vms.get(vmid)!.status, "running");
    assert.match(String(power.healed.outputs.ip), /^192\.168\./);

    // Refresh: paused is reported as paused.
    sim.pauseVm(vmid);
    server = await fixture.nextDeployment(server);
    const read = await server.read(urn, created.id, outputs, inputs);
    assert.equal(read.id, created.id);
    assert.equal(read.properties.state, "paused");
    assert.equal(read.inputs.vmName, inputs.vmName);
    sim.vms.get(vmid)!.paused = false;

    // Tags change: update in place; cores change: replace.
    const retagged = await server.check(urn, inputs, {
      ...captured.inputs,
      tags: ["edge", "blue"],
    });
    const retagDiff = await server.diff(urn, created.id, outputs, retagged.inputs);
    assert.deepEqual([retagDiff.changes, retagDiff.replaces], ["some", []]);
    const updated = await server.update(urn, created.id, outputs, retagged.inputs);
    assert.deepEqual(updated.tags, ["blue", "edge"]);
    assert.equal(updated.ip, outputs.ip);
    assert.equal(sim.vms.get(vmid)!.config.tags, "blue;edge;egress-proxies");
    // A replacement gets a fresh generated name, so create-before-delete cannot collide.
    const resized = await server.check(urn, inputs, { ...captured.inputs, cores: 4 });
    assert.notEqual(resized.inputs.vmName, inputs.vmName);
    const resizeDiff = await server.diff(urn, created.id, updated, resized.inputs);
    assert.deepEqual(
      [resizeDiff.replaces.sort(), resizeDiff.deleteBeforeReplace],
      [["cores", "vmName"], false],
    );

    // Rotation (the pool's `rotate`): a new rotation text replaces the VM under a new name, the new one
    // created before the old one is deleted.
    const rotated = await server.check(urn, inputs, { ...captured.inputs, rotation: "2026-12-02" });
    assert.notEqual(rotated.inputs.vmName, inputs.vmName);
    const rotateDiff = await server.diff(urn, created.id, updated, rotated.inputs);
    assert.deepEqual(
      [rotateDiff.replaces.sort(), rotateDiff.deleteBeforeReplace],
      [["rotation", "vmName"], false],
    );

    await server.delete(urn, created.id, updated);
    assert.equal(sim.vms.has(vmid), false);
    assert.equal(sim.isoFile("seeds", `${inputs.vmName}-seed.iso`), undefined);

    // Refresh after delete: the resource is gone (empty id).
    const gone = await server.read(urn, created.id, updated, inputs);
    assert.equal(gone.id, "");
  });

  it("state a 0.1.0 release wrote, with its stored provider closure: refresh runs through it, the next up carries today's small closure into state without touching the VM, destroy through the old closure deletes", async () => {
    const server = await fixture.startServer();
    await server.configure({ "egress-proxies:proxmoxApiToken": sim.tokenFor() });
    const captured = await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      "edge-old",
      programArgs(),
    );
    const { inputs } = await server.check(captured.urn, {}, captured.inputs);
    const created = await server.create(captured.urn, inputs);
    const vmid = Number(created.properties.vmid);
    const oldClosure = STORED_PROVIDER_CLOSURES_0_1_0.ProxmoxProxy;
    const oldOutputs = { ...created.properties, __provider: oldClosure };
    const oldInputs = { ...inputs, __provider: oldClosure };

    const read = await server.read(captured.urn, created.id, oldOutputs, oldInputs);
    assert.equal(read.id, created.id);
    assert.equal(read.properties.state, "running");
    assert.equal(read.properties.__provider, oldClosure, "refresh keeps the stored code");

    const diff = await server.diff(captured.urn, created.id, read.properties, inputs);
    assert.deepEqual(
      [diff.changes, diff.replaces],
      ["some", []],
      "new provider code must reach state",
    );
    const configBefore = JSON.stringify(sim.vms.get(vmid)!.config);
    const requestsBefore = sim.requestLog.length;
    const updated = await server.update(captured.urn, created.id, read.properties, inputs);
    assert.equal(updated.__provider, inputs.__provider);
    assert.ok(String(updated.__provider).length < 600);
    const sent = sim.requestLog.slice(requestsBefore);
    assert.deepEqual(sent, [], "the update carrying new code asks the host nothing");
    assert.equal(JSON.stringify(sim.vms.get(vmid)!.config), configBefore);

    await server.delete(captured.urn, created.id, oldOutputs);
    assert.equal(sim.vms.has(vmid), false, "destroy through the 0.1.0 closure deleted the VM");
  });

  it("adopts this stack's VM with ProxmoxProxy.get (a ReadResource) and refuses another stack's", async () => {
    const server = await fixture.startServer();
    await server.configure({ "egress-proxies:proxmoxApiToken": sim.tokenFor() });
    const made = await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      "edge-made",
      programArgs(),
    );
    const checked = await server.check(made.urn, {}, made.inputs);
    const created = await server.create(made.urn, checked.inputs);
    try {
      // ProxmoxProxy.get("edge-adopted", id, { apiEndpoint, caCertPem, node }) in the user's program.
      const getArgs = { apiEndpoint: sim.endpoint, caCertPem: sim.caCertPem, node: "pve" };
      const got = await captureResourceInputs(
        fixture.project,
        "ProxmoxProxy",
        "edge-adopted",
        getArgs,
        undefined,
        created.id,
      );
      assert.equal(got.id, created.id, "the SDK registers a read of that id");
      assert.equal(typeof got.inputs.__provider, "string");
      // Engines send a Get's inputs as the state too, or the inputs alone (the SDK's
      // server finds __provider in the inputs from 3.268): both must adopt.
      const reads = [];
      for (const properties of [got.inputs, {}]) {
        const read = await server.read(got.urn, created.id, properties, got.inputs);
        assert.equal(read.id, created.id);
        assert.equal(read.properties.vmName, checked.inputs.vmName);
        assert.equal(read.properties.vmid, created.properties.vmid);
        assert.equal(read.properties.cores, 1);
        assert.equal(read.properties.memoryMiB, 1024);
        assert.deepEqual(read.properties.tags, ["edge"]);
        assert.equal(read.properties.mac, created.properties.mac);
        assert.equal(read.properties.ip, created.properties.ip);
        assert.equal(read.properties.createdAt, created.properties.createdAt);
        assert.equal(read.properties.__provider, got.inputs.__provider);
        reads.push(read.properties);
      }
      // The engine reads a .get resource on every up; an unchanged VM reads the same.
      assert.deepEqual(reads[0], reads[1]);

      const foreign = await captureResourceInputs(
        fixture.project,
        "ProxmoxProxy",
        "edge-theirs",
        getArgs,
        { project: "egress-consumer", stack: "another-stack" },
        created.id,
      );
      await assert.rejects(
        server.read(foreign.urn, created.id, {}, foreign.inputs),
        /belongs to egress-consumer\/engine-test .*only the stack that owns it can adopt it/,
      );
    } finally {
      await server.delete(made.urn, created.id, created.properties);
    }
    assert.equal(sim.vms.has(Number(created.properties.vmid)), false);
  });

  /**
   * Adopt, then declare. What the engine does (pulumi/pulumi
   * pkg/resource/deploy/step_generator.go, checked at 1b59498): `.get` is a
   * ReadStep, stored External with the `.get` arguments as inputs (read's
   * returned inputs are not kept). A later `new` under the same URN finds that
   * External state (`wasExternal`): Check is sent with no olds, no Diff is
   * sent, and the plan is a create-replacement plus a discard of the read
   * record (DeleteStep on an External resource calls no provider). So create
   * is what adopts: it finds the VM by vmName and our mark (docs/proxmox.md, rule 2) and
   * clones nothing; the program must name the VM (a generated name cannot be
   * kept without olds). The `import` option would Read(id) and then Check
   * with olds = read's inputs and Diff against read's outputs, which is the
   * contract below; the Node dynamic-provider server cannot serve that Read
   * (no inputs, so no `__provider`), but `.get`'s outputs hold it anyway.
   */
  it("adopt then declare: .get's state diffs clean against the creating program, and the engine's create of it adopts the same VM", async () => {
    const server = await fixture.startServer();
    await server.configure({ "egress-proxies:proxmoxApiToken": sim.tokenFor() });
    const args = programArgs({ bridge: "vmbr0", diskGiB: 3 });
    const made = await captureResourceInputs(fixture.project, "ProxmoxProxy", "edge-own", args);
    const checked = await server.check(made.urn, {}, made.inputs);
    const created = await server.create(made.urn, checked.inputs);
    const vmid = Number(created.properties.vmid);
    try {
      // ProxmoxProxy.get("edge-own", id, { apiEndpoint, caCertPem, node }) in the program that made it.
      const getArgs = { apiEndpoint: sim.endpoint, caCertPem: sim.caCertPem, node: "pve" };
      const got = await captureResourceInputs(
        fixture.project,
        "ProxmoxProxy",
        "edge-own",
        getArgs,
        undefined,
        created.id,
      );
      // The same resource declared again with the arguments that made it.
      const declared = await captureResourceInputs(
        fixture.project,
        "ProxmoxProxy",
        "edge-own",
        args,
      );
      // Both ways an engine sends a Get: its inputs as the state too, or the inputs alone.
      for (const properties of [got.inputs, {}]) {
        const read = await server.read(got.urn, created.id, properties, got.inputs);
        // From the mark: what PVE cannot say.
        assert.equal(read.properties.templateVmid, 9000);
        assert.equal(read.properties.diskStorage, "local-lvm");
        assert.equal(read.properties.seedStorage, "seeds");
        assert.deepEqual(read.properties.vmidRange, { first: 20000, last: 29999 });
        assert.equal(read.properties.vmNameChosenBy, "provider");
        assert.equal(read.properties.installGuestAgent, true);
        const plan = await server.check(got.urn, read.inputs, declared.inputs);
        assert.deepEqual(plan.failures, []);
        assert.equal(plan.inputs.vmName, checked.inputs.vmName, "the generated name is kept");
        assert.deepEqual(await server.diff(got.urn, created.id, read.properties, plan.inputs), {
          changes: "none",
          replaces: [],
          deleteBeforeReplace: false,
        });
        // A real change still shows: a value the mark holds, a value the host reports.
        for (const [key, value] of Object.entries({ templateVmid: 9001, bridge: "vmbr1" })) {
          const changed = await server.check(got.urn, read.inputs, {
            ...declared.inputs,
            [key]: value,
          });
          const diff = await server.diff(got.urn, created.id, read.properties, changed.inputs);
          assert.deepEqual([diff.changes, diff.replaces.sort()], ["some", [key, "vmName"]], key);
        }
      }

      // The engine's own path: Check without olds, then create. Named as the VM is, create
      // adopts it in place: no clone, the same VMID, its config as it was.
      const clones = () => [...sim.tasks.values()].filter((task) => task.type === "qmclone").length;
      const clonesBefore = clones();
      const configBefore = JSON.stringify(sim.vms.get(vmid)!.config);
      const named = await captureResourceInputs(fixture.project, "ProxmoxProxy", "edge-own", {
        ...args,
        vmName: checked.inputs.vmName,
      });
      // Declared as something it was not made as, it is refused, not recorded as the program's.
      const other = await server.check(named.urn, {}, { ...named.inputs, templateVmid: 9001 });
      await assert.rejects(server.create(named.urn, other.inputs), (error: unknown) => {
        assert.ok(error instanceof EngineCallError && error.initFailure === undefined);
        assert.match(error.message, /its mark says it was made with templateVmid 9000/);
        return true;
      });
      const fresh = await server.check(named.urn, {}, named.inputs);
      const adopted = await server.create(named.urn, fresh.inputs);
      assert.equal(adopted.id, created.id);
      assert.equal(adopted.properties.createdAt, created.properties.createdAt);
      assert.equal(clones(), clonesBefore, "adopted, not cloned again");
      assert.equal(JSON.stringify(sim.vms.get(vmid)!.config), configBefore);
      const next = await server.check(named.urn, fresh.inputs, named.inputs);
      assert.equal(
        (await server.diff(named.urn, adopted.id, adopted.properties, next.inputs)).changes,
        "none",
      );
    } finally {
      await server.delete(made.urn, created.id, created.properties);
    }
    assert.equal(sim.vms.has(vmid), false);
  });

  it("continues a partial create at the next up (update on the record) and deletes a record as destroy does", async () => {
    const server = await fixture.startServer();
    await server.configure({ "egress-proxies:proxmoxApiToken": sim.tokenFor() });
    const timeouts = { createSeconds: 60, readySeconds: 1, deleteSeconds: 60 };
    const record = async (name: string) => {
      const captured = await captureResourceInputs(
        fixture.project,
        "ProxmoxProxy",
        name,
        programArgs({ timeouts }),
      );
      const checked = await server.check(captured.urn, {}, captured.inputs);
      sim.options.agentNeverUp = true;
      try {
        const error = await server.create(captured.urn, checked.inputs).then(
          () => undefined,
          (failure: unknown) => failure,
        );
        assert.ok(error instanceof EngineCallError && error.initFailure, String(error));
        return { urn: captured.urn, inputs: checked.inputs, ...error.initFailure };
      } finally {
        sim.options.agentNeverUp = false;
      }
    };
    const vmidOf = (id: string) => Number(/(\d+)$/.exec(id)![1]);

    // The engine stores the record's properties as outputs; they carry the provider code.
    const continued = await record("edge-d");
    assert.equal(continued.properties.__provider, continued.inputs.__provider);
    assert.equal(continued.properties.createIncomplete, true);
    // Next up: diff finds nothing to change; the engine still runs update (the resource has init errors).
    const diff = await server.diff(
      continued.urn,
      continued.id,
      continued.properties,
      continued.inputs,
    );
    assert.deepEqual(diff.replaces, []);
    const outs = await server.update(
      continued.urn,
      continued.id,
      continued.properties,
      continued.inputs,
    );
    assert.equal(outs.state, "running");
    assert.match(String(outs.ip), /^192\.168\./);
    assert.equal(outs.createIncomplete, undefined, "complete now");
    await server.delete(continued.urn, continued.id, outs);
    assert.equal(sim.vms.has(vmidOf(continued.id)), false);

    // destroy of a record: delete receives the record's properties and finds the provider in them.
    const destroyed = await record("edge-e");
    assert.ok(sim.vms.has(vmidOf(destroyed.id)));
    await server.delete(destroyed.urn, destroyed.id, destroyed.properties);
    await sim.settle();
    assert.equal(sim.vms.has(vmidOf(destroyed.id)), false);
    assert.equal(sim.isoFile("seeds", `${String(destroyed.inputs.vmName)}-seed.iso`), undefined);
  });

  it("returns a partially created resource (ErrorResourceInitFailed) when the agent never answers", async () => {
    const server = await fixture.startServer();
    await server.configure({ "egress-proxies:proxmoxApiToken": sim.tokenFor() });
    const captured = await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      "edge-c",
      programArgs({ timeouts: { createSeconds: 60, readySeconds: 1, deleteSeconds: 60 } }),
    );
    const checked = await server.check(captured.urn, {}, captured.inputs);
    sim.options.agentNeverUp = true;
    try {
      await assert.rejects(server.create(captured.urn, checked.inputs), (error: unknown) => {
        assert.ok(error instanceof EngineCallError);
        assert.ok(error.initFailure, `expected an init failure, got: ${error.message}`);
        assert.match(error.initFailure.id, /^nodes\/pve\/qemu\/\d+$/);
        assert.equal(error.initFailure.properties.state, "running");
        assert.match(error.message, /timeouts\.readySeconds/);
        assert.doesNotMatch(error.message, new RegExp(sim.tokenFor().split("=")[1]));
        return true;
      });
    } finally {
      sim.options.agentNeverUp = false;
    }
  });
});

/** The engine's log lines once `ready` holds for them (or after 5 s, whatever they are then). */
async function logLinesOnce(
  engine: FakeEngine,
  ready: (lines: string[]) => boolean,
): Promise<string[]> {
  const until = Date.now() + 5000;
  for (;;) {
    const lines = engine.logs.map((line) => line.message);
    if (ready(lines) || Date.now() > until) return lines;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
