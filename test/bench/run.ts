/**
 * `npm run bench`: every benchmark of the project, measured side by side with
 * the standard tools in the same run. Select some with
 * `npm run bench -- seed libvirt`.
 */
import { runCheckBenchmarks } from "./check";
import { runKvmBenchmarks } from "./kvm";
import { runLibvirtBenchmarks } from "./libvirt";
import { runProxmoxBenchmarks } from "./pve";
import { runReaperBenchmarks } from "./reaper";
import { runSeedBenchmarks } from "./seed";

const suites: Record<string, () => Promise<void>> = {
  seed: runSeedBenchmarks,
  pve: runProxmoxBenchmarks,
  libvirt: runLibvirtBenchmarks,
  kvm: runKvmBenchmarks,
  reaper: runReaperBenchmarks,
  check: runCheckBenchmarks,
};

async function main(): Promise<void> {
  const wanted = process.argv.slice(2);
  const unknown = wanted.filter((name) => !(name in suites));
  if (unknown.length > 0)
    throw new Error(
      `unknown benchmark ${unknown.join(", ")}; known: ${Object.keys(suites).join(", ")}`,
    );
  for (const [name, run] of Object.entries(suites)) {
    if (wanted.length > 0 && !wanted.includes(name)) continue;
    console.log(`# ${name}`);
    await run();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
