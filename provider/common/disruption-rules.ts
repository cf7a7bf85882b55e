/**
 * Where the disruption budget (common/disruption-budget.ts) meets the
 * provider methods, the same for every VM resource:
 *
 * - check: a replacement the inputs ask for (a new `rotate` text, a new image)
 *   that the budget denies keeps the old values of the fields that would
 *   replace it, so the plan leaves the VM as it is and the state keeps asking
 *   (the next `up` compares the program with them again);
 * - diff: a replacement or restart that state asks for (a refresh's finding,
 *   an exit-address entry, a repair) that the budget denies is left out of
 *   the plan; the finding stays in state, so the next `up` asks again;
 * - update: the egress heal's restart asks too (a place may have come free);
 * - read: what each re-check found is noted; when most members of a pool
 *   look silent in one refresh, no restart is done at all (the runner that
 *   cannot reach them is the likelier fault than most proxies at once);
 * - create, update, delete: the end of a step frees its grant, a delete
 *   nobody planned (scale-down) waits for a free place first, and a member
 *   that carried traffic is drained before its VM goes.
 */
import { memberExitOf } from "./collision-rotation";
import { containsUnknown } from "./inputs";
import { Deadline, sleepWithin } from "./deadline";
import { decideDiff, valueAt, type ChangeTable, type DiffDecision } from "./diff";
import {
  budgetedMember,
  disruptionLedger,
  type BudgetedMember,
  type Step,
} from "./disruption-budget";
import { EGRESS_PROBLEM_KEY, isSilentFromHere, isUnanswered } from "./egress-recheck";
import { logToEngine } from "./engine-log";
import { isIncompleteCreate } from "./partial-create";

type Props = Record<string, unknown>;

/** What a member asks for: each takes it out of service until its step ends. */
type Disruption = "restart" | "replace";

const SILENT = "its proxy did not answer the last re-check";

/** Each warning is said once per deployment (check, diff and update may each come to it). */
const said = new Set<string>();
function warnOnce(key: unknown[], message: string): void {
  const text = JSON.stringify(key);
  if (said.has(text)) return;
  said.add(text);
  logToEngine(message, "warning");
}

/**
 * Whether the member may take `disruption` now, its place freed when
 * `releasedBy` ends; when not, says why (once). A restart is never granted
 * while most of the pool looks silent from here (ledger.runnerSuspected).
 */
function admitted(
  budgeted: BudgetedMember,
  disruption: Disruption,
  releasedBy: Step,
  why: string,
): boolean {
  const suspected =
    disruption === "restart" ? disruptionLedger.runnerSuspected(budgeted) : undefined;
  if (suspected !== undefined) {
    warnOnce(
      [budgeted.groupKey, budgeted.member, "suspect"],
      `${budgeted.member}: not restarted: ${suspected.silent} of the ${suspected.rechecked} members this ` +
        "refresh re-checked gave no answer: more likely this runner lost its path to them than that most " +
        `proxies failed at once (pool "${budgeted.group}"); it is published not ready, and the next ` +
        "`up --refresh` looks again",
    );
    return false;
  }
  const admission = disruptionLedger.admit(budgeted, releasedBy);
  if (!admission.granted)
    warnOnce(
      [budgeted.groupKey, budgeted.member, disruption, why],
      `${budgeted.member}: ${disruption === "restart" ? "restart" : "replacement"} (${why}) deferred by ` +
        `the disruption budget of pool "${budgeted.group}" (maxUnavailable ${budgeted.maxUnavailable}, ` +
        `held by ${admission.holders.join(", ")}): it stays as it is, and the next \`up\` asks again`,
    );
  return admission.granted;
}

/** A copy of `props` with `path` holding `value` (undefined removes it). */
function withPathValue(props: Props, path: string, value: unknown): Props {
  const [head, ...rest] = path.split(".");
  if (rest.length === 0) {
    const copy = { ...props };
    if (value === undefined) delete copy[head!];
    else copy[head!] = value;
    return copy;
  }
  const inner = props[head!];
  const nested = typeof inner === "object" && inner !== null ? (inner as Props) : {};
  return { ...props, [head!]: withPathValue(nested, rest.join("."), value) };
}

/**
 * check's part: `checked` as check would return it, or with the old values of
 * the fields that would replace the VM when the budget denies the
 * replacement. A create (no olds) and a value unknown at preview ask nothing.
 */
export function inputsWithinBudget(table: ChangeTable, olds: Props, checked: Props): Props {
  const budgeted = budgetedMember(checked);
  if (budgeted !== undefined) disruptionLedger.noteRegistered(budgeted);
  if (budgeted === undefined || Object.keys(olds).length === 0) return checked;
  const decision = decideDiff(table, olds, checked);
  const replacing = decision.replaces.filter((path) => !containsUnknown(valueAt(checked, path)));
  if (replacing.length === 0) return checked;
  const releasedBy = decision.deleteBeforeReplace ? "create" : "delete";
  if (admitted(budgeted, "replace", releasedBy, `${replacing.join(", ")} changed`)) return checked;
  return replacing.reduce((kept, path) => withPathValue(kept, path, valueAt(olds, path)), checked);
}

/** The table with its in-place paths only: what a deferred member may still change. */
const inPlaceOnly = (table: ChangeTable): ChangeTable =>
  Object.fromEntries(Object.entries(table).filter(([, kind]) => kind === "update"));

/**
 * diff's part: `decision` (the table's verdict with what state adds), or,
 * when it replaces or restarts the VM and that is not admitted, only the
 * in-place changes of the table.
 */
export function decisionWithinBudget(
  table: ChangeTable,
  decision: DiffDecision,
  olds: Props,
  news: Props,
  restarts: boolean,
): DiffDecision {
  const disruption: Disruption | undefined =
    decision.replaces.length > 0 ? "replace" : decision.changes && restarts ? "restart" : undefined;
  const budgeted = budgetedMember(news);
  if (disruption === undefined || budgeted === undefined) return decision;
  const go =
    disruption === "restart"
      ? admitted(budgeted, "restart", "update", SILENT)
      : admitted(
          budgeted,
          "replace",
          decision.deleteBeforeReplace ? "create" : "delete",
          `${decision.replaces.join(", ")} asked for it`,
        );
  return go ? decision : decideDiff(inPlaceOnly(table), olds, news);
}

/** update's part: whether the egress heal's restart may go ahead now. */
export function restartAdmitted(news: Props): boolean {
  const budgeted = budgetedMember(news);
  return budgeted === undefined || admitted(budgeted, "restart", "update", SILENT);
}

async function releasing<T>(
  budgeted: BudgetedMember | undefined,
  step: Step,
  run: () => Promise<T>,
): Promise<T> {
  try {
    const result = await run();
    if (budgeted !== undefined) disruptionLedger.release(budgeted, step);
    return result;
  } catch (error) {
    if (budgeted !== undefined) disruptionLedger.release(budgeted, step, true);
    throw error;
  }
}

/** A create that frees the grant of the replacement it ends (the old VM went first), or of one that failed. */
export function createReleasingBudget<R>(create: (inputs: Props) => Promise<R>) {
  return (inputs: Props): Promise<R> =>
    releasing(budgetedMember(inputs), "create", () => create(inputs));
}

/** An update that frees the restart's grant when it ends. */
export function updateReleasingBudget<R>(
  update: (id: string, olds: Props, news: Props) => Promise<R>,
) {
  return (id: string, olds: Props, news: Props): Promise<R> =>
    releasing(budgetedMember(news), "update", () => update(id, olds, news));
}

/** Longest a delete waits for a place: as long as the step that holds one may take. */
const DEFAULT_WAIT_SECONDS = 900;

/** A member the pool no longer has (scale-down) waits for a free place, or goes anyway, said, once a create could have ended. */
async function waitForPlace(budgeted: BudgetedMember, props: Props): Promise<void> {
  const timeouts = props.timeouts as { createSeconds?: unknown } | undefined;
  const seconds =
    typeof timeouts?.createSeconds === "number" ? timeouts.createSeconds : DEFAULT_WAIT_SECONDS;
  const deadline = Deadline.afterSeconds(seconds, "timeouts.createSeconds");
  const { overran } = await disruptionLedger.admitDelete(budgeted, deadline, (holders) =>
    logToEngine(
      `${budgeted.member}: delete waits for the disruption budget of pool "${budgeted.group}" ` +
        `(maxUnavailable ${budgeted.maxUnavailable}, held by ${holders.join(", ")})`,
      "info",
    ),
  );
  if (overran)
    logToEngine(
      `${budgeted.member}: deleted without a place in the disruption budget of pool "${budgeted.group}": ` +
        `its holders did not finish within ${seconds} s (timeouts.createSeconds)`,
      "warning",
    );
}

/**
 * Whether the member carried traffic at its last read: running, and not
 * silent at its last re-check. One that did not (stopped, dead, a create
 * that never finished) has no clients to drain.
 */
function inService(props: Props): boolean {
  if (isIncompleteCreate(props)) return false;
  const state = props.state;
  // Silent on one family of two still serves the other: drained (when unsure, draining is the safe side).
  const problem = props[EGRESS_PROBLEM_KEY];
  const silentEverywhere = isUnanswered(problem, "ipv4") && isUnanswered(problem, "ipv6");
  return (typeof state !== "string" || state === "running") && !silentEverywhere;
}

/**
 * The drain: by the time the engine deletes a member the pool still has in
 * its program, the pool's published set (Secret, EndpointSlices) no longer
 * names it, because the engine deletes a replaced or removed resource only
 * after it has updated everything that depended on it. Clients that read the
 * set before that (a mounted Secret lags by a kubelet sync) keep the member's
 * URL for a while: it stays up `drainSeconds` for them.
 */
async function drain(budgeted: BudgetedMember, props: Props): Promise<void> {
  if (budgeted.drainSeconds === 0 || !inService(props)) return;
  logToEngine(
    `${budgeted.member}: draining ${budgeted.drainSeconds} s before its VM is deleted (drainSeconds of ` +
      `pool "${budgeted.group}"): the pool no longer publishes it; clients that still hold its URL finish`,
    "info",
  );
  await sleepWithin(budgeted.drainSeconds * 1000);
}

/**
 * A delete within the budget, drained: the replaced VM of a member that
 * holds a grant goes after its drain; a member the pool no longer has waits
 * for a free place first; the old VM of a replacement that deletes first (a
 * name the user fixed) is not drained, since nothing republished without it
 * yet; a member whose pool this deployment's program does not register
 * (`pulumi destroy`, the pool removed) goes at once: no capacity left to
 * protect, nobody to drain for.
 */
export function deleteWithinBudget<R>(remove: (id: string, props: Props) => Promise<R>) {
  return async (id: string, props: Props): Promise<R> => {
    const budgeted = budgetedMember(props);
    if (budgeted !== undefined && disruptionLedger.inProgram(budgeted)) {
      const grant = disruptionLedger.grantOf(budgeted);
      if (grant === undefined) await waitForPlace(budgeted, props);
      if (grant !== "create") await drain(budgeted, props);
    }
    return releasing(budgeted, "delete", () => remove(id, props));
  };
}

/** A read that notes what its re-check found, for the "most look silent" rule, and its exit addresses (collision-rotation.ts). */
function readNotingRechecks<R extends { props?: Props }>(
  read: (id: string, props: Props) => Promise<R>,
) {
  return async (id: string, props: Props): Promise<R> => {
    const result = await read(id, props);
    const found = result.props ?? {};
    const budgeted = budgetedMember(found);
    if (budgeted !== undefined && found.egressRecheck === true && found.state === "running")
      disruptionLedger.noteRecheck(budgeted, isSilentFromHere(found[EGRESS_PROBLEM_KEY]));
    const exit = budgeted?.rotatesCollisions ? memberExitOf(found) : undefined;
    if (budgeted !== undefined && exit !== undefined) disruptionLedger.noteExit(budgeted, exit);
    return result;
  };
}

/** A VM resource's steps, each within the budget as above (the providers export these). */
export function budgetedSteps<C, R extends { props?: Props }, U, D>(steps: {
  create: (inputs: Props) => Promise<C>;
  read: (id: string, props: Props) => Promise<R>;
  update: (id: string, olds: Props, news: Props) => Promise<U>;
  remove: (id: string, props: Props) => Promise<D>;
}) {
  return {
    create: createReleasingBudget(steps.create),
    read: readNotingRechecks(steps.read),
    update: updateReleasingBudget(steps.update),
    remove: deleteWithinBudget(steps.remove),
  };
}
