/**
 * Every time budget of a lab guest, in one place. The lab's guests run under
 * TCG (no /dev/kvm) on a machine shared with the rest of the suite: on a
 * quiet 2-core machine the guest agent reports an address 40–90 s after
 * start and squid answers 20–30 s later, but one boot took 280 s during a
 * full run on a fresh, busier machine. So each budget is a generous base
 * (about three times the quiet figures) multiplied by how slow this machine
 * is right now, never divided:
 *
 * - `EGRESS_TEST_TIME_SCALE` (a number ≥ 1, default 1): the knob for a
 *   machine known to be slow (nested virtualisation, a CI runner);
 * - the measured speed: a fixed integer loop timed once per process against
 *   the reference machine (≈45 ms), and the load per core above 1: the load
 *   average, or, when the test runner says more guests boot at once than
 *   that shows (`EGRESS_TEST_GUESTS_AT_ONCE`: the load average lags behind
 *   guests that have just started), those guests per core.
 *
 * Budgets are deadlines, never assertions on timing: a fast machine finishes
 * early, a slow one gets the time its guests need.
 */
import { cpus, loadavg } from "node:os";
import { performance } from "node:perf_hooks";

/** The reference machine's time for `measureLoopMs` (2-core EPYC VM, idle). */
const REFERENCE_LOOP_MS = 45;
/** The machine factor never goes above this: beyond it a run is better given EGRESS_TEST_TIME_SCALE. */
const MAX_MACHINE_FACTOR = 4;

function measureLoopMs(): number {
  const start = performance.now();
  let x = 1;
  for (let i = 0; i < 30_000_000; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
  }
  if (x === 0) throw new Error("unreachable: xorshift never reaches 0");
  return performance.now() - start;
}

function configuredScale(): number {
  const raw = process.env.EGRESS_TEST_TIME_SCALE;
  if (raw === undefined || raw === "") return 1;
  const scale = Number(raw);
  if (!Number.isFinite(scale) || scale < 1)
    throw new Error(`EGRESS_TEST_TIME_SCALE must be a number >= 1 (e.g. 2), got ${raw}`);
  return scale;
}

/** Guests booting at once as this suite starts, its own included, when the test runner says. */
function guestsAtOnce(): number {
  const raw = process.env.EGRESS_TEST_GUESTS_AT_ONCE;
  const guests = raw === undefined || raw === "" ? 0 : Number(raw);
  if (!Number.isInteger(guests) || guests < 0)
    throw new Error(`EGRESS_TEST_GUESTS_AT_ONCE must be a whole number >= 0, got ${raw}`);
  return guests;
}

let factor: number | undefined;

/** How much longer than the reference this machine needs now (≥ 1), times EGRESS_TEST_TIME_SCALE. */
export function timeScale(): number {
  if (factor === undefined) {
    const loop = [measureLoopMs(), measureLoopMs(), measureLoopMs()].sort((a, b) => a - b)[1]!;
    const speed = Math.max(1, loop / REFERENCE_LOOP_MS);
    const cores = Math.max(1, cpus().length);
    const load = Math.max(1, loadavg()[0]! / cores, guestsAtOnce() / cores);
    factor = Math.min(MAX_MACHINE_FACTOR, speed * load) * configuredScale();
    console.log(
      `      [lab] guest time budgets x${factor.toFixed(2)} (loop ${loop.toFixed(0)} ms vs ${REFERENCE_LOOP_MS}, ` +
        `load ${load.toFixed(2)}/core, guests at once ${guestsAtOnce()}, ` +
        `EGRESS_TEST_TIME_SCALE ${configuredScale()})`,
    );
  }
  return factor;
}

const scaled = (seconds: number): number => Math.ceil(seconds * timeScale());

/** From `start` until the guest agent reports the guest's address (base 300 s). */
export const guestAddressSeconds = (): number => scaled(300);

/** From the address until squid answers on the guest (base 240 s). */
export const guestReadySeconds = (): number => scaled(240);

/**
 * KvmProxy's `timeouts` for a guest in the lab: create covers the image
 * download and upload (base 120 s) plus boot and readiness.
 */
export function kvmTimeouts(): {
  createSeconds: number;
  readySeconds: number;
  deleteSeconds: number;
} {
  return {
    createSeconds: guestAddressSeconds() + guestReadySeconds() + scaled(120),
    readySeconds: guestReadySeconds(),
    deleteSeconds: scaled(120),
  };
}

/**
 * The deadline the test's engine (test/engine/harness.ts) gives one gRPC
 * call that may create guests: the provider's own create budget plus a
 * minute, so the provider's timeout, with its clear message, fires first.
 */
export const engineCallMs = (): number => (kvmTimeouts().createSeconds + 60) * 1000;

/** A mocha timeout for a test that creates guests (in parallel) and then waits on them `waits` times. */
export const guestTestTimeoutMs = (waits = 1): number =>
  (kvmTimeouts().createSeconds + waits * guestReadySeconds() + scaled(120)) * 1000;
