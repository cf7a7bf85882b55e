/**
 * Seed build time: our in-memory writer against `genisoimage -J -R -V cidata`
 * on the same files, in the same run. Prints
 * `bench seed_build_speedup_vs_genisoimage=<x>` (genisoimage time / ours).
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { buildNoCloudSeed, type NoCloudSeedInput } from "../../provider/nocloud";
import { scratchDir } from "../support/iso-tools";
import { median, printBench, timeMs } from "./measure";

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
  const seed = buildNoCloudSeed(input);

  const ours = median(
    Array.from({ length: 200 }, () => timeMs(() => buildNoCloudSeed(input).image.toBuffer())),
  );

  const scratch = scratchDir("bench-seed");
  try {
    const dir = join(scratch.dir, "files");
    mkdirSync(dir);
    for (const [name, content] of seed.files) writeFileSync(join(dir, name), content);
    const output = join(scratch.dir, "seed.iso");
    const reference = median(
      Array.from({ length: 30 }, () =>
        timeMs(() =>
          execFileSync("genisoimage", ["-quiet", "-J", "-R", "-V", "cidata", "-o", output, dir]),
        ),
      ),
    );
    printBench("seed_build_ms", ours);
    printBench("seed_build_genisoimage_ms", reference);
    printBench("seed_build_speedup_vs_genisoimage", reference / ours);
  } finally {
    scratch.remove();
  }
}
