/**
 * What every resource class passes to `pulumi.dynamic.Resource`: the inputs
 * with secrets wrapped (common/secrets.ts), the owner the mark records, and
 * every output key declared (an output is only exposed on the object when
 * its key is in the props). `.get` is the same constructor with an id.
 */
import * as pulumi from "@pulumi/pulumi";
import { secretOutputNames, withSecretInputs } from "./secrets";

/** `egressCheck`, the same on every resource (provider/common/egress.ts checks it). */
export type EgressCheckArgs = pulumi.Input<{
  url: pulumi.Input<string>;
  field?: pulumi.Input<string>;
  proxyAuth?: pulumi.Input<{ user: pulumi.Input<string>; password: pulumi.Input<string> }>;
}>;

/** Our own timeouts, the same on every resource (Pulumi ignores customTimeouts for dynamic resources). */
export type TimeoutsArgs = pulumi.Input<{
  createSeconds?: pulumi.Input<number>;
  readySeconds?: pulumi.Input<number>;
  deleteSeconds?: pulumi.Input<number>;
}>;

export function resourceProps(
  name: string,
  args: object & { vmName?: unknown },
  outputKeys: readonly string[],
): Record<string, unknown> {
  return {
    ...withSecretInputs(args),
    owner: { project: pulumi.getProject(), stack: pulumi.getStack(), resource: name },
    vmName: args.vmName,
    ...Object.fromEntries(outputKeys.map((key) => [key, undefined])),
  };
}

/** The caller's options plus the outputs that hold a secret input (or derive from one). */
export function resourceOptions(
  opts: pulumi.CustomResourceOptions,
  inputNames: readonly string[],
): pulumi.CustomResourceOptions {
  return {
    ...opts,
    additionalSecretOutputs: [
      ...(opts.additionalSecretOutputs ?? []),
      ...secretOutputNames(inputNames),
    ],
  };
}
