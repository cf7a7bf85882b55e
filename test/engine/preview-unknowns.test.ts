/**
 * `pulumi preview` with one input unknown (it comes from another resource that
 * is changing), through the real dynamic-provider gRPC server, for both
 * resources: the unknown is made by the SDK itself (an output of another
 * resource at preview, under mocks), Check and Diff go over gRPC exactly as
 * the engine sends them, and the verdict must be the change table's for that
 * one field, never a replacement of the defaulted fields that did not change.
 */
import assert from "node:assert/strict";
import type { PveSimulator } from "../pve-sim/simulator";
import { simulatorProxyArgs, useEngineFixture } from "./engine-fixture";
import type { DynamicProviderServer, Props } from "./harness";
import { captureRegistration, UNKNOWN } from "./registration";

const unknown = { $unknown: true };
const unknownSecret = { $secret: unknown };
const KEY =
  "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n";

describe("engine: preview with unknown inputs (check and diff over gRPC)", function () {
  this.timeout(120_000);
  const fixture = useEngineFixture();

  describe("KvmProxy", () => {
    /** Prior state built from a real check result (no VM is needed for check and diff). */
    let server: DynamicProviderServer;
    let priorInputs: Props;
    let priorOutputs: Props;
    const ID = "hosts/kvm1.lan/domains/x";

    const program = (overrides: Props = {}): Props => ({
      connection: { host: "kvm1.lan", privateKey: KEY },
      image: { url: "https://images.example/debian-12.qcow2" },
      userData: "#cloud-config\nruncmd: [echo hi]\n",
      readiness: { probeUrl: "http://example.com/" },
      ...overrides,
    });

    before(async () => {
      server = await fixture.startServer({ config: {} });
      const first = await captureRegistration(fixture.project, "KvmProxy", "edge-k", program());
      const checked = await server.check(first.urn, {}, first.inputs);
      assert.deepEqual(checked.failures, []);
      priorInputs = checked.inputs;
      priorOutputs = {
        ...checked.inputs,
        host: "kvm1.lan",
        ip: "192.0.2.10",
        mac: "52:54:00:00:00:01",
        state: "running",
        endpoint: "http://192.0.2.10:3128",
        imageVolume: "egress-base-x.qcow2",
        seedSha256: "0".repeat(64),
        createdAt: "2026-01-01T00:00:00Z",
        libvirtUuid: "00000000-0000-0000-0000-000000000001",
      };
    });

    async function previewDiff(args: Props) {
      const registration = await captureRegistration(fixture.project, "KvmProxy", "edge-k", args, {
        preview: true,
      });
      const checked = await server.check(registration.urn, priorInputs, registration.inputs);
      const diff = await server.diff(registration.urn, ID, priorOutputs, checked.inputs);
      return { registration, checked, diff };
    }

    it("an unchanged program previews no change", async () => {
      const { checked, diff } = await previewDiff(program());
      assert.equal(checked.inputs.vmName, priorInputs.vmName);
      assert.deepEqual(diff, { changes: "none", replaces: [], deleteBeforeReplace: false });
    });

    it("readiness.probeUrl unknown: an update, nothing replaced, defaults kept", async () => {
      const { registration, checked, diff } = await previewDiff(
        program({ readiness: { probeUrl: unknown } }),
      );
      assert.deepEqual(registration.inputs.readiness, { probeUrl: UNKNOWN });
      assert.deepEqual(checked.failures, []);
      assert.deepEqual(checked.inputs.readiness, { mode: "port", port: 3128, probeUrl: UNKNOWN });
      for (const field of ["pool", "vcpus", "memoryMiB", "diskGiB", "firmware", "network"])
        assert.deepEqual(checked.inputs[field], priorInputs[field], field);
      assert.equal(checked.inputs.vmName, priorInputs.vmName);
      assert.deepEqual(diff, { changes: "some", replaces: [], deleteBeforeReplace: false });
    });

    it("userData unknown: a replacement of userData only, under the same generated name", async () => {
      const { checked, diff } = await previewDiff(program({ userData: unknownSecret }));
      assert.deepEqual(checked.failures, []);
      assert.equal(checked.inputs.userData, UNKNOWN);
      assert.equal(checked.inputs.vmName, priorInputs.vmName);
      assert.deepEqual(diff, {
        changes: "some",
        replaces: ["userData"],
        deleteBeforeReplace: false,
      });
    });

    it("an unknown secret private key: an update; the connection's host stays known", async () => {
      const { registration, checked, diff } = await previewDiff(
        program({ connection: { host: "kvm1.lan", privateKey: unknownSecret } }),
      );
      // Secrets are marked leaf by leaf, so one unknown key does not make the whole connection unknown.
      assert.deepEqual(registration.inputs.connection, { host: "kvm1.lan", privateKey: UNKNOWN });
      assert.deepEqual(checked.inputs.connection, {
        host: "kvm1.lan",
        port: 22,
        user: "root",
        privateKey: UNKNOWN,
        insecureIgnoreHostKey: false,
        dialTimeoutSeconds: 15,
      });
      assert.deepEqual(diff, { changes: "some", replaces: [], deleteBeforeReplace: false });
    });

    it("an unknown vmName replaces the VM under whatever name it turns out to be", async () => {
      const { checked, diff } = await previewDiff(program({ vmName: unknown }));
      assert.deepEqual(checked.failures, []);
      assert.equal(checked.inputs.vmName, UNKNOWN);
      assert.equal(checked.inputs.vmNameChosenBy, "user");
      assert.deepEqual(diff, { changes: "some", replaces: ["vmName"], deleteBeforeReplace: false });
    });

    it("a known replacement beside an unknown update still renames and replaces", async () => {
      const { checked, diff } = await previewDiff(
        program({ vcpus: 2, readiness: { probeUrl: unknown } }),
      );
      assert.notEqual(checked.inputs.vmName, priorInputs.vmName);
      assert.deepEqual(diff.replaces.sort(), ["vcpus", "vmName"]);
    });
  });

  describe("ProxmoxProxy (prior state from a real create on the simulator)", () => {
    let sim: PveSimulator;
    let server: DynamicProviderServer;
    let priorInputs: Props;
    let created: { id: string; properties: Props };
    let urn: string;

    const program = (overrides: Props = {}): Props =>
      simulatorProxyArgs(sim, {
        tags: ["Edge", "blue"],
        userData: "#cloud-config\nruncmd: [echo hi]\n",
        ...overrides,
      });

    before(async () => {
      sim = await fixture.startSimulator();
      server = await fixture.startServer({
        config: { "egress-proxies:proxmoxApiToken": sim.tokenFor() },
      });
      const first = await captureRegistration(fixture.project, "ProxmoxProxy", "edge-p", program());
      urn = first.urn;
      const checked = await server.check(urn, {}, first.inputs);
      assert.deepEqual(checked.failures, []);
      priorInputs = checked.inputs;
      created = await server.create(urn, priorInputs);
    });

    after(async () => {
      if (created) await server.delete(urn, created.id, created.properties).catch(() => undefined);
    });

    async function previewDiff(args: Props) {
      const registration = await captureRegistration(
        fixture.project,
        "ProxmoxProxy",
        "edge-p",
        args,
        {
          preview: true,
        },
      );
      const checked = await server.check(urn, priorInputs, registration.inputs);
      const diff = await server.diff(urn, created.id, created.properties, checked.inputs);
      return { checked, diff };
    }

    it("an unchanged program previews no change", async () => {
      const { diff } = await previewDiff(program());
      assert.deepEqual(diff, { changes: "none", replaces: [], deleteBeforeReplace: false });
    });

    it("an unknown secret apiToken: an update, nothing replaced", async () => {
      const { checked, diff } = await previewDiff(program({ apiToken: unknownSecret }));
      assert.deepEqual(checked.failures, []);
      assert.equal(checked.inputs.apiToken, UNKNOWN);
      for (const field of ["cores", "memoryMiB", "vmidRange", "installGuestAgent", "tags"])
        assert.deepEqual(checked.inputs[field], priorInputs[field], field);
      assert.equal(checked.inputs.vmName, priorInputs.vmName);
      assert.deepEqual(diff, { changes: "some", replaces: [], deleteBeforeReplace: false });
    });

    it("userData unknown: a replacement of userData only, under the same generated name", async () => {
      const { checked, diff } = await previewDiff(program({ userData: unknownSecret }));
      assert.equal(checked.inputs.vmName, priorInputs.vmName);
      assert.deepEqual(diff, {
        changes: "some",
        replaces: ["userData"],
        deleteBeforeReplace: false,
      });
    });

    it("readiness.port or one tag unknown: an update", async () => {
      for (const overrides of [
        { readiness: { mode: "address", port: unknown } },
        { tags: ["Edge", unknown] },
      ]) {
        const { checked, diff } = await previewDiff(program(overrides));
        assert.deepEqual(checked.failures, [], JSON.stringify(overrides));
        assert.deepEqual(
          diff,
          { changes: "some", replaces: [], deleteBeforeReplace: false },
          JSON.stringify(overrides),
        );
      }
    });

    it("node unknown: a replacement of node only", async () => {
      const { diff } = await previewDiff(program({ node: unknown }));
      assert.deepEqual(diff.replaces, ["node"]);
    });
  });
});
