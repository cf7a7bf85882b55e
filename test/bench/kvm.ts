/**
 * KvmProxy create overhead with a cached image: our provider's create (over
 * the lab's sshd, readiness off so guest boot is not counted) beside the same
 * sequence in one `virsh` session over qemu+ssh:// to the same sshd: overlay,
 * seed volume + upload, define, start. Prints
 * `bench create_overhead_ratio_vs_virsh=<ours/virsh>` (lower is better) and
 * `bench create_rpc_count=<libvirt calls + streams in one create>`, and what the
 * preflight before every create costs: `bench preflight_extra_round_trips=<n>`
 * (sequential round trips: a call issued while none is in flight starts one),
 * `bench preflight_rpc_calls=<n>` and `bench preflight_ms=<median>` on a warm link (what
 * every create after the first pays), `bench preflight_first_on_link_rpc_calls=<n>` on a
 * new one; the round trips are the larger of the two.
 */
import { execFile } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { createMark } from "../../provider/common/mark";
import { Deadline } from "../../provider/common/deadline";
import { closeAllHosts, openHost } from "../../provider/kvm/connect";
import { assertHostReady } from "../../provider/kvm/host-facts";
import { buildDomainXml } from "../../provider/kvm/domain-xml";
import { macAddressFor } from "../../provider/kvm/naming";
import type { KvmProxyInputs } from "../../provider/kvm/schema";
import * as kvm from "../../provider/kvm/provider";
import { LibvirtConnection } from "../../provider/libvirt-rpc-xdr";
import { buildNoCloudSeed } from "../../provider/nocloud";
import { stopWhatThisProcessStarted, useLab, type LabEnv } from "../lab/lab";
import { ensureProxyImage, labConnection, serveImage } from "../lab/kvm-support";
import { median, printBench, timeMsAsync } from "./measure";

const run = promisify(execFile);
const ROUNDS = 3;
const owner = { project: "egress-bench", stack: "kvm", resource: "bench" };

function virshUri(lab: LabEnv): string {
  return `qemu+ssh://${lab.sshUser}@${lab.sshHost}:${lab.sshPort}/system?keyfile=${lab.clientKey}&no_verify=1`;
}

/**
 * Counts libvirt calls and streams made through any connection while `action`
 * runs, and the sequential round trips among them: a call issued while no
 * other is in flight starts a new round; calls pipelined behind it share it.
 */
async function countRpcs(action: () => Promise<unknown>): Promise<number> {
  return (await countRpcRounds(action)).calls;
}

async function countRpcRounds(
  action: () => Promise<unknown>,
): Promise<{ calls: number; rounds: number }> {
  const prototype = LibvirtConnection.prototype as unknown as Record<
    string,
    (...args: unknown[]) => unknown
  >;
  const originals = { call: prototype.call, upload: prototype.upload };
  let calls = 0;
  let rounds = 0;
  let inFlight = 0;
  for (const name of ["call", "upload"] as const) {
    const original = originals[name];
    prototype[name] = function (this: unknown, ...args: unknown[]) {
      calls++;
      if (inFlight === 0) rounds++;
      inFlight++;
      const settled = () => void inFlight--;
      const result = original.apply(this, args) as Promise<unknown>;
      result.then(settled, settled);
      return result;
    };
  }
  try {
    await action();
  } finally {
    prototype.call = originals.call;
    prototype.upload = originals.upload;
  }
  return { calls, rounds };
}

export async function runKvmBenchmarks(): Promise<void> {
  const lab = await useLab();
  const image = await ensureProxyImage();
  const server = await serveImage(image);
  const scratch = join(tmpdir(), `egress-bench-kvm-${process.pid}`);
  const inputsFor = async (vmName: string) =>
    (
      await kvm.check(
        {},
        {
          vmName,
          owner,
          connection: labConnection(lab),
          pool: lab.pool,
          network: { bridge: lab.bridge },
          domainType: "qemu",
          memoryMiB: 256,
          image: { url: server.url, sha256: image.sha256 },
          userData: "#cloud-config\n",
          readiness: { mode: "none" },
        },
      )
    ).inputs;
  try {
    // Warm the image cache (and the SSH link, as a `pulumi up` with several proxies has it).
    const warm = await kvm.create(await inputsFor("bench-warm"));
    await kvm.remove(warm.id, warm.outs);
    const base = String(warm.outs.imageVolume);
    const basePath = `${lab.labDir}/pool/${base}`;

    const ours: number[] = [];
    let rpcs = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const inputs = await inputsFor(`bench-ours-${round}`);
      let result: Awaited<ReturnType<typeof kvm.create>> | undefined;
      const ms = await timeMsAsync(async () => {
        rpcs = await countRpcs(async () => {
          result = await kvm.create(inputs);
        });
      });
      ours.push(ms);
      await kvm.remove(result!.id, result!.outs);
    }

    // The preflight alone: first on a new link (what the first create of a `pulumi up` pays),
    // then on the warm link every create after the first uses, which remembers the version and
    // the domain capabilities.
    const preflightInputs = (await inputsFor("bench-preflight")) as unknown as KvmProxyInputs;
    await closeAllHosts();
    const session = await openHost(preflightInputs, Deadline.afterSeconds(60, "bench"));
    const firstPreflightCost = await countRpcRounds(() =>
      assertHostReady(session.host, preflightInputs),
    );
    const preflight: number[] = [];
    let preflightCost = { calls: 0, rounds: 0 };
    for (let round = 0; round < 5; round++)
      preflight.push(
        await timeMsAsync(async () => {
          preflightCost = await countRpcRounds(() =>
            assertHostReady(session.host, preflightInputs),
          );
        }),
      );

    const theirs: number[] = [];
    rmSync(scratch, { recursive: true, force: true });
    await run("mkdir", ["-p", scratch]);
    for (let round = 0; round < ROUNDS; round++) {
      const vmName = `bench-virsh-${round}`;
      const seed = buildNoCloudSeed({ vmName, userData: "#cloud-config\n" });
      const seedFile = join(scratch, `${vmName}-seed.iso`);
      writeFileSync(seedFile, seed.image.toBuffer());
      const xmlFile = join(scratch, `${vmName}.xml`);
      writeFileSync(
        xmlFile,
        buildDomainXml({
          name: vmName,
          domainType: "qemu",
          vcpus: 1,
          memoryMiB: 256,
          firmware: "uefi",
          cpuMode: { model: "qemu64" },
          pool: lab.pool,
          overlayVolume: `${vmName}.qcow2`,
          seedVolume: `${vmName}-seed.iso`,
          network: { bridge: lab.bridge },
          mac: macAddressFor(vmName),
          mark: createMark(owner),
        }),
      );
      const script = [
        `vol-create-as ${lab.pool} ${vmName}.qcow2 10737418240b --format qcow2 --backing-vol ${basePath} --backing-vol-format qcow2`,
        `vol-create-as ${lab.pool} ${vmName}-seed.iso ${seed.image.size}b --format raw`,
        `vol-upload --pool ${lab.pool} ${vmName}-seed.iso ${seedFile}`,
        `define ${xmlFile}`,
        `start ${vmName}`,
      ].join(" ; ");
      theirs.push(await timeMsAsync(() => run("virsh", ["-q", "-c", virshUri(lab), script])));
      await run("virsh", [
        "-q",
        "-c",
        "qemu:///system",
        `destroy ${vmName} ; undefine ${vmName} --nvram ; vol-delete --pool ${lab.pool} ${vmName}.qcow2 ; vol-delete --pool ${lab.pool} ${vmName}-seed.iso`,
      ]);
    }
    printBench("create_ms", median(ours));
    printBench("create_virsh_ms", median(theirs));
    printBench("create_overhead_ratio_vs_virsh", median(ours) / median(theirs));
    printBench("create_rpc_count", rpcs);
    printBench(
      "preflight_extra_round_trips",
      Math.max(preflightCost.rounds, firstPreflightCost.rounds),
    );
    printBench("preflight_rpc_calls", preflightCost.calls);
    printBench("preflight_first_on_link_rpc_calls", firstPreflightCost.calls);
    printBench("preflight_ms", median(preflight));
  } finally {
    rmSync(scratch, { recursive: true, force: true });
    await closeAllHosts();
    await server.close();
    await stopWhatThisProcessStarted();
  }
}
