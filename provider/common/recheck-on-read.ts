/**
 * Read's step of the egress re-check (egress-recheck.ts has the probes and
 * the rule): re-check a proxy found serving, and put a "no answer" to its
 * guest through the hypervisor before anything acts on it
 * (guest-view.ts; docs/day2.md, "Corroborated before a restart").
 */
import type { Deadline } from "./deadline";
import { egressCheckSchema } from "./egress";
import {
  EGRESS_PROBLEM_KEY,
  egressProblemOf,
  now,
  recheckEgress,
  type RecheckCheck,
  type RecheckFinding,
} from "./egress-recheck";
import { logToEngine } from "./engine-log";
import type { GuestView } from "./guest-view";

type Props = Record<string, unknown>;

/** What the guest's question keeps of a read's deadline (a quarter at most). */
const GUEST_QUESTION_MS = 10_000;

/** The inputs the re-check reads (the same on every backend). */
export interface RecheckInputs {
  egressRecheck?: boolean | undefined;
  egressCheck?: RecheckCheck | undefined;
  readiness: { mode: string; port: number };
}

/**
 * Read's step: re-check a proxy found serving at `address` when the input
 * asks for it, and say which outputs that sets. Without a re-check (off, a
 * VM not running, readiness "none") no problem is recorded: `running` and
 * `state` report a VM that is not running, and the proxy is re-checked when
 * it runs again. Readiness "none" checks nothing, and "address" only the
 * egress check when there is one.
 */
export async function recheckOnRead(
  inputs: RecheckInputs,
  /** `ipv6`: a proxy that takes IPv6, its IPv6 address as read now (null: none reported). */
  found: { serving: boolean; address: string | null; ipv6?: string | null },
  previous: Props,
  deadline: Deadline,
  /** Asks the guest through the hypervisor when the proxy gives no answer here. */
  guest?: GuestAsker,
): Promise<{ finding: RecheckFinding | undefined; outputs: Props }> {
  // What create checked is what refresh re-checks: readiness "address" waits for no port.
  const checked =
    inputs.readiness.mode === "port" ||
    (inputs.readiness.mode === "address" && inputs.egressCheck !== undefined);
  if (inputs.egressRecheck !== true || !checked || !found.serving || found.address === null)
    return { finding: undefined, outputs: { [EGRESS_PROBLEM_KEY]: null } };
  // Readiness "address" checked the IPv6 side only through ipv6Url: without it, nothing to re-check there.
  const ipv6Checked =
    found.ipv6 !== undefined &&
    (inputs.readiness.mode === "port" || inputs.egressCheck?.ipv6Url !== undefined);
  // A proxy that gives no answer can take the whole deadline: the guest's question keeps its share.
  const probeDeadline =
    guest === undefined
      ? deadline
      : deadline.leaving(Math.min(GUEST_QUESTION_MS, deadline.remainingMs() / 4));
  const finding = await recheckEgress(
    { host: found.address, port: inputs.readiness.port },
    inputs.egressCheck,
    previous,
    probeDeadline,
    ipv6Checked ? { address: found.ipv6 ?? null } : undefined,
  );
  const judged =
    guest === undefined
      ? finding
      : await corroborated(finding, guest, inputs.readiness.port, previous, deadline);
  return { finding: judged, outputs: { ...judged } };
}

/** The guest's side, asked through the hypervisor: the resource's name and how to ask. */
export interface GuestAsker {
  /** How the warnings name the proxy (its VM name). */
  name: string;
  /** What the guest's socket tables say of `port` ("unknown" when it cannot be asked). */
  view(port: number, deadline: Deadline): Promise<GuestView>;
}

/**
 * A finding of "no answer" put to the guest before anything acts on it: the
 * port listening there makes it "path-unknown" (reported, not restarted: a
 * restart cannot mend a path); nothing listening confirms it; a guest that
 * cannot be asked leaves it as it was.
 */
async function corroborated(
  finding: RecheckFinding,
  guest: GuestAsker,
  port: number,
  previous: Props,
  deadline: Deadline,
): Promise<RecheckFinding> {
  const problem = finding.egressProblem;
  if (problem?.kind !== "unanswered" || deadline.expired()) return finding;
  const view = await guest.view(port, deadline).catch((): GuestView => "unknown");
  if (view === "unknown") return finding;
  if (view === "not-listening")
    return {
      ...finding,
      egressProblem: {
        ...problem,
        reason: `${problem.reason}; the guest agent reports nothing listening on port ${port}`,
      },
    };
  logToEngine(
    `${guest.name}: no answer from here (${problem.reason}), but the guest agent reports port ${port} ` +
      "listening: the path from this runner, not the proxy, is the likelier fault; not restarted, and " +
      "the pool keeps publishing it (readiness unknown)",
    "warning",
  );
  const was = egressProblemOf(previous);
  const { restartedAt: _restart, ...rest } = problem;
  return {
    ...finding,
    egressProblem: {
      ...rest,
      kind: "path-unknown",
      reason: `${problem.reason}; the guest agent reports port ${port} listening`,
      since: was?.kind === "path-unknown" ? was.since : now(),
    },
  };
}

/**
 * The re-check's inputs from stored props, leniently (read must work on
 * state written by older versions): what does not parse is left out.
 */
export function recheckInputsOf(
  props: Props,
  port: number,
): RecheckInputs & { rotateAfterDays?: number } {
  const check = egressCheckSchema.safeParse(props.egressCheck);
  const mode = (props.readiness as { mode?: unknown } | undefined)?.mode;
  const days = props.rotateAfterDays;
  return {
    egressRecheck: props.egressRecheck === true,
    ...(check.success && check.data !== undefined ? { egressCheck: check.data } : {}),
    readiness: { mode: typeof mode === "string" ? mode : "port", port },
    ...(typeof days === "number" && days > 0 ? { rotateAfterDays: days } : {}),
  };
}
