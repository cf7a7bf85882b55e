/**
 * Which compiled spec belongs to which kind of suite, decided from the spec
 * itself so a new test file lands in the right place without a list to edit:
 *
 * - `lab`: imports the lab or stock-host fixture (a libvirtd, qemu guests,
 *   root, minutes);
 * - `root`: says `test-needs: root` in a comment (namespaces, mounts, links)
 *   but starts no lab;
 * - `quick`: everything else: no root, no lab, no network beyond loopback.
 *
 * The quick specs are split into shards of about equal weight (the byte size
 * of the compiled spec is a fair stand-in for how much it does), so they can
 * run as parallel mocha processes.
 */
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";

export type SpecKind = "quick" | "root" | "lab";

export interface Spec {
  path: string;
  kind: SpecKind;
  bytes: number;
}

const LAB_FIXTURE = /require\("(?:\.\.\/lab\/|\.\/)(?:fixture|stock-fixture)"\)/;
const NEEDS_ROOT = /test-needs: root/;

export function kindOfSpec(source: string): SpecKind {
  if (LAB_FIXTURE.test(source)) return "lab";
  if (NEEDS_ROOT.test(source)) return "root";
  return "quick";
}

function walk(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return walk(path);
    return entry.name.endsWith(".test.js") ? [path] : [];
  });
}

/** Every compiled spec under `testDir` (dist/test), relative to `cwd`, sorted. */
export function findSpecs(testDir: string, cwd: string): Spec[] {
  return walk(testDir)
    .sort()
    .map((path) => ({
      path: relative(cwd, path),
      kind: kindOfSpec(readFileSync(path, "utf8")),
      bytes: statSync(path).size,
    }));
}

/** Splits specs into `count` groups of about equal total weight (heaviest first, into the lightest group). */
export function shard(specs: readonly Spec[], count: number): Spec[][] {
  const shards: Array<{ weight: number; specs: Spec[] }> = Array.from({ length: count }, () => ({
    weight: 0,
    specs: [],
  }));
  for (const spec of [...specs].sort((a, b) => b.bytes - a.bytes || a.path.localeCompare(b.path))) {
    const lightest = shards.reduce((min, s) => (s.weight < min.weight ? s : min));
    lightest.specs.push(spec);
    lightest.weight += spec.bytes;
  }
  return shards
    .map((s) => s.specs.sort((a, b) => a.path.localeCompare(b.path)))
    .filter((s) => s.length > 0);
}
