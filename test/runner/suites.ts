/**
 * Which compiled spec belongs to which kind of suite, decided from the spec
 * and the test modules it requires (transitively, within dist/test), so a new
 * test file lands in the right place without a list to edit:
 *
 * - `lab`: reaches the lab or stock-host fixture (a libvirtd, qemu guests,
 *   root, minutes);
 * - `root`: says `test-needs: root` in a comment (namespaces, mounts, links)
 *   but starts no lab;
 * - `quick`: everything else: no root, no lab, no network beyond loopback.
 *
 * The quick specs are split into shards of about equal weight (the byte size
 * of the compiled spec is a fair stand-in for how much it does), so they can
 * run as parallel mocha processes. Lab specs are weighed by what dominates
 * them, the guests they boot under TCG: the seconds one took in a full run on a
 * 2-core machine, measured (2 December 2026), so that the runner's queue
 * starts the longest first and the guests of its two workers boot side by side.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

export type SpecKind = "quick" | "root" | "lab";

export interface Spec {
  path: string;
  kind: SpecKind;
  /** Says `test-runs: alone`: it asserts on the whole host, so no other lab suite may run beside it. */
  alone?: boolean;
  /** Specs of one group run together: they use one stock host, or fill one tiny pool, in turn. */
  group?: string;
  /** Quick and root specs: the compiled size; lab specs: the seconds they take alone. */
  weight: number;
}

/** Lab suites by the seconds they take alone (guests booted in parentheses); others count 10. */
const LAB_SECONDS: Record<string, number> = {
  "engine/root-program.test.js": 170, // (2) the pool end to end
  "engine/stock-host.test.js": 150, // (1, UEFI) zero-config on a stock host
  "lab/egress.test.js": 130, // (2) squid with auth, NAT, check
  "lab/kvm-proxy.test.js": 95, // (1 + 10 that are not waited for)
  "engine/kvm.test.js": 25,
  "lab/kvm-no-leak.test.js": 85,
  "lab/libvirt-local.test.js": 20,
  "lab/kvm-read.test.js": 12,
  "lab/libvirt-ssh.test.js": 12,
};

const LAB_FIXTURE = /require\("(?:\.\.\/lab\/|\.\/)(?:fixture|stock-fixture)"\)/;
const STOCK_FIXTURE = /require\("(?:\.\.\/lab\/|\.\/)stock-fixture"\)/;
/** Suites that fill the lab's 8 MiB pool on purpose must not do it at the same time. */
const TINY_POOL = /\.tinyPool\b/;
const NEEDS_ROOT = /test-needs: root/;
const RUNS_ALONE = /test-runs: alone/;
const RELATIVE_REQUIRE = /require\("(\.{1,2}\/[^"]+)"\)/g;

/** The kind of the spec at `path`, from its source and the test modules under `testDir` it requires. */
export function kindOfSpec(path: string, testDir: string): { kind: SpecKind; group?: string } {
  let kind: SpecKind = "quick";
  let group: string | undefined;
  const seen = new Set<string>();
  const visit = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    const source = readFileSync(file, "utf8");
    if (STOCK_FIXTURE.test(source)) group = "stock-host";
    else if (TINY_POOL.test(source)) group ??= "tiny-pool";
    if (LAB_FIXTURE.test(source)) kind = "lab";
    else if (NEEDS_ROOT.test(source) && kind === "quick") kind = "root";
    for (const [, target] of source.matchAll(RELATIVE_REQUIRE)) {
      const required = resolve(dirname(file), target!.endsWith(".js") ? target! : `${target}.js`);
      if (required.startsWith(testDir) && existsSync(required)) visit(required);
    }
  };
  visit(resolve(path));
  return group === undefined ? { kind } : { kind, group };
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
    .map((path) => {
      const { kind, group } = kindOfSpec(path, resolve(testDir));
      const weight =
        kind === "lab" ? (LAB_SECONDS[relative(testDir, path)] ?? 10) : statSync(path).size;
      const alone = RUNS_ALONE.test(readFileSync(path, "utf8"));
      return {
        path: relative(cwd, path),
        kind,
        weight,
        ...(group ? { group } : {}),
        ...(alone ? { alone } : {}),
      };
    });
}

/**
 * Splits specs into `count` shards of about equal total weight (heaviest
 * first, into the lightest shard); the specs of one group stay together.
 */
export function shard(specs: readonly Spec[], count: number): Spec[][] {
  const shards: Array<{ weight: number; specs: Spec[] }> = Array.from({ length: count }, () => ({
    weight: 0,
    specs: [],
  }));
  for (const unit of workUnits(specs)) {
    const lightest = shards.reduce((min, s) => (s.weight < min.weight ? s : min));
    lightest.specs.push(...unit);
    lightest.weight += weightOf(unit);
  }
  return shards
    .map((s) => s.specs.sort((a, b) => a.path.localeCompare(b.path)))
    .filter((s) => s.length > 0);
}

const weightOf = (unit: readonly Spec[]) => unit.reduce((sum, s) => sum + s.weight, 0);

/**
 * Specs as units of work, heaviest first: the specs of one group together
 * (they use one stock host, or fill one tiny pool, in turn), every other spec
 * alone.
 */
export function workUnits(specs: readonly Spec[]): Spec[][] {
  const units = new Map<string, Spec[]>();
  for (const spec of specs) {
    const key = spec.group ?? spec.path;
    units.set(key, [...(units.get(key) ?? []), spec]);
  }
  return [...units.values()].sort(
    (a, b) => weightOf(b) - weightOf(a) || a[0]!.path.localeCompare(b[0]!.path),
  );
}

/** A unit's name in the timing table: its group, or its one spec's path below dist/test. */
export function unitName(unit: readonly Spec[]): string {
  const group = unit[0]?.group;
  if (group !== undefined) return `${group} (${unit.length} suites)`;
  return (unit[0]?.path ?? "").replace(/^dist\/test\//, "").replace(/\.test\.js$/, "");
}
