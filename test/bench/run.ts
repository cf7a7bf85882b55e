/**
 * `npm run bench`: every benchmark of the project, measured side by side with
 * the standard tools in the same run. Select some with
 * `npm run bench -- seed libvirt`.
 *
 * Each lab suite brings the lab up itself and stops what it started, so every
 * suite runs from a cold lab as well as a warm one (useLab re-validates the
 * lab between suites). A failing suite does not hide the others' figures: all
 * run, the failures are listed at the end and the exit status is 1.
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
  const failed: string[] = [];
  for (const [name, run] of Object.entries(suites)) {
    if (wanted.length > 0 && !wanted.includes(name)) continue;
    console.log(`# ${name}`);
    const started = Date.now();
    try {
      await run();
    } catch (error) {
      failed.push(name);
      console.error(`# ${name} FAILED:`, error);
    }
    console.log(`# ${name} took ${((Date.now() - started) / 1000).toFixed(1)} s`);
  }
  if (failed.length > 0) throw new Error(`benchmark suites failed: ${failed.join(", ")}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
