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
 * The quick specs are split into shards of about equal weight, the seconds
 * each took alone on a quiet 2-core machine (QUICK_SECONDS, measured December
 * 2026; a spec not listed counts 2 s), so they can run as parallel mocha
 * processes: the byte size of a spec says nothing of the deadlines it waits
 * out (pve-sim/lifecycle and no-leak wait ~20 s each on 10 s create
 * deadlines, the shortest the schema allows, on one core-second). Lab specs
 * are weighed by what dominates them, the guests they boot under TCG: the
 * seconds one took in a full run on a 2-core machine, measured (2 December
 * 2026), so that the runner's queue starts the longest first and the guests
 * of its two workers boot side by side.
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
  /** Quick and lab specs: the seconds they take alone; root specs: the compiled size. */
  weight: number;
  /** Lab specs: the most guests it boots at once and waits for (LAB_GUESTS). */
  guests?: number;
  /** Lab specs that boot the lab's guest image (they call ensureProxyImage): they wait for its build. */
  needsImage?: boolean;
}

/** Lab suites by the seconds they take alone (guests booted in parentheses); others count 10. */
const LAB_SECONDS: Record<string, number> = {
  "engine/root-program.test.js": 110, // (1) the pool end to end
  "engine/stock-host.test.js": 150, // (1, UEFI) zero-config on a stock host
  "lab/kvm-proxy.test.js": 45, // (11 that are not waited for)
  "engine/kvm-egress-rotate.test.js": 560, // (3: two members and the gateway, then 1, 1, 1) check and its exporter, an exit address changed, a rotation through the gateway, an upgrade in place beside a scale to three, the gateway in front of three, a cut path, one restarted gracefully
  "lab/dual-stack.test.js": 110, // (1) a proxy's life: SLAAC + DHCPv4, squid and the egress check over both families, delete
  "lab/prefix-egress.test.js": 200, // (1) a routed ULA /64 spread by the prefix dialer, 1000 requests
  "engine/kvm-heal.test.js": 65, // (2, and 4 replacements not waited for) heal on refresh + up
  "engine/kvm-reboot.test.js": 50, // (2, not waited for) a private libvirtd, up and restarted
  "engine/kvm.test.js": 25,
  "engine/kvm-shared-listing.test.js": 20, // (0) 200 domains defined, never started, refreshed twice
  "lab/kvm-no-leak.test.js": 15,
  "lab/libvirt-local.test.js": 20,
  "lab/kvm-read.test.js": 12,
  "lab/kvm-image-limits.test.js": 3,
  "lab/ssh-auth-refused.test.js": 3,
  "lab/libvirt-ssh.test.js": 12,
  "lab/ssh-jump.test.js": 16,
};

/**
 * Lab suites by the most guests they boot at once and wait for (others: none).
 * A TCG guest keeps a core busy while it boots, and its readiness budget is
 * scaled by the load when its suite starts: two suites that each boot two
 * guests at once on a 2-core machine (with the floor run beside them) pushed a
 * boot past that budget in a CI run (3 December 2026). So the queue
 * (test/runner/main.ts labQueue) keeps the guests booting at once within
 * MAX_GUESTS_AT_ONCE, and tells each suite how many boot beside its own
 * (EGRESS_TEST_GUESTS_AT_ONCE), so its budgets grow with them. Three at once
 * would be safer still, but it runs the two-guest suites one after another:
 * about two and a half minutes more for the whole run.
 */
const LAB_GUESTS: Record<string, number> = {
  "engine/root-program.test.js": 1,
  "engine/stock-host.test.js": 1,
  "engine/kvm-egress-rotate.test.js": 3,
  "lab/dual-stack.test.js": 1,
  "lab/prefix-egress.test.js": 1,
  "engine/kvm-heal.test.js": 2,
  "engine/kvm-reboot.test.js": 2,
};
export const MAX_GUESTS_AT_ONCE = 4;

/** The guests a unit (suites run one after another in one process) boots at once at most. */
export function guestsOf(unit: readonly Spec[]): number {
  return unit.reduce((most, spec) => Math.max(most, spec.guests ?? 0), 0);
}

/**
 * Takes from `queue` (heaviest first) the first unit whose guests fit beside
 * the `guestsBooting` ones within MAX_GUESTS_AT_ONCE; a unit that would not
 * fit even alone is taken when nothing boots. Undefined: none fits now (wait
 * for a running unit to end).
 */
export function takeNextUnit(queue: Spec[][], guestsBooting: number): Spec[] | undefined {
  const fits = queue.findIndex(
    (unit) =>
      guestsBooting + guestsOf(unit) <= MAX_GUESTS_AT_ONCE ||
      (guestsBooting === 0 && guestsOf(unit) > MAX_GUESTS_AT_ONCE),
  );
  return fits < 0 ? undefined : queue.splice(fits, 1)[0];
}

/** Quick suites by the seconds they take alone (wall, serial, Node 26, December 2026). */
const QUICK_SECONDS: Record<string, number> = {
  "cloud-init/nocloud-seed.test.js": 2.3,
  "cloud-init/prefix-egress.test.js": 5, // npm pack of the repository: 2 s
  "cloud-init/squid-cloud-init.test.js": 1.1,
  "cloud-init/network-config.test.js": 0.9,
  "engine/egress.test.js": 1.7,
  "engine/disruption-budget.test.js": 35, // four members, a rolling rotation sampled every second
  "engine/egress-recheck.test.js": 27,
  "engine/examples.test.js": 1.5,
  "engine/frozen-api.test.js": 3.5,
  "engine/guest-files.test.js": 8, // three members upgraded in place, one replaced
  "engine/gateway-vm.test.js": 5, // the gateway VM created, updated in place, a refusal
  "engine/collision-rotation.test.js": 9, // two creates a second apart, a delete-first replacement
  "engine/kubernetes-optional.test.js": 4.3,
  "engine/operator-stack.test.js": 3.5,
  "engine/preview-unknowns.test.js": 12.2,
  "engine/proxmox-heal.test.js": 48, // mostly waiting out readiness and delete budgets; a provider per command
  "engine/proxmox-scale.test.js": 10, // 200 members on four simulated nodes, one refresh
  "engine/proxmox.test.js": 24, // a provider per command
  "engine/secrets.test.js": 6.8,
  "engine/static.test.js": 2.1,
  "integration/check-command.test.js": 10.3,
  "integration/check-serve.test.js": 4.5,
  "integration/check-endpointslice.test.js": 33, // member lists followed at the 5 s poll, several times
  "integration/image-source.test.js": 2.2,
  "libvirt-schema/xml-schema.test.js": 0.2,
  "pve-sim/client.test.js": 2.5,
  "pve-sim/contention.test.js": 1.6,
  "pve-sim/egress.test.js": 0.7,
  "pve-sim/dual-stack.test.js": 0.8,
  "pve-sim/lifecycle.test.js": 22.6,
  "pve-sim/no-leak.test.js": 19.9,
  "pve-sim/node-listings.test.js": 0.3,
  "pve-sim/privileges.test.js": 3.9,
  "pve-sim/read-drift.test.js": 3.2,
  "pve-sim/reaper.test.js": 3.1,
  "pve-sim/simulator.test.js": 2.4,
  "readers/iso9660-readers.test.js": 2.3,
  "unit/check/egress.test.js": 0.6,
  "unit/check/serve.test.js": 0.1,
  "unit/cli/doctor.test.js": 7.9,
  "unit/common-deadline.test.js": 0.4,
  "unit/common-egress-recheck.test.js": 8.5,
  "unit/common-lifecycle.test.js": 0.8,
  "unit/common-preview.test.js": 0.8,
  "unit/common.test.js": 0.1,
  "unit/ip-families.test.js": 0.1,
  "unit/components/placement.test.js": 0.2,
  "unit/components/pool.test.js": 1.9,
  "unit/components/stack-config.test.js": 1.9,
  "unit/dead-code.test.js": 5.6,
  "unit/iso9660-writer.test.js": 0.1,
  "unit/kvm-builders.test.js": 0.4,
  "unit/kvm/classify.test.js": 0.2,
  "unit/kvm/image-source-policy.test.js": 0.2,
  "unit/kvm/observed.test.js": 0.2,
  "unit/kvm/preflight.test.js": 0.1,
  "unit/libvirt-rpc-xdr/client.test.js": 0.5,
  "unit/libvirt-rpc-xdr/core.test.js": 0.1,
  "unit/libvirt-rpc-xdr/preflight-procedures.test.js": 0.1,
  "unit/libvirt-rpc-xdr/protocol-source.test.js": 0.1,
  "unit/libvirt-rpc-xdr/stream-machine.test.js": 2.6,
  "unit/libvirt-rpc-xdr/xdr.test.js": 0.1,
  "unit/nocloud.test.js": 0.1,
  "unit/proxmox-observed.test.js": 0.1,
  "unit/proxmox-pure.test.js": 0.2,
  "unit/reaper/cli.test.js": 1.5,
  "unit/reaper/plan.test.js": 0.1,
  "unit/reaper/states-config.test.js": 0.3,
  "unit/self-contained.test.js": 0.1,
  "unit/ssh/host-key-type.test.js": 0.3,
  "unit/ssh/known-hosts.test.js": 0.1,
  "unit/ssh/pool.test.js": 0.4,
  "unit/static/static-proxy.test.js": 2.2,
  "unit/systemd-units.test.js": 0.3,
  "unit/up-script.test.js": 0.1,
};
/** A quick spec not in QUICK_SECONDS: about the median. */
const QUICK_DEFAULT_SECONDS = 2;

const LAB_FIXTURE = /require\("(?:\.\.\/lab\/|\.\/)(?:fixture|stock-fixture)"\)/;
const STOCK_FIXTURE = /require\("(?:\.\.\/lab\/|\.\/)stock-fixture"\)/;
/** Suites that fill the lab's 8 MiB pool on purpose must not do it at the same time. */
const TINY_POOL = /\.tinyPool\b/;
const NEEDS_ROOT = /test-needs: root/;
const RUNS_ALONE = /test-runs: alone/;
/** A call of test/lab/kvm-support's ensureProxyImage, as tsc compiles it (`(0, x.ensureProxyImage)()`). */
const CALLS_ENSURE_IMAGE = /ensureProxyImage\)\(\)/;
const RELATIVE_REQUIRE = /require\("(\.{1,2}\/[^"]+)"\)/g;

/** The kind of the spec at `path`, from its source and the test modules under `testDir` it requires. */
export function kindOfSpec(
  path: string,
  testDir: string,
): { kind: SpecKind; group?: string; needsImage?: boolean } {
  let kind = "quick" as SpecKind;
  let group: string | undefined;
  let needsImage = false;
  const seen = new Set<string>();
  const visit = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    const source = readFileSync(file, "utf8");
    if (STOCK_FIXTURE.test(source)) group = "stock-host";
    else if (TINY_POOL.test(source)) group ??= "tiny-pool";
    if (LAB_FIXTURE.test(source)) kind = "lab";
    if (CALLS_ENSURE_IMAGE.test(source)) needsImage = true;
    else if (NEEDS_ROOT.test(source) && kind === "quick") kind = "root";
    for (const [, target] of source.matchAll(RELATIVE_REQUIRE)) {
      const required = resolve(dirname(file), target!.endsWith(".js") ? target! : `${target}.js`);
      if (required.startsWith(testDir) && existsSync(required)) visit(required);
    }
  };
  visit(resolve(path));
  return {
    kind,
    ...(group === undefined ? {} : { group }),
    ...(kind === "lab" && needsImage ? { needsImage } : {}),
  };
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
  return (
    walk(testDir)
      // A compiled spec whose source is gone (deleted or renamed since the last build) is not a suite.
      .filter((path) =>
        existsSync(join(cwd, "test", relative(testDir, path).replace(/\.js$/, ".ts"))),
      )
      .sort()
      .map((path) => {
        const { kind, group, needsImage } = kindOfSpec(path, resolve(testDir));
        const key = relative(testDir, path);
        const weight =
          kind === "lab"
            ? (LAB_SECONDS[key] ?? 10)
            : kind === "quick"
              ? (QUICK_SECONDS[key] ?? QUICK_DEFAULT_SECONDS)
              : statSync(path).size;
        const alone = RUNS_ALONE.test(readFileSync(path, "utf8"));
        const guests = kind === "lab" ? (LAB_GUESTS[key] ?? 0) : 0;
        return {
          path: relative(cwd, path),
          kind,
          weight,
          ...(guests > 0 ? { guests } : {}),
          ...(group ? { group } : {}),
          ...(alone ? { alone } : {}),
          ...(needsImage ? { needsImage } : {}),
        };
      })
  );
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
