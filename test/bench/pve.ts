import * as provider from "../../provider/proxmox/provider";
import { closeAllProxmoxPools } from "../../provider/proxmox/client";
import { PveSimulator } from "../pve-sim/simulator";
import { median, printBench, timeMsAsync } from "./measure";

const SINGLE_RUNS = 3;

/**
 * ProxmoxProxy against the simulator with 20 ms latency per request and 2 s
 * tasks (clone, seed copy, config, start; the agent answers 2 s after start):
 * the wall time of ten creates in parallel beside one create alone (the
 * median of three; goal: ≤ 1.05×), and how many API requests one create
 * costs, task polling included (goal: ≤ 30): the most any of the three took,
 * and the average in the parallel run.
 */
export async function runProxmoxBenchmarks(): Promise<void> {
  const sim = new PveSimulator({ latencyMs: 20, defaultTaskMs: 2000, agentDelayMs: 2000 });
  await sim.listen();
  try {
    const inputsFor = async (vmName: string) => {
      const { inputs, failures } = await provider.check(
        {},
        {
          apiEndpoint: sim.endpoint,
          apiToken: sim.tokenFor(),
          caCertPem: sim.caCertPem,
          node: sim.node,
          templateVmid: 9000,
          diskStorage: "local-lvm",
          seedStorage: "seeds",
          vmName,
          owner: { project: "bench", stack: "pve", resource: vmName },
          readiness: { mode: "address" },
          timeouts: { createSeconds: 300, readySeconds: 120, deleteSeconds: 120 },
        },
      );
      if (failures.length > 0) throw new Error(JSON.stringify(failures));
      return inputs;
    };

    // One create alone, three times (a busy machine makes any one of them slow): the median.
    const singles: number[] = [];
    let callsPerCreate = 0;
    for (let run = 0; run < SINGLE_RUNS; run++) {
      const single = await inputsFor(`bench-one-${run}`);
      const requestsBefore = sim.requestLog.length;
      singles.push(await timeMsAsync(() => provider.create(single)));
      callsPerCreate = Math.max(callsPerCreate, sim.requestLog.length - requestsBefore);
    }
    const oneMs = median(singles);

    const ten = await Promise.all(
      Array.from({ length: 10 }, (_, index) => inputsFor(`bench-par-${index}`)),
    );
    const parallelBefore = sim.requestLog.length;
    const tenStarted = performance.now();
    await Promise.all(ten.map((inputs) => provider.create(inputs)));
    const tenMs = performance.now() - tenStarted;
    const callsPerParallelCreate = (sim.requestLog.length - parallelBefore) / ten.length;

    printBench("pve_one_create_ms", oneMs);
    printBench("pve_parallel10_ms", tenMs);
    printBench("pve_parallel10_ratio_vs_one", tenMs / oneMs);
    printBench("pve_api_calls_per_create", callsPerCreate);
    printBench("pve_parallel10_api_calls_per_create", callsPerParallelCreate);
  } finally {
    await sim.settle();
    await sim.close();
    await closeAllProxmoxPools();
  }
}

if (require.main === module) {
  runProxmoxBenchmarks().catch((error) => {
    console.error(error);
    process.exitCode = 1;
  });
}
