/**
 * Seed build time: our in-memory writer against `genisoimage -J -R -V cidata`
 * on the same files, in the same run. Prints
 * `bench seed_build_speedup_vs_genisoimage=<x>` (genisoimage time / ours).
 *
 * Both sides are measured warm: genisoimage is compiled code whose binary is in
 * the page cache after its first run, so ours is measured after the JIT has
 * compiled the writer. 200 builds are not enough for that (Node 26 needs some
 * 400, Node 22 up to 1000; the first 200 are 1.5-2x slower than the rest, and
 * more so in a process that has loaded every suite's modules), so a fixed
 * number of builds run unmeasured first. The first build in a fresh process
 * (JIT cold, what one create in a new provider process pays) is printed
 * beside it as seed_build_first_ms.
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { buildNoCloudSeed, type NoCloudSeedInput } from "../../provider/nocloud";
import { scratchDir } from "../support/iso-tools";
import { median, printBench, timeMs } from "./measure";

const WARM_UP_BUILDS = 1500;

export async function runSeedBenchmarks(): Promise<void> {
  const input: NoCloudSeedInput = {
    vmName: "bench-proxy",
    // 64 KiB of printable cloud-config, the size of a generous real config.
    userData:
      "#cloud-config\nwrite_files:\n  - path: /etc/blob\n    content: " +
      randomBytes(48 * 1024)
        .toString("base64")
        .slice(0, 64 * 1024 - 60) +
      "\n",
  };
  const buildOnce = (): Buffer => buildNoCloudSeed(input).image.toBuffer();
  const first = timeMs(buildOnce);
  const seed = buildNoCloudSeed(input);

  for (let i = 0; i < WARM_UP_BUILDS; i++) buildOnce();

  const scratch = scratchDir("bench-seed");
  try {
    const dir = join(scratch.dir, "files");
    mkdirSync(dir);
    for (const [name, content] of seed.files) writeFileSync(join(dir, name), content);
    const output = join(scratch.dir, "seed.iso");
    const genisoimage = (): Buffer =>
      execFileSync("genisoimage", ["-quiet", "-J", "-R", "-V", "cidata", "-o", output, dir]);
    // Not interleaved: every spawn write-protects this process's pages for the fork, and the builds
    // after it pay the copy-on-write faults (0.18 ms instead of 0.14 ms per build, measured),
    // which a provider process, spawning nothing, never does. So our builds all come first.
    const oursMs = Array.from({ length: 300 }, () => timeMs(buildOnce));
    genisoimage(); // its binary and libraries into the page cache
    const referenceMs = Array.from({ length: 30 }, () => timeMs(genisoimage));
    const [ours, reference] = [median(oursMs), median(referenceMs)];
    printBench("seed_build_ms", ours);
    printBench("seed_build_first_ms", first);
    printBench("seed_build_genisoimage_ms", reference);
    printBench("seed_build_speedup_vs_genisoimage", reference / ours);
  } finally {
    scratch.remove();
  }
}
