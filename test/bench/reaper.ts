/**
 * The reaper's sweep of one host: 500 marked domains (defined, not started),
 * half of them in the given state, listed over SSH and planned exactly as
 * `egress-reaper --json` does (a dry run: nothing is removed by the timed run).
 * Printed as `bench reaper_sweep_500_seconds=<x>`.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createMark } from "../../provider/common/mark";
import { buildDomainXml } from "../../provider/kvm/domain-xml";
import { Procedures, type LibvirtConnection } from "../../provider/libvirt-rpc-xdr";
import { openLocalLibvirt } from "../../provider/ssh";
import { parseConfig } from "../../reaper/config";
import { runSweep } from "../../reaper/sweep";
import { removeDomainIfPresent } from "../lab/helpers";
import { stopWhatThisProcessStarted, useLab, type LabEnv } from "../lab/lab";
import { printBench, timeMsAsync } from "./measure";

const DOMAINS = 500;
const HOUR = 3_600_000;

async function defineMarkedDomains(
  conn: LibvirtConnection,
  lab: LabEnv,
  names: string[],
  project: string,
): Promise<void> {
  const mark = createMark(
    { project, stack: "bench", resource: "proxy" },
    new Date(Date.now() - 2 * HOUR),
  );
  await Promise.all(
    names.map((name) =>
      conn.call(Procedures.domainDefineXml, {
        xml: buildDomainXml({
          name,
          domainType: "qemu",
          vcpus: 1,
          memoryMiB: 64,
          firmware: "bios",
          cpuMode: { model: "qemu64" },
          pool: lab.pool,
          overlayVolume: `${name}.qcow2`,
          seedVolume: `${name}-seed.iso`,
          network: { bridge: lab.bridge },
          mac: "52:54:00:be:0c:00",
          mark,
        }),
      }),
    ),
  );
}

export async function runReaperBenchmarks(): Promise<void> {
  const lab = await useLab();
  const run = process.pid.toString(36);
  const project = `reap-bench-${run}`;
  const names = Array.from({ length: DOMAINS }, (_, i) => `reap-bench-${run}-${i}`);
  const setup = await openLocalLibvirt({ socketPath: lab.libvirtSocket }).catch(
    async (error: unknown) => {
      await stopWhatThisProcessStarted();
      throw error;
    },
  );
  // Made only once the lab answers, so a failed connect leaves nothing in /tmp.
  const dir = mkdtempSync(join(tmpdir(), "reaper-bench-"));
  try {
    await defineMarkedDomains(setup, lab, names, project);
    const label = `${lab.sshHost}:${lab.sshPort}`;
    const state = join(dir, "state.json");
    writeFileSync(
      state,
      JSON.stringify({
        version: 3,
        deployment: {
          resources: names.slice(0, DOMAINS / 2).map((name) => ({
            urn: `urn:pulumi:bench::${project}::pulumi-nodejs:dynamic:Resource::${name}`,
            id: `hosts/${label}/domains/${name}`,
          })),
        },
      }),
    );
    const config = parseConfig({
      states: [{ checkpointFile: state }],
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
    });
    let output = "";
    let status = -1;
    const ms = await timeMsAsync(async () => {
      status = await runSweep(
        config,
        { apply: false, json: true, minAgeMs: HOUR, pruneImages: false, project },
        { out: (text) => (output += text), err: () => undefined },
      );
    });
    const report = JSON.parse(output) as { items: Array<{ name: string; action: string }> };
    const orphans = report.items.filter((item) => item.action === "reap");
    if (status !== 0 || orphans.length !== DOMAINS / 2)
      throw new Error(
        `sweep planned ${orphans.length} orphans (status ${status}), expected ${DOMAINS / 2}`,
      );
    if (orphans.some((item) => !item.name.startsWith(`reap-bench-${run}-`)))
      throw new Error("the bench sweep planned to remove something it did not make");
    printBench("reaper_sweep_500_seconds", ms / 1000);
  } finally {
    for (const name of names) await removeDomainIfPresent(setup, name).catch(() => undefined);
    await setup.close();
    rmSync(dir, { recursive: true, force: true });
    await stopWhatThisProcessStarted();
  }
}
