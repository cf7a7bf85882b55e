/**
 * `npm run bench -- scale` (issue 32, part 1: the measurement): what one
 * `pulumi refresh` of a pool costs as the pool grows, N = 10, 100 and 1000
 * members, through the real dynamic-provider gRPC server
 * (`@pulumi/pulumi/cmd/dynamic-provider`, in a child process started from a
 * consumer project where the package is installed as users install it:
 * test/engine/harness.ts), on the Proxmox simulator (NODES nodes,
 * test/engine/proxmox-fleet.ts) and on StaticProxy (loopback proxies, scale-static.ts).
 *
 * The parallelism modelled is the Pulumi CLI's default for `pulumi refresh`:
 * the engine makes one refresh step per resource and hands them all to its
 * step executor, whose fan-out is `--parallel` workers, each calling the
 * provider's Read and waiting for the answer before taking the next step
 * (pkg/resource/deploy: deploymentExecutor.refresh, newStepExecutor). When
 * the user sets no `--parallel`, the CLI takes PULUMI_PARALLEL, else
 * 4 × GOMAXPROCS, i.e. 4 × the runner's CPUs (`defaultParallel()` in
 * pkg/cmd/pulumi/operations; pulumi/pulumi#14989 chose it; older CLIs ran
 * unbounded, math.MaxInt32, which launches every step at once, and the docs
 * still print `default 16` from a 4-CPU machine). This bench computes the same
 * default on the machine it runs on (os.availableParallelism(), as Go's
 * GOMAXPROCS does) and honours PULUMI_PARALLEL like the CLI, so
 * `PULUMI_PARALLEL=2147483647 npm run bench -- scale` measures the unbounded
 * case. All members of one deployment share one provider process (the
 * engine starts one dynamic-provider server per deployment), so every N is
 * read by a fresh server: its peak RSS (VmHWM) and the TLS connections the
 * simulators saw are those of one refresh. The first Read of a refresh loads
 * the provider's code; it is done once before the timed refresh (and reported
 * as `*_first_read_seconds`), so seconds per member compare steady costs.
 * Unless the modelled parallelism is unbounded already, the largest pool is
 * refreshed once more with every Read at once (`*_unbounded_*`): what older
 * CLIs, or a user who sets PULUMI_PARALLEL high, ask of the same hosts.
 *
 * Printed per backend and N: refresh wall seconds, seconds per member, and
 * for Proxmox hypervisor calls per member (requests the simulators received
 * during the refresh) and dials (TLS connections they accepted, warm-up
 * included), the provider's peak RSS, state bytes per member (the JSON of the
 * outputs Read returns, `__provider` included, as the checkpoint stores
 * them; `_with_inputs` adds the inputs the engine stores beside them). The
 * issue's keys (goals.ts) are the Proxmox figures, except RSS, state bytes and
 * program seconds, which take the larger of the two backends. Beside them: the
 * pool's program under mocks with 1000 members (scale-program.ts), and
 * whether the server serializes calls (`scale_server_concurrency`).
 */
import { availableParallelism } from "node:os";
import { closeAllProxmoxPools, ProxmoxClient } from "../../provider/proxmox/client";
import { SecretValue } from "../../provider/common/redact";
import { NODE_LISTING_WINDOW_MS } from "../../provider/proxmox/node-listings";
import {
  packIntoConsumerProject,
  DynamicProviderServer,
  type ConsumerProject,
  type Props,
} from "../engine/harness";
import type { PveSimulator } from "../pve-sim/simulator";
import { median, printBench, printBenchFact } from "./measure";
import { runPoolProgram } from "./scale-program";
import { callsByEndpoint, endpointOf, jsonBytes, mean, peakRssMb } from "./scale-measure";
import {
  engineDefaultParallelism,
  refreshAsEngine,
  UNBOUNDED,
  type StoredMember,
} from "../engine/refresh-as-engine";
import { NODES, proxmoxReadProblem, startProxmoxFleet } from "../engine/proxmox-fleet";
import { measureKvmScale } from "./scale-kvm";
import {
  createStaticMembers,
  serverConcurrency,
  startProxyFarm,
  staticReadProblem,
  type ProxyFarm,
} from "./scale-static";

const SIZES = [10, 100, 1000] as const;
/** The calls that answer for a whole node (provider/proxmox/node-listings.ts), as endpointOf folds them. */
const NODE_LISTINGS = new Set([
  "GET nodes/{node}/qemu",
  "GET nodes/{node}/storage/{storage}/content",
]);
const LARGEST = SIZES[SIZES.length - 1]!;
/** Reads issued at once to see whether the server serializes them. */
const CONCURRENT_READS = 50;

interface RefreshFigures {
  members: number;
  wallSeconds: number;
  firstReadSeconds: number;
  secondsPerMember: number;
  /** Every hypervisor call of the refresh, per Read (the warm-up Read's included). */
  callsPerMember: number;
  /** The calls that name one member (its config, its agent, its status), per Read. */
  memberCallsPerMember: number;
  /** The calls that list a whole node (its VM index, its seed storage), per node. */
  listingsPerNode: number;
  /** How many listing windows the counted Reads span (a node is listed again in each). */
  listingWindows: number;
  dials: number;
  byEndpoint: Array<[string, number]>;
  peakRssMb: number;
  stateBytesPerMember: number;
  stateWithInputsBytesPerMember: number;
}

type ReadProblem = (
  member: StoredMember,
  reply: { id: string; properties: Props },
) => string | undefined;

/**
 * One refresh of `members` by a fresh server, as `pulumi refresh` runs it
 * (see the header); repeated for small N (a median of three), once at the
 * largest. Calls, dials and state are those of the first timed refresh.
 */
async function measureRefresh(
  project: ConsumerProject,
  members: readonly StoredMember[],
  parallel: number,
  problem: ReadProblem,
  options: { config?: Record<string, string>; sims?: readonly PveSimulator[] } = {},
): Promise<RefreshFigures> {
  const sims = options.sims ?? [];
  const dialsBefore = sims.reduce((sum, sim) => sum + sim.tlsConnections, 0);
  const server = await DynamicProviderServer.start(project);
  try {
    await server.configure(options.config ?? {});
    // Every Read must find its member as recorded: a refresh that fails is not timed.
    const verify = (replies: ReadonlyArray<{ id: string; properties: Props }>) =>
      replies.forEach((reply, index) => {
        const wrong = problem(members[index]!, reply);
        if (wrong !== undefined) throw new Error(`${members[index]!.urn}: ${wrong}`);
      });
    // The warm-up Read is a Read of the refresh for the hosts: its calls count, and a listing
    // it asked for may serve the timed Reads (so do the calls: Reads = members + 1).
    const logBefore = sims.map((sim) => sim.requestLog.length);
    const firstStarted = performance.now();
    verify((await refreshAsEngine(server, members.slice(0, 1), 1)).replies);
    const firstReadSeconds = (performance.now() - firstStarted) / 1000;
    const first = await refreshAsEngine(server, members, parallel);
    verify(first.replies);
    const requests = sims.flatMap((sim, index) => sim.requestLog.slice(logBefore[index]));
    const reads = members.length + 1;
    const listings = requests.filter((line) => NODE_LISTINGS.has(endpointOf(line))).length;
    const dials = sims.reduce((sum, sim) => sum + sim.tlsConnections, 0) - dialsBefore;
    const walls = [first.wallMs];
    for (let run = 1; run < (members.length <= 100 ? 3 : 1); run++) {
      const again = await refreshAsEngine(server, members, parallel);
      verify(again.replies);
      walls.push(again.wallMs);
    }
    const wallSeconds = median(walls) / 1000;
    return {
      members: members.length,
      wallSeconds,
      firstReadSeconds,
      secondsPerMember: wallSeconds / members.length,
      callsPerMember: requests.length / reads,
      memberCallsPerMember: (requests.length - listings) / reads,
      listingsPerNode: sims.length === 0 ? 0 : listings / sims.length,
      listingWindows: Math.ceil((firstReadSeconds * 1000 + first.wallMs) / NODE_LISTING_WINDOW_MS),
      dials,
      byEndpoint: callsByEndpoint(requests),
      peakRssMb: peakRssMb(server.pid!),
      stateBytesPerMember: mean(first.replies.map((reply) => jsonBytes(reply.properties))),
      stateWithInputsBytesPerMember: mean(
        first.replies.map((reply) => jsonBytes(reply.properties) + jsonBytes(reply.inputs)),
      ),
    };
  } finally {
    await server.stop();
  }
}

function printRefresh(prefix: string, figures: RefreshFigures, hypervisor: boolean): void {
  const n = figures.members;
  printBench(`${prefix}_refresh_seconds_${n}`, figures.wallSeconds);
  printBench(`${prefix}_seconds_per_member_${n}`, figures.secondsPerMember);
  printBench(`${prefix}_first_read_seconds_${n}`, figures.firstReadSeconds);
  if (hypervisor) {
    printBench(`${prefix}_calls_per_member_${n}`, figures.callsPerMember);
    printBench(`${prefix}_member_calls_per_member_${n}`, figures.memberCallsPerMember);
    printBench(`${prefix}_listings_per_node_${n}`, figures.listingsPerNode);
    printBench(`${prefix}_dials_per_refresh_${n}`, figures.dials);
    printBenchFact(
      `${prefix}_calls_by_endpoint_${n}`,
      figures.byEndpoint
        .map(([endpoint, count]) =>
          NODE_LISTINGS.has(endpoint)
            ? `${endpoint} ×${(count / NODES).toFixed(2)}/node`
            : `${endpoint} ×${(count / (n + 1)).toFixed(2)}/member`,
        )
        .join("; "),
    );
  }
  printBench(`${prefix}_provider_peak_rss_mb_${n}`, figures.peakRssMb);
  printBench(`${prefix}_state_bytes_per_member_${n}`, figures.stateBytesPerMember);
  printBench(
    `${prefix}_state_with_inputs_bytes_per_member_${n}`,
    figures.stateWithInputsBytesPerMember,
  );
}

const proxmoxPoolArgs = (count: number): Props => ({
  count,
  backends: Array.from({ length: NODES }, (_, index) => ({
    name: `pve${index + 1}`,
    proxmox: {
      node: `pve${index + 1}`,
      templateVmid: 9000,
      diskStorage: "local-lvm",
      seedStorage: "seeds",
    },
  })),
});

const staticPoolArgs = (farm: ProxyFarm, count: number): Props => ({
  count,
  egressCheck: { url: farm.distantEchoUrl, field: "ip" },
  backends: [{ name: "static", static: { urls: farm.urls.slice(0, count) } }],
});

/** The pool's program with LARGEST members of each kind; returns one member's inputs of each. */
async function measurePrograms(
  project: ConsumerProject,
  farm: ProxyFarm,
): Promise<{ proxmox: Props; static: Props }> {
  const proxmox = await runPoolProgram(project, "ProxmoxProxy", proxmoxPoolArgs(LARGEST));
  const statics = await runPoolProgram(project, "StaticProxy", staticPoolArgs(farm, LARGEST));
  printBench(`scale_pve_program_seconds_${LARGEST}`, proxmox.programMs / 1000);
  printBench(`scale_static_program_seconds_${LARGEST}`, statics.programMs / 1000);
  printBench(`scale_pve_program_peak_rss_mb_${LARGEST}`, proxmox.peakRssMb);
  printBench(`scale_static_program_peak_rss_mb_${LARGEST}`, statics.peakRssMb);
  printBench(
    `scale_program_seconds_${LARGEST}`,
    Math.max(proxmox.programMs, statics.programMs) / 1000,
  );
  return { proxmox: proxmox.member.inputs, static: statics.member.inputs };
}

async function measureStatic(
  project: ConsumerProject,
  farm: ProxyFarm,
  memberInputs: Props,
  parallel: number,
): Promise<Map<number, RefreshFigures>> {
  const setup = await DynamicProviderServer.start(project);
  let members: StoredMember[];
  let slowMembers: StoredMember[];
  try {
    await setup.configure({});
    members = await createStaticMembers(
      setup,
      memberInputs,
      farm.urls,
      farm.distantEchoUrl,
      "scale-static",
    );
    slowMembers = await createStaticMembers(
      setup,
      memberInputs,
      farm.urls.slice(0, CONCURRENT_READS),
      farm.slowEchoUrl,
      "scale-slow",
    );
  } finally {
    await setup.stop();
  }
  const concurrency = await serverConcurrency(project, slowMembers, staticReadProblem);
  printBench("scale_server_one_read_ms", concurrency.oneReadMs);
  printBench(`scale_server_${concurrency.calls}_reads_ms`, concurrency.wallMs);
  printBench("scale_server_concurrency", concurrency.concurrency);
  const results = new Map<number, RefreshFigures>();
  for (const n of SIZES) {
    const figures = await measureRefresh(project, members.slice(0, n), parallel, staticReadProblem);
    printRefresh("scale_static", figures, false);
    results.set(n, figures);
  }
  if (parallel !== UNBOUNDED)
    printRefresh(
      "scale_static_unbounded",
      await measureRefresh(project, members, UNBOUNDED, staticReadProblem),
      false,
    );
  return results;
}

async function measureProxmox(
  project: ConsumerProject,
  memberInputs: Props,
  parallel: number,
): Promise<Map<number, RefreshFigures>> {
  const fleet = await startProxmoxFleet(project, memberInputs);
  const results = new Map<number, RefreshFigures>();
  try {
    for (const n of SIZES) {
      // The hosts hold this pool's VMs and no more: a pool of 10 lists 10 seeds, not 1000.
      const members = await fleet.growTo(n);
      const figures = await measureRefresh(project, members, parallel, proxmoxReadProblem, {
        config: fleet.config,
        sims: fleet.sims,
      });
      printRefresh("scale_pve", figures, true);
      results.set(n, figures);
    }
    printBench(`scale_pve_seed_listing_bytes_${LARGEST}`, await seedListingBytes(fleet.sims[0]!));
    // What the CLI's old default (and PULUMI_PARALLEL=2147483647) asks of the same hosts.
    if (parallel !== UNBOUNDED)
      printRefresh(
        "scale_pve_unbounded",
        await measureRefresh(project, await fleet.growTo(LARGEST), UNBOUNDED, proxmoxReadProblem, {
          config: fleet.config,
          sims: fleet.sims,
        }),
        true,
      );
  } finally {
    await fleet.stop();
  }
  return results;
}

/**
 * What one Read's seed lookup downloads today: the listing of the node's
 * whole seed storage, one entry per member on the node (and whatever else
 * the storage holds), so it grows with the pool.
 */
async function seedListingBytes(sim: PveSimulator): Promise<number> {
  const client = new ProxmoxClient({
    endpoint: sim.endpoint,
    apiToken: new SecretValue(sim.tokenFor()),
    caCertPem: sim.caCertPem,
  });
  try {
    const listing = await client.get(`/nodes/${sim.node}/storage/seeds/content`, {
      content: "iso",
    });
    return jsonBytes({ data: listing });
  } finally {
    await closeAllProxmoxPools();
  }
}

export async function runScaleBenchmarks(): Promise<void> {
  const parallel = engineDefaultParallelism(process.env, availableParallelism());
  printBenchFact(
    "scale_parallelism",
    parallel === UNBOUNDED
      ? "unbounded"
      : `${parallel} (Pulumi's --parallel default: 4 × ${availableParallelism()} CPUs, or PULUMI_PARALLEL)`,
  );
  printBench("scale_hosts", NODES);
  const project = packIntoConsumerProject();
  const farm = await startProxyFarm(LARGEST);
  try {
    const inputs = await measurePrograms(project, farm);
    const statics = await measureStatic(project, farm, inputs.static, parallel);
    const proxmox = await measureProxmox(project, inputs.proxmox, parallel);
    const at = (results: Map<number, RefreshFigures>, n: number) => results.get(n)!;
    const [small, large] = [at(proxmox, SIZES[0]), at(proxmox, LARGEST)];
    printBench(`scale_refresh_seconds_per_member_${LARGEST}`, large.secondsPerMember);
    printBench(
      `scale_refresh_growth_${LARGEST}_vs_${SIZES[0]}`,
      large.secondsPerMember / small.secondsPerMember,
    );
    printBench(
      `scale_static_refresh_growth_${LARGEST}_vs_${SIZES[0]}`,
      at(statics, LARGEST).secondsPerMember / at(statics, SIZES[0]).secondsPerMember,
    );
    printBench(`scale_all_calls_per_member_refresh_${SIZES[0]}`, small.callsPerMember);
    printBench(`scale_all_calls_per_member_refresh_${LARGEST}`, large.callsPerMember);
    printBench(`scale_calls_per_member_refresh_${LARGEST}`, large.memberCallsPerMember);
    printBench(`scale_listings_per_node_refresh_${LARGEST}`, large.listingsPerNode);
    printBench(`scale_listing_windows_refresh_${LARGEST}`, large.listingWindows);
    printBench(
      `scale_calls_per_member_refresh_${LARGEST}_vs_${SIZES[0]}`,
      large.callsPerMember / small.callsPerMember,
    );
    printBench(`scale_dials_per_refresh_${LARGEST}`, large.dials);
    printBench(
      `scale_provider_peak_rss_mb_${LARGEST}`,
      Math.max(large.peakRssMb, at(statics, LARGEST).peakRssMb),
    );
    printBench(
      "scale_state_bytes_per_member",
      Math.max(large.stateBytesPerMember, at(statics, LARGEST).stateBytesPerMember),
    );
    // KvmProxy on the lab's libvirtd, when the lab is up (scale-kvm.ts).
    await measureKvmScale(project, parallel);
  } finally {
    farm.stop();
    project.remove();
  }
}

if (require.main === module) {
  runScaleBenchmarks().catch((error) => {
    console.error(error);
    process.exitCode = 1;
  });
}
