/**
 * What state alone adds to a change table's verdict, in one order for every
 * VM resource: an in-place egress heal (common/egress-recheck.ts), a
 * rotation by exit address (common/egress-rotation.ts), and a repair
 * replacement (common/replacement.ts), which outranks both.
 */
import type { DiffDecision } from "./diff";
import { withEgressHeal } from "./egress-recheck";
import { withEgressRotation } from "./egress-rotation";
import { withRepairReplacement } from "./replacement";

type Props = Record<string, unknown>;

export function withStateRules(decision: DiffDecision, olds: Props, news: Props): DiffDecision {
  return withRepairReplacement(
    withEgressRotation(withEgressHeal(decision, olds, news), olds, news),
    olds,
  );
}
