/**
 * The disruption budget: how many members of one pool one deployment may
 * take out of service at the same time (restarted, replaced, rotated or
 * deleted). The pool gives every VM member the same `disruptionBudget`
 * ({ group, maxUnavailable }); the members decide, each in its own `check`
 * and `diff`, against one ledger.
 *
 * Why a ledger in the provider process: the engine serves every dynamic
 * resource of a deployment from one Node process (the SDK's
 * dynamic-provider server, started per deployment and configured once), and
 * it asks `check` and `diff` one registration at a time, in the order the
 * program registers, before the steps run. So the first members of a group
 * that ask for a disruption get a grant, until the group holds
 * `maxUnavailable`; the others are deferred: their plan leaves the VM as it
 * is, a warning says so, and the next `up` (a resync minutes later) asks
 * again. Nothing about a deferral is stored: what asked for it (a new
 * `rotate` text, a refresh's finding, an exit address entry) is still there
 * at the next `up`.
 *
 * A grant is held until its step ends (the restart's update, the replaced
 * VM's delete, or the replacement's create when the old VM went first) and
 * is then free for a later step of the same deployment: a member the pool
 * no longer has (scale-down) waits for a free place before its delete, at
 * most as long as a create may take, so the engine is never stalled for
 * good by a grant whose step never came.
 *
 * Pulumi's own `--parallel` is not a budget: it bounds steps of every kind,
 * not one pool's lost capacity, and it cannot defer a step to the next run.
 */
import { z } from "zod";
import { sleepWithin, type Deadline } from "./deadline";

/** The input's name (common/diff.ts ChangeTableOf leaves it out of every table: it never plans a change). */
export const DISRUPTION_BUDGET_KEY = "disruptionBudget";

/** Longest drain one member may ask for: consumers that need longer should not be fed from a mounted Secret. */
export const MAX_DRAIN_SECONDS = 3600;

export const disruptionBudgetSchema = z
  .object(
    {
      group: z
        .string({ error: "disruptionBudget.group must be a text (the pool's name)" })
        .min(1, { error: "disruptionBudget.group must not be empty" })
        .max(400, { error: "disruptionBudget.group must be at most 400 characters" }),
      maxUnavailable: z
        .number({ error: "disruptionBudget.maxUnavailable must be a whole number, e.g. 1" })
        .int({ error: "disruptionBudget.maxUnavailable must be a whole number, e.g. 1" })
        .min(1, { error: "disruptionBudget.maxUnavailable must be at least 1" })
        .max(100_000, { error: "disruptionBudget.maxUnavailable must be at most 100000" }),
      drainSeconds: z
        .number({
          error: "disruptionBudget.drainSeconds must be a whole number of seconds, e.g. 30",
        })
        .int({ error: "disruptionBudget.drainSeconds must be a whole number of seconds, e.g. 30" })
        .min(0, { error: "disruptionBudget.drainSeconds must be 0 (no drain) or more" })
        .max(MAX_DRAIN_SECONDS, {
          error: `disruptionBudget.drainSeconds must be at most ${MAX_DRAIN_SECONDS} (an hour)`,
        })
        .optional(),
      /** "rotate": the younger of two members on one exit address is replaced (common/collision-rotation.ts). */
      onCollision: z
        .enum(["rotate"], { error: 'disruptionBudget.onCollision must be "rotate" or left out' })
        .optional(),
    },
    {
      error:
        'disruptionBudget must be { group: "<pool name>", maxUnavailable: <count>, drainSeconds?: <seconds>, onCollision?: "rotate" }, e.g. { group: "crawl", maxUnavailable: 1, drainSeconds: 30 }',
    },
  )
  .optional();

/** The step whose end frees a grant. */
export type Step = "create" | "update" | "delete";

/** A member's budget and its name in the ledger, read from its inputs or state; undefined: not budgeted. */
export interface BudgetedMember {
  /** The group's key in the ledger: project, stack and the pool's group. */
  groupKey: string;
  group: string;
  maxUnavailable: number;
  /**
   * How long a member stays up after the pool stopped publishing it, before
   * its VM is deleted (0: none; absent in state written before drains).
   */
  drainSeconds: number;
  /** The younger of two members on one exit address is rotated (common/collision-rotation.ts). */
  rotatesCollisions: boolean;
  /** The Pulumi resource name (`owner.resource`): the same for a VM and its replacement. */
  member: string;
}

export function budgetedMember(props: Record<string, unknown>): BudgetedMember | undefined {
  const parsed = disruptionBudgetSchema.safeParse(props[DISRUPTION_BUDGET_KEY]);
  if (!parsed.success || parsed.data === undefined) return undefined;
  const owner = props.owner as
    { project?: unknown; stack?: unknown; resource?: unknown } | undefined;
  if (typeof owner?.resource !== "string") return undefined;
  const { group, maxUnavailable, drainSeconds, onCollision } = parsed.data;
  return {
    groupKey: JSON.stringify([owner.project ?? "", owner.stack ?? "", group]),
    group,
    maxUnavailable,
    drainSeconds: drainSeconds ?? 0,
    rotatesCollisions: onCollision === "rotate",
    member: owner.resource,
  };
}

export interface Admission {
  granted: boolean;
  /** The members holding the group's grants now (after this admission). */
  holders: string[];
}

/** A grant, by the step whose end frees it. */
type Grant = Step;

/** Fewest members re-checked in one refresh before "most look silent" means anything. */
export const SUSPECT_RUNNER_MIN_MEMBERS = 3;

/** A member's VM as a refresh found it: its exit addresses (canonical) and when it was made. */
export interface MemberExit {
  addresses: string[];
  createdAt: string;
}

/** One deployment's grants, by group. One per provider process (`disruptionLedger`). */
export class DisruptionLedger {
  private readonly groups = new Map<string, Map<string, Grant>>();
  /** Groups whose members this deployment's program registered (check or diff asked). */
  private readonly registered = new Set<string>();
  /** What this deployment's refresh found, by group: member -> silent. */
  private readonly rechecks = new Map<string, Map<string, boolean>>();
  /** The exit addresses this deployment's refresh found, by group: member -> its VM's. */
  private readonly exits = new Map<string, Map<string, MemberExit>>();
  private readonly waiters = new Set<() => void>();

  private grantsOf(groupKey: string): Map<string, Grant> {
    let grants = this.groups.get(groupKey);
    if (grants === undefined) this.groups.set(groupKey, (grants = new Map()));
    return grants;
  }

  /**
   * A grant freed when `releasedBy` ends: at once when the member holds one
   * already (asking again is free, and updates which step frees it) or the
   * group has room; else denied.
   */
  admit(budgeted: BudgetedMember, releasedBy: Step): Admission {
    const grants = this.grantsOf(budgeted.groupKey);
    const held = grants.has(budgeted.member);
    if (held || grants.size < budgeted.maxUnavailable) grants.set(budgeted.member, releasedBy);
    return { granted: grants.has(budgeted.member), holders: [...grants.keys()] };
  }

  /** The member's program registered it in this deployment: its pool is still there. */
  noteRegistered(budgeted: BudgetedMember): void {
    this.registered.add(budgeted.groupKey);
  }

  /**
   * Whether the member's pool is in this deployment's program. When it is
   * not (`pulumi destroy`, or the pool removed from the program) there is
   * no capacity left to protect, and its deletes need no place.
   */
  inProgram(budgeted: BudgetedMember): boolean {
    return this.registered.has(budgeted.groupKey);
  }

  holds(budgeted: BudgetedMember): boolean {
    return this.grantOf(budgeted) !== undefined;
  }

  /** The step whose end frees the member's grant; undefined: it holds none. */
  grantOf(budgeted: BudgetedMember): Step | undefined {
    return this.groups.get(budgeted.groupKey)?.get(budgeted.member);
  }

  /**
   * `step` ended for the member. Its grant is freed when that step was the
   * one it waited for, or when the step failed (a failed replacement create
   * leaves the old VM in place: nothing more of it comes).
   */
  release(budgeted: BudgetedMember, step: Step, failed = false): void {
    const grants = this.groups.get(budgeted.groupKey);
    const grant = grants?.get(budgeted.member);
    if (grant === undefined || (grant !== step && !failed)) return;
    grants!.delete(budgeted.member);
    for (const wake of [...this.waiters]) wake();
  }

  /**
   * A grant for a delete nobody planned through `diff` (a member the pool no
   * longer has): waits for room until `deadline`, then goes ahead anyway and
   * says so (`overran`), so that a grant whose step never comes cannot stall
   * the engine for good.
   */
  async admitDelete(
    budgeted: BudgetedMember,
    deadline: Deadline,
    onWait: (holders: string[]) => void,
  ): Promise<{ overran: boolean }> {
    let admission = this.admit(budgeted, "delete");
    if (admission.granted) return { overran: false };
    onWait(admission.holders);
    while (!admission.granted) {
      if (deadline.expired()) {
        this.grantsOf(budgeted.groupKey).set(budgeted.member, "delete");
        return { overran: true };
      }
      await this.freed(deadline);
      admission = this.admit(budgeted, "delete");
    }
    return { overran: false };
  }

  /** Resolves when a grant is freed, or after a while (the deadline is checked again). */
  private async freed(deadline: Deadline): Promise<void> {
    let wake: () => void = () => undefined;
    const woken = new Promise<void>((resolve) => (wake = resolve));
    this.waiters.add(wake);
    try {
      await Promise.race([woken, sleepWithin(1_000, deadline)]);
    } finally {
      this.waiters.delete(wake);
    }
  }

  /** A refresh in this deployment re-checked the member: did it answer? */
  noteRecheck(budgeted: BudgetedMember, silent: boolean): void {
    let seen = this.rechecks.get(budgeted.groupKey);
    if (seen === undefined) this.rechecks.set(budgeted.groupKey, (seen = new Map()));
    seen.set(budgeted.member, silent);
  }

  /**
   * When more than half of the group's members that this deployment's
   * refresh re-checked (at least SUSPECT_RUNNER_MIN_MEMBERS) gave no answer,
   * the runner's own path is the likelier fault: how many, else undefined.
   */
  runnerSuspected(budgeted: BudgetedMember): { silent: number; rechecked: number } | undefined {
    const seen = [...(this.rechecks.get(budgeted.groupKey)?.values() ?? [])];
    const silent = seen.filter(Boolean).length;
    return seen.length >= SUSPECT_RUNNER_MIN_MEMBERS && silent * 2 > seen.length
      ? { silent, rechecked: seen.length }
      : undefined;
  }

  /** A refresh in this deployment found the member's VM running, leaving from these addresses. */
  noteExit(budgeted: BudgetedMember, exit: MemberExit): void {
    let seen = this.exits.get(budgeted.groupKey);
    if (seen === undefined) this.exits.set(budgeted.groupKey, (seen = new Map()));
    seen.set(budgeted.member, exit);
  }

  /** What this deployment's refresh found of each member of the group, by member. */
  exitsOf(budgeted: BudgetedMember): ReadonlyMap<string, MemberExit> {
    return this.exits.get(budgeted.groupKey) ?? new Map();
  }

  /** Forgets every grant and re-check (tests that model several deployments in one process). */
  reset(): void {
    this.groups.clear();
    this.registered.clear();
    this.rechecks.clear();
    this.exits.clear();
  }
}

/** This process's ledger: one deployment's. */
export const disruptionLedger = new DisruptionLedger();
