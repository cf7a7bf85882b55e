/**
 * What `check` does for both resources: name the VM, validate, and settle the
 * name once defaults are filled. Pure and offline (`pulumi preview` in CI).
 */
import { inputsWithCollisionRotation } from "./collision-rotation";
import {
  provisionalVmName,
  resourceNameOf,
  vmNameAfterReplacement,
  type ChangeTable,
} from "./diff";
import { inputsWithinBudget } from "./disruption-rules";
import type { CheckFailure, ValidationResult } from "./inputs";

type Props = Record<string, unknown>;

export function checkWithAutonaming<T extends { vmName?: string; vmNameChosenBy?: string }>(
  table: ChangeTable,
  olds: Props,
  news: Props,
  validate: (named: Props) => ValidationResult<T>,
  /** Runs on preview inputs too: a field may then hold UNKNOWN instead of its type. */
  normalize: (inputs: T) => T = (inputs) => inputs,
): { inputs: Props; failures: CheckFailure[] } {
  const resourceName = resourceNameOf(news);
  const named = { ...news, ...provisionalVmName(olds, news, resourceName) };
  const result = validate(named);
  // With values unknown at preview, the known fields still get their defaults
  // (`result.known`): diff then compares like with like and reports only what
  // is unknown or really differs, not every defaulted field.
  if (!result.ok && result.known === undefined) return { inputs: named, failures: result.failures };
  // A preview value may hold UNKNOWN where T says a number or a string.
  const checked = result.ok ? result.inputs : (result.known as T);
  const inputs = {
    ...normalize(checked),
    vmName: named.vmName,
    vmNameChosenBy: named.vmNameChosenBy,
  };
  inputs.vmName = vmNameAfterReplacement(table, olds, inputs, resourceName);
  return {
    inputs: plainJson(inputsWithCollisionRotation(inputsWithinBudget(table, olds, inputs))),
    failures: [],
  };
}

/** Plain JSON for the gRPC Struct: no undefined (it is rejected), no class instances. */
export function plainJson<T>(value: T): T {
  return JSON.parse(JSON.stringify(value)) as T;
}
