/**
 * The reaper against the real lab libvirtd, over the lab's sshd. Marked
 * domains and volumes are made directly (defined, or started and paused: no
 * guest boots). The pool is shared with other tests and people, so every
 * name here starts with this run's prefix, every mark names this run's own
 * project, the sweep is scoped to that project, and each test checks that
 * nothing outside the prefix is ever planned for removal.
 */
import { strict as assert } from "node:assert";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createMark, type OwnershipMark } from "../../provider/common/mark";
import { buildDomainXml } from "../../provider/kvm/domain-xml";
import { baseImageMarkerName, overlayVolumeName, seedVolumeName } from "../../provider/kvm/naming";
import { overlayVolumeXml } from "../../provider/kvm/volume-xml";
import {
  ListAllDomainsFlags,
  Procedures,
  type LibvirtConnection,
  type StoragePoolHandle,
} from "../../provider/libvirt-rpc-xdr";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { parseConfig, type ReaperConfig } from "../../reaper/config";
import { backingPathOf, deleteKvmEntry, sessionOver, volumeTime } from "../../reaper/kvm";
import { EXIT, runSweep, type SweepDeps, type SweepOptions } from "../../reaper/sweep";
import { useLab, type LabEnv } from "./fixture";
import { deleteVolumeIfPresent, removeDomainIfPresent } from "./helpers";
import { openLabSshWithServerPids, signalAll } from "./ssh-helpers";

const HOUR = 3_600_000;
const RUN = `${process.pid.toString(36)}${Math.random().toString(36).slice(2, 6)}`;
const PREFIX = `reap-${RUN}-`;
/** This run's fake base images: named like the cache's, so the reaper takes them for bases. */
const BASE_PREFIX = `egress-base-reap${RUN}`;
const PROJECT = `reap-lab-${RUN}`;
const STACK = "sweep";
const owner = (stack = STACK, resource = "proxy") => ({ project: PROJECT, stack, resource });
const twoHoursAgo = () => new Date(Date.now() - 2 * HOUR);

interface JsonReport {
  backends: Array<{ backend: string; complete: boolean; problem?: string }>;
  items: Array<{ kind: string; name: string; action: string; why: string; state?: string }>;
  removed: Array<{ name: string; outcome: string }>;
}

describe("reaper in the lab (real libvirtd over SSH)", function () {
  this.timeout(180_000);
  let lab: LabEnv;
  let inspector: LibvirtConnection;
  let pool: StoragePoolHandle;
  let workDir: string;
  const vm = (suffix: string) => `${PREFIX}${suffix}`;

  before(async () => {
    lab = await useLab();
    inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
    pool = await inspector.call(Procedures.storagePoolLookupByName, { name: lab.pool });
    workDir = mkdtempSync(join(tmpdir(), "reaper-lab-"));
  });

  after(async () => {
    if (inspector) await removeEverythingOfThisRun().catch(() => undefined);
    await inspector?.close();
    if (workDir) rmSync(workDir, { recursive: true, force: true });
  });

  /** Only names with this run's prefix: the pool is shared. */
  async function removeEverythingOfThisRun(): Promise<void> {
    const { domains } = await inspector.call(Procedures.connectListAllDomains, {
      needResults: 1,
      flags: 0,
    });
    for (const dom of domains)
      if (dom.name.startsWith(PREFIX)) await removeDomainIfPresent(inspector, dom.name);
    for (const name of await volumeNames())
      if (name.startsWith(PREFIX) || name.startsWith(BASE_PREFIX))
        await deleteVolumeIfPresent(inspector, pool, name);
  }

  async function volumeNames(): Promise<string[]> {
    const { vols } = await inspector.call(Procedures.storagePoolListAllVolumes, {
      pool,
      needResults: 1,
      flags: 0,
    });
    return vols.map((vol) => vol.name);
  }

  async function domainNames(): Promise<string[]> {
    const { domains } = await inspector.call(Procedures.connectListAllDomains, {
      needResults: 1,
      flags: 0,
    });
    return domains.map((dom) => dom.name);
  }

  /** A volume, its file dated `age` ago: the pool's timestamps are the reaper's only clock for volumes. */
  async function makeVolume(
    name: string,
    format: "qcow2" | "raw",
    ageMs = 2 * HOUR,
    xml = `<volume><name>${name}</name><capacity unit='bytes'>${16 * 1024 * 1024}</capacity><target><format type='${format}'/></target></volume>`,
  ) {
    const vol = await inspector.call(Procedures.storageVolCreateXml, { pool, xml, flags: 0 });
    const path = await inspector.call(Procedures.storageVolGetPath, { vol });
    const then = new Date(Date.now() - ageMs);
    utimesSync(path, then, then);
    return vol;
  }

  /** A KvmProxy-shaped domain with its two volumes; started and paused when asked (no guest needed). */
  async function makeVm(
    name: string,
    mark: OwnershipMark,
    state: "defined" | "paused" = "defined",
  ): Promise<void> {
    await makeVolume(overlayVolumeName(name), "qcow2");
    await makeVolume(seedVolumeName(name), "raw");
    const xml = buildDomainXml({
      name,
      domainType: "qemu",
      vcpus: 1,
      memoryMiB: 64,
      firmware: "bios",
      cpuMode: { model: "qemu64" },
      pool: lab.pool,
      overlayVolume: overlayVolumeName(name),
      seedVolume: seedVolumeName(name),
      network: { bridge: lab.bridge },
      mac: "52:54:00:aa:bb:cc",
      mark,
    });
    const dom = await inspector.call(Procedures.domainDefineXml, { xml });
    if (state === "paused") {
      await inspector.call(Procedures.domainCreate, { dom });
      // The protocol module has no DOMAIN_SUSPEND (nothing in the provider pauses a VM): virsh does it.
      execFileSync("virsh", ["-q", "-c", lab.uri, "suspend", name]);
    }
  }

  function stateFile(vmNames: string[], label: string): string {
    const file = join(workDir, `state-${Math.random().toString(36).slice(2)}.json`);
    const resources = [
      { urn: `urn:pulumi:${STACK}::${PROJECT}::pulumi:pulumi:Stack::${PROJECT}-${STACK}` },
      ...vmNames.map((name) => ({
        urn: `urn:pulumi:${STACK}::${PROJECT}::pulumi-nodejs:dynamic:Resource::${name}`,
        id: `hosts/${label}/domains/${name}`,
        custom: true,
        outputs: { vmName: name },
      })),
    ];
    writeFileSync(file, JSON.stringify({ version: 3, deployment: { resources } }));
    return file;
  }

  function config(states: ReaperConfig["states"]): ReaperConfig {
    return parseConfig({
      states,
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
          unmarkedVolumes: { owner: { project: PROJECT, stack: STACK }, namePrefix: PREFIX },
        },
      ],
    });
  }

  const label = () => `${lab.sshHost}:${lab.sshPort}`;

  async function sweep(
    cfg: ReaperConfig,
    options: Partial<SweepOptions> = {},
    deps?: SweepDeps,
  ): Promise<{ status: number; report: JsonReport; stderr: string }> {
    let out = "";
    let stderr = "";
    const status = await runSweep(
      cfg,
      {
        apply: false,
        json: true,
        minAgeMs: HOUR,
        pruneImages: false,
        project: PROJECT,
        ...options,
      },
      { out: (text) => (out += text), err: (text) => (stderr += `${text}\n`) },
      deps,
    );
    return {
      status,
      report: out === "" ? (undefined as never) : (JSON.parse(out) as JsonReport),
      stderr,
    };
  }

  /** Safety in a shared pool: whatever this run plans to remove carries this run's prefix. */
  function assertOnlyOurs(report: JsonReport): void {
    const strangers = report.items.filter(
      (item) => item.action === "reap" && !item.name.startsWith(PREFIX),
    );
    assert.deepEqual(strangers, [], "nothing outside this run's prefix is planned for removal");
  }

  const reapNames = (report: JsonReport) =>
    report.items
      .filter((item) => item.action === "reap")
      .map((item) => item.name)
      .sort();

  it("lists volumes of a pool and reads a volume's timestamps and backing file (protocol 282 and 99)", async () => {
    const vol = await makeVolume(`${PREFIX}probe.qcow2`, "qcow2", 3 * HOUR);
    const { vols, ret } = await inspector.call(Procedures.storagePoolListAllVolumes, {
      pool,
      needResults: 1,
      flags: 0,
    });
    assert.equal(ret, vols.length);
    assert.ok(vols.some((listed) => listed.name === vol.name && listed.pool === lab.pool));
    const xml = await inspector.call(Procedures.storageVolGetXmlDesc, { vol, flags: 0 });
    const age = Date.now() - Date.parse(volumeTime(xml)!);
    assert.ok(age > 2.9 * HOUR && age < 3.1 * HOUR, `the file's mtime is 3 h back (got ${age} ms)`);
    assert.equal(backingPathOf(xml), undefined, "a plain qcow2 has no backing file");
    assert.equal(
      backingPathOf(
        "<volume><backingStore><path>/pool/egress-base-x.qcow2</path><format type='qcow2'/></backingStore></volume>",
      ),
      "/pool/egress-base-x.qcow2",
    );
    await deleteVolumeIfPresent(inspector, pool, vol.name);
  });

  it("reports exactly the orphans in a dry run, removes exactly them with --apply, and a second run finds nothing", async () => {
    const [kept1, kept2, stopped, paused] = ["keep1", "keep2", "stopped", "paused"].map(vm);
    await makeVm(kept1!, createMark(owner(), twoHoursAgo()));
    await makeVm(kept2!, createMark(owner(), twoHoursAgo()));
    await makeVm(stopped!, createMark(owner(), twoHoursAgo()));
    await makeVm(paused!, createMark(owner(), twoHoursAgo()), "paused");
    const young = vm("young");
    await makeVm(young, createMark(owner(), new Date()));
    const corrupt = vm("corrupt");
    await makeVm(corrupt, { ...createMark(owner(), twoHoursAgo()), createdAt: "not-a-date" });
    const unknown = vm("unknown");
    await makeVm(unknown, createMark(owner("someone-elses-stack"), twoHoursAgo()));
    // Date.parse reads "1" as the year 2001; the mark's time form is strict, so this has no age.
    const year2001 = vm("year2001");
    await makeVm(year2001, { ...createMark(owner(), twoHoursAgo()), createdAt: "1" });
    // A create that died before define: the volume pair, and a lone seed.
    await makeVolume(overlayVolumeName(vm("left")), "qcow2");
    await makeVolume(seedVolumeName(vm("left")), "raw");
    await makeVolume(seedVolumeName(vm("seedonly")), "raw");
    const cfg = config([{ checkpointFile: stateFile([kept1!, kept2!], label()) }]);

    const dry = await sweep(cfg);
    assert.equal(dry.status, EXIT.ok, dry.stderr);
    assert.deepEqual(dry.report.backends, [{ backend: "lab", complete: true }]);
    assertOnlyOurs(dry.report);
    const orphans = [
      stopped!,
      paused!,
      overlayVolumeName(vm("left")),
      seedVolumeName(vm("left")),
      seedVolumeName(vm("seedonly")),
    ].sort();
    assert.deepEqual(reapNames(dry.report), orphans);
    const why = (name: string) => dry.report.items.find((item) => item.name === name)?.why ?? "";
    assert.match(why(corrupt), /unreadable ownership mark/);
    assert.match(why(unknown), /unknown owner/);
    assert.match(why(year2001), /creation time "1" unreadable.*never old enough/);
    assert.match(why(young), /younger than --min-age/);
    assert.match(why(kept1!), /in the state of/);
    assert.equal(dry.report.items.find((item) => item.name === paused)?.state, "paused");
    assert.deepEqual(dry.report.removed, []);
    assert.ok((await domainNames()).includes(stopped!), "a dry run removes nothing");

    const applied = await sweep(cfg, { apply: true });
    assert.equal(applied.status, EXIT.ok, applied.stderr);
    assertOnlyOurs(applied.report);
    assert.deepEqual(applied.report.removed.map((removal) => removal.name).sort(), orphans);
    assert.ok(applied.report.removed.every((removal) => removal.outcome === "removed"));
    const domains = await domainNames();
    const volumes = await volumeNames();
    for (const gone of [stopped!, paused!]) {
      assert.ok(!domains.includes(gone), `${gone} was removed`);
      assert.ok(!volumes.includes(overlayVolumeName(gone)), `${gone}'s overlay was removed`);
      assert.ok(!volumes.includes(seedVolumeName(gone)), `${gone}'s seed was removed`);
    }
    for (const name of [
      overlayVolumeName(vm("left")),
      seedVolumeName(vm("left")),
      seedVolumeName(vm("seedonly")),
    ])
      assert.ok(!volumes.includes(name), `${name} was removed`);
    for (const kept of [kept1!, kept2!, young, corrupt, unknown, year2001]) {
      assert.ok(domains.includes(kept), `${kept} is still there`);
      assert.ok(volumes.includes(overlayVolumeName(kept)), `${kept}'s overlay is still there`);
    }

    const again = await sweep(cfg, { apply: true });
    assert.equal(again.status, EXIT.ok, again.stderr);
    assert.deepEqual(reapNames(again.report), []);

    // Deleting what is already gone is fine: the entry applied a second time.
    const session = sessionOver(await openLocalLibvirt({ socketPath: lab.libvirtSocket }), label());
    try {
      const entry = {
        item: {
          backend: "lab",
          host: label(),
          kind: "domain" as const,
          name: stopped!,
          vmName: stopped!,
          ownership: { kind: "marked" as const, mark: createMark(owner()) },
        },
        action: "reap" as const,
        why: "test",
        ownerStack: `${PROJECT}/${STACK}`,
      };
      assert.equal(await deleteKvmEntry(session, cfg.kvm[0]!, entry), "already gone");
      const seedEntry = {
        ...entry,
        item: {
          ...entry.item,
          kind: "seed" as const,
          name: seedVolumeName(vm("seedonly")),
          pool: lab.pool,
        },
      };
      assert.equal(await deleteKvmEntry(session, cfg.kvm[0]!, seedEntry), "already gone");
    } finally {
      await session.close();
    }
  });

  it("deletes nothing and exits non-zero when the SSH link is killed mid-sweep", async () => {
    const orphan = vm("cut");
    await makeVm(orphan, createMark(owner(), twoHoursAgo()));
    await makeVolume(seedVolumeName(vm("cutseed")), "raw");
    const cfg = config([{ checkpointFile: stateFile([], label()) }]);
    let serverPids: number[] = [];
    let killed = false;
    const deps: SweepDeps = {
      openKvm: async () => {
        const dialled = await openLabSshWithServerPids(lab);
        serverPids = dialled.serverPids;
        return sessionOver(dialled.conn, label());
      },
      // Cut right after the orphan's own mark was read: it is listed, but the listing is not complete.
      onKvmDomainRead: (name) => {
        if (killed || name !== orphan) return;
        killed = true;
        signalAll(serverPids, "SIGKILL");
      },
    };
    const cut = await sweep(cfg, { apply: true }, deps);
    assert.ok(killed, "the link was cut during the listing");
    assert.equal(cut.status, EXIT.incomplete);
    assert.equal(cut.report.backends[0]!.complete, false);
    assert.match(cut.stderr, /lab not listed completely/);
    assert.deepEqual(cut.report.removed, []);
    assert.deepEqual(reapNames(cut.report), []);
    const listed = cut.report.items.find((item) => item.name === orphan);
    assert.equal(listed?.action, "keep");
    assert.match(listed?.why ?? "", /orphan, but lab was not listed completely/);
    assert.ok((await domainNames()).includes(orphan), "the orphan is still there");
    assert.ok((await volumeNames()).includes(seedVolumeName(vm("cutseed"))));
  });

  it("deletes nothing at all when a state does not parse or a state command fails", async () => {
    const orphan = vm("badstate");
    await makeVm(orphan, createMark(owner(), twoHoursAgo()));
    const broken = join(workDir, "broken.json");
    writeFileSync(broken, '{"version": 3, "deployment": ');
    for (const states of [
      [{ checkpointFile: stateFile([], label()) }, { checkpointFile: broken }],
      [{ checkpointFile: stateFile([], label()) }, { command: ["false"] }],
    ] as ReaperConfig["states"][]) {
      const result = await sweep(config(states), { apply: true });
      assert.equal(result.status, EXIT.state);
      assert.match(result.stderr, /nothing was listed or deleted/);
    }
    assert.ok((await domainNames()).includes(orphan), "the orphan is still there");
    const { domains } = await inspector.call(Procedures.connectListAllDomains, {
      needResults: 1,
      flags: ListAllDomainsFlags.INACTIVE,
    });
    assert.ok(domains.some((dom) => dom.name === orphan));
  });

  it("with --prune-images plans an unused base image for removal and keeps one an overlay backs onto", async () => {
    const used = `${BASE_PREFIX}used.qcow2`;
    const free = `${BASE_PREFIX}free.qcow2`;
    const usedVol = await makeVolume(used, "qcow2");
    await makeVolume(baseImageMarkerName(used), "raw");
    await makeVolume(free, "qcow2");
    await makeVolume(baseImageMarkerName(free), "raw");
    const usedPath = await inspector.call(Procedures.storageVolGetPath, { vol: usedVol });
    const overlay = overlayVolumeName(vm("onbase"));
    await makeVolume(
      overlay,
      "qcow2",
      2 * HOUR,
      overlayVolumeXml(overlay, 16n * 1024n * 1024n, { path: usedPath, format: "qcow2" }),
    );
    const cfg = config([{ checkpointFile: stateFile([], label()) }]);
    // A dry run without --project: other people's bases in the shared pool are only looked at.
    const dry = await sweep(cfg, { pruneImages: true, project: undefined });
    assert.equal(dry.status, EXIT.ok, dry.stderr);
    const entry = (name: string) => dry.report.items.find((item) => item.name === name);
    assert.equal(entry(free)?.action, "reap");
    assert.match(entry(free)?.why ?? "", /no overlay backs onto it/);
    assert.equal(entry(used)?.action, "keep");
    assert.match(entry(used)?.why ?? "", new RegExp(`backs ${overlay.replace(/\./g, "\\.")}`));
    assert.ok(
      !dry.report.items.some((item) => item.name.endsWith(".ready")),
      "markers are not listed on their own",
    );

    // Removing just this run's unused base (the shared pool's others stay): base and marker go.
    const session = sessionOver(await openLocalLibvirt({ socketPath: lab.libvirtSocket }), label());
    try {
      const removed = await deleteKvmEntry(session, cfg.kvm[0]!, {
        item: {
          backend: "lab",
          host: label(),
          kind: "base-image",
          name: free,
          pool: lab.pool,
          ownership: { kind: "shared", usedBy: [] },
        },
        action: "reap",
        why: "test",
      });
      assert.equal(removed, "removed");
    } finally {
      await session.close();
    }
    const volumes = await volumeNames();
    assert.ok(!volumes.includes(free) && !volumes.includes(baseImageMarkerName(free)));
    assert.ok(volumes.includes(used) && volumes.includes(baseImageMarkerName(used)));
    for (const name of [overlay, baseImageMarkerName(used), used])
      await deleteVolumeIfPresent(inspector, pool, name);
  });
});
