/**
 * What state alone adds to a change table's verdict, in one order for every
 * VM resource: an in-place egress heal (common/egress-recheck.ts), a
 * rotation by exit address (common/egress-rotation.ts), and a repair
 * replacement (common/replacement.ts), which outranks both; then the pool's
 * disruption budget, which may defer the replacement or restart that results
 * (common/disruption-rules.ts).
 */
import { decideDiff, type ChangeTable, type DiffDecision } from "./diff";
import { decisionWithinBudget } from "./disruption-rules";
import { needsEgressRestart, withEgressHeal } from "./egress-recheck";
import { withEgressRotation } from "./egress-rotation";
import { withRepairReplacement } from "./replacement";

type Props = Record<string, unknown>;

export function withStateRules(decision: DiffDecision, olds: Props, news: Props): DiffDecision {
  return withRepairReplacement(
    withEgressRotation(withEgressHeal(decision, olds, news), olds, news),
    olds,
  );
}

/** A VM member's whole diff: the table's verdict, what state adds, within the disruption budget. */
export function decideMemberDiff(table: ChangeTable, olds: Props, news: Props): DiffDecision {
  const decision = withStateRules(decideDiff(table, olds, news), olds, news);
  return decisionWithinBudget(table, decision, olds, news, needsEgressRestart(olds, news));
}
