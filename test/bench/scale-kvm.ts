/**
 * The KVM half of `npm run bench -- scale` (issue 32): one refresh of N =
 * 10, 100 and 1000 KvmProxy members through the real dynamic-provider server,
 * on the lab's libvirtd over its sshd, with the same `--parallel` as the rest
 * of the suite. The members are domains defined and never started (a read
 * needs no guest), each with its overlay, seed and mark (test/lab/kvm-fleet.ts);
 * the host holds exactly the N of the pool being measured, as a host of that
 * pool would. A tap on the libvirt socket counts what the host was asked.
 *
 * Measured only when the lab is up already (test/lab/lab-up.sh): this suite
 * never starts it, and prints "not measured: lab not up" instead of a figure.
 *
 * Calls are every call the server made to the host from its start to the end
 * of the refresh, the link's handshake aside and the warm-up Read included
 * (a refresh reads each member once; the warm-up reads one twice, adding
 * 2 / N). Dials are the connections the tap accepted: one per SSH link.
 */
import { openLocalLibvirt } from "../../provider/ssh/local";
import type { LibvirtConnection } from "../../provider/libvirt-rpc-xdr";
import { DynamicProviderServer, type ConsumerProject } from "../engine/harness";
import {
  defineFleet,
  removeFleet,
  startLibvirtTap,
  totalCalls,
  type FleetDomain,
  type LibvirtTap,
} from "../lab/kvm-fleet";
import { captureFleetTemplate, fleetMembers, fleetOwner } from "../lab/kvm-fleet-members";
import { labIfUp, type LabEnv } from "../lab/lab";
import { printBench, printBenchFact } from "./measure";
import { refreshAsEngine, type ReadReply, type StoredMember } from "../engine/refresh-as-engine";
import { jsonBytes, mean, peakRssMb } from "./scale-measure";

const SIZES = [10, 100, 1000] as const;
const PREFIX = "kscale-";
/** The link's own calls: every new link makes them once, whatever it then asks. */
const HANDSHAKE = new Set(["authList", "connectSupportsFeature", "connectOpen", "connectClose"]);

export interface KvmRefreshFigures {
  members: number;
  wallSeconds: number;
  secondsPerMember: number;
  callsPerMember: number;
  domainListings: number;
  dials: number;
  byProcedure: Array<[string, number]>;
  peakRssMb: number;
  stateBytesPerMember: number;
}

/** Why a reply is not the member as defined (never started, found by its UUID), or undefined. */
function kvmReadProblem(domain: FleetDomain, reply: ReadReply): string | undefined {
  const { properties, inputs } = reply;
  if (properties.libvirtUuid !== domain.uuid) return `uuid ${String(properties.libvirtUuid)}`;
  if (properties.vmName !== domain.name) return `name ${String(properties.vmName)}`;
  if (properties.state !== "stopped") return `state ${String(properties.state)}`;
  if (inputs.vcpus !== 1 || inputs.startOnBoot !== false) return "drift on an untouched member";
  if (properties.replaceBecause !== undefined) return String(properties.replaceBecause);
  return undefined;
}

function withoutHandshake(calls: ReadonlyMap<string, number>): Map<string, number> {
  return new Map([...calls].filter(([name]) => !HANDSHAKE.has(name)));
}

async function measureRefresh(
  project: ConsumerProject,
  tap: LibvirtTap,
  members: readonly StoredMember[],
  domains: readonly FleetDomain[],
  parallel: number,
): Promise<KvmRefreshFigures> {
  tap.reset();
  const server = await DynamicProviderServer.start(project);
  try {
    await server.configure({});
    await refreshAsEngine(server, members.slice(0, 1), 1);
    const { wallMs, replies } = await refreshAsEngine(server, members, parallel);
    replies.forEach((reply, index) => {
      const wrong = kvmReadProblem(domains[index]!, reply);
      if (wrong !== undefined) throw new Error(`${domains[index]!.name}: ${wrong}`);
    });
    const calls = withoutHandshake(tap.calls());
    const n = members.length;
    return {
      members: n,
      wallSeconds: wallMs / 1000,
      secondsPerMember: wallMs / 1000 / n,
      callsPerMember: totalCalls(calls) / n,
      domainListings: calls.get("connectGetAllDomainStats") ?? 0,
      dials: tap.connections(),
      byProcedure: [...calls].sort((a, b) => b[1] - a[1]),
      peakRssMb: peakRssMb(server.pid!),
      stateBytesPerMember: mean(replies.map((reply) => jsonBytes(reply.properties))),
    };
  } finally {
    await server.stop();
  }
}

function printKvmRefresh(figures: KvmRefreshFigures): void {
  const n = figures.members;
  printBench(`scale_kvm_refresh_seconds_${n}`, figures.wallSeconds);
  printBench(`scale_kvm_seconds_per_member_${n}`, figures.secondsPerMember);
  printBench(`scale_kvm_calls_per_member_${n}`, figures.callsPerMember);
  printBench(`scale_kvm_domain_listings_per_refresh_${n}`, figures.domainListings);
  printBench(`scale_kvm_dials_per_refresh_${n}`, figures.dials);
  printBenchFact(
    `scale_kvm_calls_by_procedure_${n}`,
    figures.byProcedure.map(([name, count]) => `${name} ×${count}`).join("; "),
  );
  printBench(`scale_kvm_provider_peak_rss_mb_${n}`, figures.peakRssMb);
  printBench(`scale_kvm_state_bytes_per_member_${n}`, figures.stateBytesPerMember);
}

/** Grows the fleet on the host to `n` domains (those defined already stay). */
async function growFleet(
  inspector: LibvirtConnection,
  lab: LabEnv,
  fleet: FleetDomain[],
  n: number,
): Promise<void> {
  const names = Array.from({ length: n - fleet.length }, (_, i) => `${PREFIX}${fleet.length + i}`);
  fleet.push(...(await defineFleet(inspector, lab, names, fleetOwner)));
}

export async function measureKvmScale(project: ConsumerProject, parallel: number): Promise<void> {
  const lab = labIfUp();
  if (lab === undefined) {
    printBenchFact("scale_kvm", "not measured: lab not up (bash test/lab/lab-up.sh first)");
    return;
  }
  const inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
  const tap = await startLibvirtTap(lab.libvirtSocket);
  const fleet: FleetDomain[] = [];
  try {
    await removeFleet(inspector, lab, PREFIX); // a run cut short left its fleet behind
    const template = await captureFleetTemplate(project, lab, tap.socketPath);
    const results = new Map<number, KvmRefreshFigures>();
    for (const n of SIZES) {
      await growFleet(inspector, lab, fleet, n);
      const setup = await DynamicProviderServer.start(project);
      let members: StoredMember[];
      try {
        await setup.configure({});
        members = await fleetMembers(setup, template, fleet);
      } finally {
        await setup.stop();
      }
      const figures = await measureRefresh(project, tap, members, fleet, parallel);
      printKvmRefresh(figures);
      results.set(n, figures);
    }
    const [small, large] = [results.get(SIZES[0])!, results.get(SIZES[SIZES.length - 1])!];
    printBench(
      `scale_kvm_refresh_growth_${large.members}_vs_${small.members}`,
      large.secondsPerMember / small.secondsPerMember,
    );
  } finally {
    await removeFleet(inspector, lab, PREFIX).catch(() => undefined);
    await inspector.close();
    await tap.close();
  }
}
