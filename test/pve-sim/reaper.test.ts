/**
 * The reaper's Proxmox side against the simulator: VMs made by ProxmoxProxy's
 * own create (with their seeds), plus hand-made, corrupt-marked and
 * other-stack VMs; the sweep runs in-process exactly as the bin runs it.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createMark } from "../../provider/common/mark";
import * as provider from "../../provider/proxmox/provider";
import { vmDescription } from "../../provider/proxmox/vm-config";
import { parseConfig, type ReaperConfig } from "../../reaper/config";
import { EXIT, runSweep, type SweepDeps, type SweepOptions } from "../../reaper/sweep";
import { checked, userInputs } from "./fixtures";
import { useSimulator } from "./harness";
import { PveSimulator } from "./simulator";

const HOUR = 3_600_000;
const PROJECT = "reap-sim";
const STACK = "sweep";
const owner = (stack = STACK) => ({ project: PROJECT, stack, resource: "proxy" });

interface JsonReport {
  backends: Array<{ backend: string; complete: boolean; problem?: string }>;
  items: Array<{ kind: string; name: string; action: string; why: string; state?: string }>;
  removed: Array<{ name: string; outcome: string }>;
}

describe("reaper against the Proxmox simulator", function () {
  this.timeout(120_000);
  const env = useSimulator({ agentDelayMs: 5 });
  let workDir: string;
  beforeEach(() => (workDir = mkdtempSync(join(tmpdir(), "reaper-pve-"))));
  afterEach(() => rmSync(workDir, { recursive: true, force: true }));

  async function createVm(sim: PveSimulator, vmName: string, stack = STACK) {
    const inputs = await checked(userInputs(sim, { vmName, owner: owner(stack) }));
    const { id, outs } = await provider.create(inputs);
    return { id, vmid: outs.vmid as number };
  }

  function stateFile(resources: Array<{ id: string; vmName: string }>): string {
    const file = join(workDir, `state-${Math.random().toString(36).slice(2)}.json`);
    const stack = {
      urn: `urn:pulumi:${STACK}::${PROJECT}::pulumi:pulumi:Stack::${PROJECT}-${STACK}`,
    };
    const proxies = resources.map((resource) => ({
      urn: `urn:pulumi:${STACK}::${PROJECT}::pulumi-nodejs:dynamic:Resource::${resource.vmName}`,
      id: resource.id,
      custom: true,
      outputs: { vmName: resource.vmName },
    }));
    writeFileSync(
      file,
      JSON.stringify({ version: 3, deployment: { resources: [stack, ...proxies] } }),
    );
    return file;
  }

  function config(
    sim: PveSimulator,
    states: ReaperConfig["states"],
    extra: unknown[] = [],
  ): ReaperConfig {
    const tokenFile = join(workDir, "token");
    writeFileSync(tokenFile, `${sim.tokenFor()}\n`);
    const caCertFile = join(workDir, "ca.pem");
    writeFileSync(caCertFile, sim.caCertPem);
    return parseConfig({
      states,
      proxmox: [
        {
          name: "pve",
          apiEndpoint: sim.endpoint,
          apiTokenFile: tokenFile,
          caCertFile,
          nodes: [{ node: sim.node, seedStorage: "seeds" }],
          deleteTimeoutSeconds: 30,
        },
        ...extra,
      ],
    });
  }

  /** Two hours from now: every mark made in the test is then old enough to reap. */
  const later = () => new Date(Date.now() + 2 * HOUR);

  async function sweep(
    cfg: ReaperConfig,
    options: Partial<SweepOptions> = {},
    deps?: SweepDeps,
  ): Promise<{ status: number; report: JsonReport; stderr: string }> {
    let out = "";
    let stderr = "";
    const status = await runSweep(
      cfg,
      { apply: false, json: true, minAgeMs: HOUR, pruneImages: false, now: later(), ...options },
      { out: (text) => (out += text), err: (text) => (stderr += `${text}\n`) },
      deps ?? { openKvm: () => Promise.reject(new Error("no KVM backends here")) },
    );
    return {
      status,
      report: out === "" ? (undefined as never) : (JSON.parse(out) as JsonReport),
      stderr,
    };
  }

  const reapNames = (report: JsonReport) =>
    report.items
      .filter((item) => item.action === "reap")
      .map((item) => item.name)
      .sort();

  it("reports exactly the orphans, removes exactly them (a paused and a stopped one too) with their seeds, and a second run finds nothing", async () => {
    const { sim } = env;
    const keep1 = await createVm(sim, "reap-keep1");
    const keep2 = await createVm(sim, "reap-keep2");
    const stopped = await createVm(sim, "reap-stopped");
    const paused = await createVm(sim, "reap-paused");
    const unknown = await createVm(sim, "reap-unknown", "someone-elses-stack");
    sim.vms.get(stopped.vmid)!.status = "stopped";
    sim.pauseVm(paused.vmid);
    sim.addForeignVm(31001, "hand-made");
    const corruptMark = { ...createMark(owner()), createdAt: "not-a-date" };
    sim.addForeignVm(31002, "reap-corrupt", vmDescription("reap-corrupt", corruptMark));
    sim.addForeignVm(
      31003,
      "reap-future",
      vmDescription("reap-future", createMark(owner(), new Date(Date.now() + 5 * HOUR))),
    );
    // Date.parse reads "1" as the year 2001; the mark's form is strict, so this is no age at all.
    const year2001 = { ...createMark(owner()), createdAt: "1" };
    sim.addForeignVm(31004, "reap-year2001", vmDescription("reap-year2001", year2001));
    const cfg = config(sim, [
      {
        checkpointFile: stateFile([
          { id: keep1.id, vmName: "reap-keep1" },
          { id: keep2.id, vmName: "reap-keep2" },
        ]),
      },
    ]);

    const dry = await sweep(cfg);
    assert.equal(dry.status, EXIT.ok, dry.stderr);
    assert.deepEqual(reapNames(dry.report), ["reap-paused", "reap-stopped"]);
    const why = (name: string) => dry.report.items.find((item) => item.name === name)?.why ?? "";
    assert.match(why("reap-keep1"), /in the state of reap-sim\/sweep/);
    assert.match(
      why("reap-unknown"),
      /unknown owner: no state given for reap-sim\/someone-elses-stack/,
    );
    assert.match(why("reap-corrupt"), /unreadable ownership mark/);
    assert.match(why("reap-future"), /never old enough/);
    assert.match(why("reap-year2001"), /creation time "1" unreadable.*never old enough/);
    assert.ok(
      !dry.report.items.some((item) => item.name === "hand-made"),
      "unmarked VMs are not ours to list",
    );
    assert.equal(sim.vms.size, 1 + 9, "a dry run removes nothing (template + 9 VMs)");

    const applied = await sweep(cfg, { apply: true });
    assert.equal(applied.status, EXIT.ok, applied.stderr);
    assert.deepEqual(
      applied.report.removed.map((removal) => `${removal.name}:${removal.outcome}`).sort(),
      ["reap-paused:removed", "reap-stopped:removed"],
    );
    assert.ok(!sim.vms.has(stopped.vmid) && !sim.vms.has(paused.vmid));
    assert.equal(
      sim.isoFile("seeds", "reap-stopped-seed.iso"),
      undefined,
      "the orphan's seed went with it",
    );
    for (const vmid of [keep1.vmid, keep2.vmid, unknown.vmid, 31001, 31002, 31003, 31004])
      assert.ok(sim.vms.has(vmid), `VM ${vmid} is still there`);
    assert.ok(sim.isoFile("seeds", "reap-keep1-seed.iso"), "a kept VM keeps its seed");

    const again = await sweep(cfg, { apply: true });
    assert.equal(again.status, EXIT.ok, again.stderr);
    assert.deepEqual(reapNames(again.report), []);
  });

  it("deletes nothing on a backend whose API fails mid-listing, nor on one it cannot reach, and exits non-zero", async () => {
    const { sim } = env;
    const orphan = await createVm(sim, "reap-orphan");
    // More VMs than the lister reads at once, so some reads surely come after the break.
    for (let index = 0; index < 12; index++)
      sim.addForeignVm(
        32000 + index,
        `reap-extra${index}`,
        vmDescription(`reap-extra${index}`, createMark(owner())),
      );
    const cfg = config(
      sim,
      [{ checkpointFile: stateFile([]) }],
      [
        {
          name: "pve-unreachable",
          apiEndpoint: "https://127.0.0.1:1",
          apiTokenFile: join(workDir, "token"),
          nodes: [{ node: "pve", seedStorage: "seeds" }],
        },
      ],
    );
    let broke = false;
    const deps: SweepDeps = {
      openKvm: () => Promise.reject(new Error("no KVM backends here")),
      onProxmoxVmRead: () => {
        // The API goes away after the first VM's config: every later call answers 5xx.
        broke = true;
        sim.options.serverErrorRate = 1;
      },
    };
    const result = await sweep(cfg, { apply: true }, deps);
    sim.options.serverErrorRate = 0;
    assert.ok(broke);
    assert.equal(result.status, EXIT.incomplete);
    assert.deepEqual(
      result.report.backends.map((backend) => `${backend.backend}:${backend.complete}`),
      ["pve:false", "pve-unreachable:false"],
    );
    assert.deepEqual(result.report.removed, []);
    assert.ok(sim.vms.has(orphan.vmid));
    assert.match(result.stderr, /pve-unreachable not listed completely/);
  });

  it("a rejected token names its id and the file it was read from, never the secret", async () => {
    const { sim } = env;
    const cfg = config(sim, [{ checkpointFile: stateFile([]) }]);
    const tokenFile = join(workDir, "token");
    writeFileSync(tokenFile, "automation@pve!egress=stale-secret-0000\n");
    const requestsBefore = sim.requestLog.length;
    const result = await sweep(cfg);
    assert.equal(result.status, EXIT.incomplete);
    // The refused listing is the only request: no retry, no second look.
    assert.deepEqual(sim.requestLog.slice(requestsBefore), ["GET /api2/json/cluster/resources"]);
    const problem = result.report.backends[0]!.problem ?? "";
    assert.ok(
      problem.includes(`API token automation@pve!egress (from apiTokenFile ${tokenFile})`),
      problem,
    );
    assert.ok(!`${problem}${result.stderr}`.includes("stale-secret-0000"));
  });

  it("deletes nothing at all when a state does not parse", async () => {
    const { sim } = env;
    const orphan = await createVm(sim, "reap-orphan");
    const broken = join(workDir, "broken.json");
    writeFileSync(broken, JSON.stringify({ version: 4, deployment: {} }));
    const result = await sweep(
      config(sim, [{ checkpointFile: stateFile([]) }, { checkpointFile: broken }]),
      {
        apply: true,
      },
    );
    assert.equal(result.status, EXIT.state);
    assert.match(
      result.stderr,
      /broken\.json is neither a stack export nor a checkpoint of version 3/,
    );
    assert.ok(sim.vms.has(orphan.vmid));
  });

  it("removing a VM that is already gone is fine", async () => {
    const { sim } = env;
    const orphan = await createVm(sim, "reap-gone");
    const cfg = config(sim, [{ checkpointFile: stateFile([]) }]);
    // Gone between the listing and the delete: the delete finds nothing and says so.
    const deps: SweepDeps = {
      openKvm: () => Promise.reject(new Error("no KVM backends here")),
      onProxmoxVmRead: (vmid) => sim.removeVmOutOfBand(vmid),
    };
    const result = await sweep(cfg, { apply: true }, deps);
    assert.equal(result.status, EXIT.ok, result.stderr);
    assert.deepEqual(result.report.removed, [
      { backend: "pve", kind: "proxmox-vm", name: "reap-gone", outcome: "already gone" },
    ]);
    assert.ok(!sim.vms.has(orphan.vmid));
  });

  describe("seed ISOs whose VM is gone", () => {
    const seedConfig = (
      sim: PveSimulator,
      resources: Array<{ id: string; vmName: string }>,
      rule?: { namePrefix: string },
    ): ReaperConfig => {
      config(sim, [{ checkpointFile: stateFile([]) }]); // writes the token and CA files
      return parseConfig({
        states: [{ checkpointFile: stateFile(resources) }],
        proxmox: [
          {
            name: "pve",
            apiEndpoint: sim.endpoint,
            apiTokenFile: join(workDir, "token"),
            caCertFile: join(workDir, "ca.pem"),
            nodes: [{ node: sim.node, seedStorage: "seeds" }],
            deleteTimeoutSeconds: 30,
            ...(rule === undefined
              ? {}
              : { unmarkedVolumes: { owner: { project: PROJECT, stack: STACK }, ...rule } }),
          },
        ],
      });
    };
    const seedItems = (report: JsonReport) =>
      report.items
        .filter((item) => item.kind === "seed")
        .map((item) => `${item.name} ${item.action}: ${item.why}`)
        .sort();
    const now = () => ({ now: new Date() });

    it("lists an old orphaned seed of ours and removes it with --apply; leaves a young one and a foreign one", async () => {
      const { sim } = env;
      const live = await createVm(sim, "proxy-live");
      sim.putIsoFile("seeds", "proxy-old-seed.iso", Buffer.from("old"), 3 * 3600);
      sim.putIsoFile("seeds", "proxy-young-seed.iso", Buffer.from("young"), 630);
      sim.putIsoFile("seeds", "other-old-seed.iso", Buffer.from("other"), 3 * 3600);
      sim.putIsoFile("seeds", "debian-13-netinst.iso", Buffer.from("install media"), 9 * 3600);
      const cfg = seedConfig(sim, [{ id: live.id, vmName: "proxy-live" }], {
        namePrefix: "proxy-",
      });
      const dry = await sweep(cfg, now());
      assert.equal(dry.status, EXIT.ok, dry.stderr);
      assert.deepEqual(seedItems(dry.report), [
        "other-old-seed.iso keep: no domain, but volumes carry no mark: owner unknown (see unmarkedVolumes)",
        `proxy-old-seed.iso reap: not in the state of ${PROJECT}/${STACK} (owner from the config: no mark)`,
        "proxy-young-seed.iso keep: younger than --min-age (10m)",
      ]);
      assert.ok(sim.isoFile("seeds", "proxy-old-seed.iso"));
      const applied = await sweep(cfg, { ...now(), apply: true });
      assert.equal(applied.status, EXIT.ok, applied.stderr);
      assert.deepEqual(applied.report.removed, [
        { backend: "pve", kind: "seed", name: "proxy-old-seed.iso", outcome: "removed" },
      ]);
      assert.equal(sim.isoFile("seeds", "proxy-old-seed.iso"), undefined);
      for (const kept of [
        "proxy-young-seed.iso",
        "other-old-seed.iso",
        "debian-13-netinst.iso",
        "proxy-live-seed.iso",
      ])
        assert.ok(sim.isoFile("seeds", kept), kept);
    });

    it("without unmarkedVolumes an orphaned seed is reported with an unknown owner and never removed", async () => {
      const { sim } = env;
      sim.putIsoFile("seeds", "proxy-old-seed.iso", Buffer.from("old"), 3 * 3600);
      const applied = await sweep(seedConfig(sim, []), { ...now(), apply: true });
      assert.equal(applied.status, EXIT.ok, applied.stderr);
      assert.deepEqual(seedItems(applied.report), [
        "proxy-old-seed.iso keep: no domain, but volumes carry no mark: owner unknown (see unmarkedVolumes)",
      ]);
      assert.deepEqual(applied.report.removed, []);
      assert.ok(sim.isoFile("seeds", "proxy-old-seed.iso"));
    });

    it("a seed a VM still uses (by its name, or named in another VM's config) is not listed", async () => {
      const { sim } = env;
      const vm = await createVm(sim, "proxy-attached");
      // Another VM mounts an old seed by hand: its config names the file.
      sim.putIsoFile("seeds", "proxy-borrowed-seed.iso", Buffer.from("x"), 3 * 3600);
      sim.addForeignVm(31010, "hand-made");
      sim.vms.get(31010)!.config.ide2 = "seeds:iso/proxy-borrowed-seed.iso,media=cdrom";
      const cfg = seedConfig(sim, [{ id: vm.id, vmName: "proxy-attached" }], {
        namePrefix: "proxy-",
      });
      const dry = await sweep(cfg, now());
      assert.equal(dry.status, EXIT.ok, dry.stderr);
      assert.deepEqual(seedItems(dry.report), []);
    });
  });
});
