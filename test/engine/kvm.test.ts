/**
 * KvmProxy driven through the real dynamic-provider gRPC server from
 * @pulumi/pulumi, installed from the packed package into a consumer project,
 * against the lab's libvirtd over SSH: Configure → Check → Diff → Create →
 * Read → Update → Delete, plus a preview with unknowns and no credentials.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { engineCallMs } from "../lab/budgets";
import { useLab, type LabEnv } from "../lab/fixture";
import { LabGuests } from "../lab/guests";
import {
  ensureProxyImage,
  labConnection,
  serveImage,
  waitOutHostListings,
  type RunningServer,
} from "../lab/kvm-support";
import {
  captureResourceInputs,
  DynamicProviderServer,
  EngineCallError,
  FakeEngine,
  packIntoConsumerProject,
  type ConsumerProject,
  type Props,
} from "./harness";
import { planSummary, refreshAndHeal, refreshThenPlan } from "./resync";

const UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9";

describe("engine: KvmProxy through the real dynamic-provider gRPC server", function () {
  this.timeout(600_000);
  let project: ConsumerProject;
  let lab: LabEnv;
  let imageServer: RunningServer;
  let imageSha256: string;
  const servers: DynamicProviderServer[] = [];
  const engines: FakeEngine[] = [];
  const cleanups: Array<() => Promise<void>> = [];
  const guests = new LabGuests();

  before(async () => {
    lab = await useLab();
    const image = await ensureProxyImage();
    imageSha256 = image.sha256;
    imageServer = await serveImage(image);
    project = packIntoConsumerProject();
  });

  after(async () => {
    for (const cleanup of cleanups) await cleanup().catch(() => undefined);
    await Promise.all(servers.map((server) => server.stop()));
    await Promise.all(engines.map((engine) => engine.stop()));
    // Whatever delete could not remove (a create cut short by a deadline) goes by name.
    if (lab) await guests.removeAll(lab);
    await imageServer?.close();
    project?.remove();
  });

  const virsh = (...args: string[]): string =>
    execFileSync("virsh", ["-q", "-c", lab.uri, ...args], { encoding: "utf8" });
  /** `virsh dominfo`'s Autostart line: "enable" or "disable". */
  const autostartOf = (vmName: string): string | undefined =>
    /^Autostart:\s+(\S+)/m.exec(virsh("dominfo", vmName))?.[1];

  async function startServer(): Promise<DynamicProviderServer> {
    const server = await DynamicProviderServer.start(project);
    servers.push(server);
    return server;
  }

  function programArgs(overrides: Props = {}): Props {
    return {
      connection: labConnection(lab),
      pool: lab.pool,
      network: { bridge: lab.bridge },
      domainType: "qemu",
      memoryMiB: 256,
      image: { url: imageServer.url, sha256: imageSha256 },
      userData: "#cloud-config\nruncmd: [echo engine]\n",
      readiness: { mode: "none" },
      // On as in a pool: with readiness "none" it checks nothing, and the resync below stays quiet.
      egressRecheck: true,
      timeouts: { createSeconds: 300, readySeconds: 60, deleteSeconds: 120 },
      ...overrides,
    };
  }

  it("serializes a small provider closure that holds no credential", async () => {
    const args = programArgs();
    const captured = await captureResourceInputs(project, "KvmProxy", "edge-a", args);
    const serialized = String(captured.inputs.__provider);
    assert.equal(captured.type, "pulumi-nodejs:dynamic/egress-proxies:KvmProxy");
    assert.deepEqual(captured.secretInputs.sort(), ["connection", "userData"]);
    assert.match(serialized, /require\("egress-proxies\/dist\/provider\/kvm\/provider\.js"\)/);
    const keyBody = String((args.connection as Props).privateKey).split("\n")[1];
    assert.ok(!serialized.includes(keyBody), "the private key is not in the closure");
    assert.ok(serialized.length < 20_000, `serialized provider is ${serialized.length} bytes`);
    console.log(`      serialized KvmProxy provider: ${serialized.length} bytes`);
  });

  it("previews with unknown values and no credentials (check and diff offline)", async () => {
    const server = await startServer();
    await server.configure({});
    const captured = await captureResourceInputs(project, "KvmProxy", "edge-preview", {
      image: { url: "https://images.invalid/debian-12.qcow2" },
      connection: { host: "kvm-that-does-not-resolve.invalid" },
    });
    const news = { ...captured.inputs, connection: UNKNOWN, vcpus: UNKNOWN };
    const checked = await server.check(captured.urn, {}, news);
    assert.deepEqual(checked.failures, []);
    assert.match(String(checked.inputs.vmName), /^edge-preview-[a-z2-7]{10}$/);
    const diff = await server.diff(
      captured.urn,
      "hosts/kvm1/domains/x",
      { ...checked.inputs, vcpus: 1 },
      checked.inputs,
    );
    assert.equal(diff.changes, "some");
    assert.ok(diff.replaces.includes("vcpus"), JSON.stringify(diff));
  });

  it("reports check failures by property with the fix", async () => {
    const server = await startServer();
    await server.configure({});
    const captured = await captureResourceInputs(
      project,
      "KvmProxy",
      "edge-bad",
      programArgs({ memoryMiB: 64, image: { url: "http://x/y.qcow2" } }),
    );
    const checked = await server.check(captured.urn, {}, captured.inputs);
    assert.deepEqual(checked.failures.map((f) => f.property).sort(), ["image.sha256", "memoryMiB"]);
    assert.ok(checked.failures.every((f) => f.reason.length > 20));
  });

  it("Configure → Check → Diff → Create → Read → Update → Delete against the lab over SSH", async () => {
    const engine = await FakeEngine.start();
    const server = await DynamicProviderServer.start(
      project,
      undefined,
      process.env,
      engine.address,
    );
    server.callTimeoutMs = engineCallMs();
    servers.push(server);
    engines.push(engine);
    // The key comes from provider config (a secret in Pulumi.<stack>.yaml), not from the resource.
    await server.configure({ "egress-proxies:kvmPrivateKey": readFileSync(lab.clientKey, "utf8") });
    const args = programArgs();
    const { privateKey: _fromConfig, ...connection } = args.connection as Props;
    const captured = await captureResourceInputs(project, "KvmProxy", "edge-b", {
      ...args,
      connection,
    });
    const { urn } = captured;
    const checked = await server.check(urn, {}, captured.inputs);
    assert.deepEqual(checked.failures, []);
    const inputs = checked.inputs;
    guests.add(String(inputs.vmName));

    const created = await server.create(urn, inputs);
    // If an assertion below fails, the VM still goes (delete is idempotent).
    cleanups.push(() => server.delete(urn, created.id, created.properties));
    assert.equal(created.id, `hosts/${lab.sshHost}:${lab.sshPort}/domains/${inputs.vmName}`);
    const outputs = created.properties;
    assert.equal(outputs.state, "running");
    assert.equal(outputs.__provider, inputs.__provider);
    assert.match(String(outputs.libvirtUuid), /^[0-9a-f-]{36}$/);
    // Download progress reached the engine's log, as `pulumi up` shows it.
    assert.ok(
      engine.logs.some((line) => /KvmProxy: .*MiB.* at .*MiB\/s/.test(line.message)),
      `progress lines: ${JSON.stringify(engine.logs.map((line) => line.message))}`,
    );

    // The same program again: same name, no changes.
    const again = await server.check(urn, inputs, captured.inputs);
    assert.equal(again.inputs.vmName, inputs.vmName);
    assert.deepEqual(await server.diff(urn, created.id, outputs, again.inputs), {
      changes: "none",
      replaces: [],
      deleteBeforeReplace: false,
    });

    const read = await server.read(urn, created.id, outputs, inputs);
    assert.equal(read.id, created.id);
    assert.equal(read.properties.state, "running");
    // Refresh hands back inputs read from the host; an untouched VM proposes nothing next time.
    assert.equal(read.inputs.vcpus, 1);
    assert.equal(read.inputs.memoryMiB, 256);
    assert.equal(read.inputs.__provider, inputs.__provider);
    const afterRefresh = await server.check(urn, read.inputs, captured.inputs);
    assert.equal(
      (await server.diff(urn, read.id, read.properties, afterRefresh.inputs)).changes,
      "none",
    );
    // `pulumi up --refresh` of the unchanged program three more times (a resync loop): no change.
    const resync = await refreshThenPlan(
      server,
      urn,
      { id: created.id, outputs: read.properties, inputs: afterRefresh.inputs },
      captured.inputs,
    );
    assert.deepEqual(planSummary(resync), ["none", "none", "none"]);
    assert.equal(resync.at(-1)!.stored.outputs.libvirtUuid, outputs.libvirtUuid);

    // Start with the host: create set libvirt's autostart. Turned off by hand, refresh shows it, the
    // next up sets it back in place (same VM), and the loop is quiet again.
    assert.equal(autostartOf(String(inputs.vmName)), "enable");
    virsh("autostart", "--disable", String(inputs.vmName));
    await waitOutHostListings(); // this server read the host's listing just before
    const autostart = await refreshAndHeal(
      server,
      urn,
      { id: created.id, outputs: read.properties, inputs: afterRefresh.inputs },
      captured.inputs,
    );
    assert.equal(autostart.refreshed.inputs.startOnBoot, false);
    assert.equal(autostart.healed.outputs.libvirtUuid, outputs.libvirtUuid);
    assert.equal(autostartOf(String(inputs.vmName)), "enable");

    // Heal on `up --refresh`: a VM stopped by hand reads as running: false, and the next up starts it
    // again in place (same UUID), after which the loop is quiet.
    virsh("destroy", String(inputs.vmName));
    await waitOutHostListings();
    const power = await refreshAndHeal(server, urn, autostart.healed, captured.inputs);
    assert.equal(power.refreshed.properties.state, "stopped");
    assert.equal(power.refreshed.inputs.running, false);
    const restarted = power.healed.outputs;
    const restart = power.healed;
    assert.equal(restarted.state, "running");
    assert.equal(restarted.libvirtUuid, outputs.libvirtUuid);
    assert.equal(virsh("domstate", String(inputs.vmName)).trim(), "running");
    // A paused VM is reported, and the plan stays empty: paused is never "stopped".
    virsh("suspend", String(inputs.vmName));
    try {
      await waitOutHostListings();
      const pausedRead = await server.read(urn, created.id, restarted, restart.inputs);
      assert.equal(pausedRead.properties.state, "paused");
      const pausedPlan = await server.check(urn, pausedRead.inputs, captured.inputs);
      assert.equal(
        (await server.diff(urn, created.id, pausedRead.properties, pausedPlan.inputs)).changes,
        "none",
      );
    } finally {
      virsh("resume", String(inputs.vmName));
    }
    await waitOutHostListings(); // resumed behind the provider's back

    // KvmProxy.get in a program of this stack adopts it (a ReadResource, read-only to Pulumi),
    // with only the inputs on the request as newer engines send a Get; another stack is refused.
    const got = await captureResourceInputs(
      project,
      "KvmProxy",
      "edge-adopted",
      { connection },
      undefined,
      created.id,
    );
    const adopted = await server.read(got.urn, created.id, {}, got.inputs);
    assert.equal(adopted.id, created.id);
    assert.equal(adopted.properties.vmName, inputs.vmName);
    assert.equal(adopted.properties.libvirtUuid, outputs.libvirtUuid);
    assert.equal(adopted.properties.memoryMiB, 256);
    assert.equal(adopted.properties.state, "running");
    const theirs = await captureResourceInputs(
      project,
      "KvmProxy",
      "edge-theirs",
      { connection },
      { project: "egress-consumer", stack: "another-stack" },
      created.id,
    );
    await assert.rejects(
      server.read(theirs.urn, created.id, {}, theirs.inputs),
      /belongs to egress-consumer\/engine-test .*only the stack that owns it can adopt it/,
    );

    // Adopt, then declare (what the engine sends is spelt out in proxmox.test.ts): the `.get`
    // state, read either way an engine sends a Get, diffs clean against the same resource
    // declared with the creating arguments; a real change still shows.
    const declared = await captureResourceInputs(project, "KvmProxy", "edge-adopted", {
      ...args,
      connection,
    });
    for (const properties of [got.inputs, {}]) {
      const state = await server.read(got.urn, created.id, properties, got.inputs);
      // From the mark: what libvirt cannot say.
      assert.equal(state.properties.installGuestAgent, true);
      assert.deepEqual(state.properties.image, { format: "qcow2", sha256: imageSha256 });
      assert.equal(state.properties.vmNameChosenBy, "provider");
      const plan = await server.check(got.urn, state.inputs, declared.inputs);
      assert.deepEqual(plan.failures, []);
      assert.equal(plan.inputs.vmName, inputs.vmName, "the generated name is kept");
      assert.deepEqual(await server.diff(got.urn, created.id, state.properties, plan.inputs), {
        changes: "none",
        replaces: [],
        deleteBeforeReplace: false,
      });
      const other = { ...(args.image as Props), sha256: "0".repeat(64) };
      for (const [key, value, path] of [
        ["vcpus", 2, "vcpus"],
        ["image", other, "image.sha256"],
      ] as const) {
        const changed = await server.check(got.urn, state.inputs, {
          ...declared.inputs,
          [key]: value,
        });
        const diff = await server.diff(got.urn, created.id, state.properties, changed.inputs);
        assert.deepEqual([diff.changes, diff.replaces.sort()], ["some", [path, "vmName"]], key);
      }
    }
    // The engine's own path after a `.get` (Check without olds, then create): named as the VM
    // is, create finds the domain and adopts it in place (the same UUID, nothing defined anew).
    const named = await captureResourceInputs(project, "KvmProxy", "edge-adopted", {
      ...args,
      connection,
      vmName: inputs.vmName,
    });
    const fresh = await server.check(named.urn, {}, named.inputs);
    const taken = await server.create(named.urn, fresh.inputs);
    assert.equal(taken.id, created.id);
    assert.equal(taken.properties.libvirtUuid, outputs.libvirtUuid);
    assert.equal(taken.properties.createdAt, outputs.createdAt);
    const next = await server.check(named.urn, fresh.inputs, named.inputs);
    assert.equal(
      (await server.diff(named.urn, taken.id, taken.properties, next.inputs)).changes,
      "none",
    );

    // Timeouts change: update in place, VM untouched; vcpus change: replace with a new name.
    const retimed = await server.check(urn, inputs, {
      ...captured.inputs,
      timeouts: { createSeconds: 400, readySeconds: 60, deleteSeconds: 120 },
    });
    const retimeDiff = await server.diff(urn, created.id, outputs, retimed.inputs);
    assert.deepEqual([retimeDiff.changes, retimeDiff.replaces], ["some", []]);
    const updated = await server.update(urn, created.id, outputs, retimed.inputs);
    assert.equal(updated.libvirtUuid, outputs.libvirtUuid);
    assert.deepEqual(updated.timeouts, {
      createSeconds: 400,
      readySeconds: 60,
      deleteSeconds: 120,
    });
    const resized = await server.check(urn, retimed.inputs, { ...captured.inputs, vcpus: 2 });
    assert.notEqual(resized.inputs.vmName, inputs.vmName, "a replacement gets a new name");
    // vcpus replaces the VM, and the replacement carries the new generated name.
    const resizeDiff = await server.diff(urn, created.id, updated, resized.inputs);
    assert.deepEqual(resizeDiff.replaces.sort(), ["vcpus", "vmName"]);
    assert.equal(resizeDiff.deleteBeforeReplace, false);
    // Rotation (the pool's `rotate`): a new text replaces the VM under a new name, created first.
    const rotated = await server.check(urn, retimed.inputs, { ...captured.inputs, rotation: "r1" });
    const rotateDiff = await server.diff(urn, created.id, updated, rotated.inputs);
    assert.deepEqual(
      [rotateDiff.replaces.sort(), rotateDiff.deleteBeforeReplace],
      [["rotation", "vmName"], false],
    );

    await server.delete(urn, created.id, updated);
    const gone = await server.read(urn, created.id, updated, inputs);
    assert.equal(gone.id, "");
  });

  it("records a failed create so the engine can continue it (update) and destroy it (delete) over gRPC", async () => {
    const server = await startServer();
    await server.configure({});
    const recordOf = async (name: string, overrides: Props) => {
      const captured = await captureResourceInputs(
        project,
        "KvmProxy",
        name,
        programArgs(overrides),
      );
      const checked = await server.check(captured.urn, {}, captured.inputs);
      assert.deepEqual(checked.failures, []);
      const error = await server.create(captured.urn, checked.inputs).then(
        () => undefined,
        (failure: unknown) => failure,
      );
      assert.ok(error instanceof EngineCallError, `create should fail: ${String(error)}`);
      return { urn: captured.urn, inputs: checked.inputs, captured, failure: error };
    };

    // Readiness that never comes: the running VM is recorded; the next up (update) continues it.
    const slow = await recordOf("edge-r", {
      readiness: { mode: "address" },
      timeouts: { createSeconds: 120, readySeconds: 2, deleteSeconds: 120 },
    });
    const record = slow.failure.initFailure;
    assert.ok(record, `a partial create, got: ${slow.failure.message}`);
    cleanups.push(() => server.delete(slow.urn, record.id, record.properties));
    assert.equal(record.properties.__provider, slow.inputs.__provider);
    assert.equal(record.properties.createIncomplete, true);
    const relaxed = await server.check(slow.urn, slow.inputs, {
      ...slow.captured.inputs,
      readiness: { mode: "none" },
    });
    assert.equal(relaxed.inputs.vmName, slow.inputs.vmName, "the record keeps its name");
    const diff = await server.diff(slow.urn, record.id, record.properties, relaxed.inputs);
    assert.deepEqual(diff.replaces, []);
    const outs = await server.update(slow.urn, record.id, record.properties, relaxed.inputs);
    assert.equal(outs.state, "running");
    assert.equal(outs.createIncomplete, undefined, "complete now");
    assert.equal(outs.libvirtUuid, record.properties.libvirtUuid, "the same VM, continued");
    await server.delete(slow.urn, record.id, outs);
    assert.equal((await server.read(slow.urn, record.id, outs, relaxed.inputs)).id, "");

    // A bridge that does not exist: either nothing was made, or destroy removes the record.
    const broken = await recordOf("edge-x", { network: { bridge: "br-engine404" } });
    const brokenRecord = broken.failure.initFailure;
    if (brokenRecord !== undefined) {
      await server.delete(broken.urn, brokenRecord.id, brokenRecord.properties);
      const gone = await server.read(
        broken.urn,
        brokenRecord.id,
        brokenRecord.properties,
        broken.inputs,
      );
      assert.equal(gone.id, "");
    }
  });
});
