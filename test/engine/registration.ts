import {
  CONSUMER_IDENTITY,
  runResourceProgram,
  urnOf,
  SECRET_SIGNATURE,
  SECRET_SIGNATURE_KEY as SECRET_KEY,
  type ConsumerProject,
  type Props,
} from "./harness";

/**
 * What a program registers for a resource, exactly as the SDK sends it to the
 * engine (the RegisterResourceRequest the mock monitor receives): the
 * serialized inputs with their secret marks and unknowns, and the
 * `additionalSecretOutputs`. Beside it, the engine's own rules for secrets
 * (`annotateSecrets` in pkg/resource/plugin/provider_plugin.go and the
 * step executor's additional-secret-outputs pass), so a test can see what
 * state would hold without the Pulumi CLI.
 *
 * In the arguments, `{ $unknown: true }` stands for a value another resource
 * has not computed yet (a real unknown Output at preview), `{ $secret: v }`
 * for `pulumi.secret(v)` from elsewhere, `{ $output: v }` for an Output.
 */
export interface Registration {
  type: string;
  name: string;
  urn: string;
  /** Serialized as on the wire: secrets as signature objects, unknowns as UNKNOWN. */
  wire: Props;
  /** What the engine hands a provider that does not accept secrets: marks removed. */
  inputs: Props;
  /** Dotted paths of the values registered as secrets. */
  secretPaths: string[];
  additionalSecretOutputs: string[];
}

export const UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9";

const PROGRAM = `
const fs = require("node:fs");
const pulumi = require("@pulumi/pulumi");
let outFile;
const mocks = require("@pulumi/pulumi/runtime/mocks");
const register = mocks.MockMonitor.prototype.registerResource;
mocks.MockMonitor.prototype.registerResource = function (req, callback) {
  if (req.getType().startsWith("pulumi-nodejs:dynamic/"))
    fs.writeFileSync(outFile, JSON.stringify({
      type: req.getType(),
      name: req.getName(),
      wire: req.getObject().toJavaScript(),
      additionalSecretOutputs: req.getAdditionalsecretoutputsList(),
    }));
  return register.call(this, req, callback);
};
class Source extends pulumi.CustomResource {
  constructor(name) { super("test:index:Source", name, { value: undefined }); }
}
let sources = 0;
function revive(value) {
  if (Array.isArray(value)) return value.map(revive);
  if (value === null || typeof value !== "object") return value;
  if (value.$unknown === true) return new Source("source-" + sources++).value;
  if ("$secret" in value) return pulumi.secret(revive(value.$secret));
  if ("$output" in value) return pulumi.output(revive(value.$output));
  return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, revive(item)]));
}
async function main(runOutFile, moduleName, exportName, resourceName, argsJson, project, stack, preview) {
  outFile = runOutFile;
  await pulumi.runtime.setMocks(
    {
      newResource: (args) => ({
        id: args.name + "-id",
        // At preview, an output the mock does not return is unknown.
        state: args.type === "test:index:Source" ? {} : args.inputs,
      }),
      call: (args) => args.inputs,
    },
    project,
    stack,
    preview === "true",
  );
  const exported = require(moduleName)[exportName];
  new exported(resourceName, revive(JSON.parse(argsJson)));
}
`;

/** Runs `new <exportName>(resourceName, args)` from the installed package under mocks, in a child process. */
export async function captureRegistration(
  project: ConsumerProject,
  exportName: string,
  resourceName: string,
  args: Props,
  options: { preview?: boolean } = {},
): Promise<Registration> {
  const identity = CONSUMER_IDENTITY;
  const captured = JSON.parse(
    await runResourceProgram(
      project,
      "registration",
      PROGRAM,
      { exportName, resourceName, args },
      identity,
      [String(options.preview === true)],
    ),
  ) as Pick<Registration, "type" | "name" | "wire" | "additionalSecretOutputs">;
  const secretPaths: string[] = [];
  return {
    ...captured,
    inputs: unmarked(captured.wire, [], secretPaths) as Props,
    secretPaths,
    urn: urnOf(identity, captured.type, captured.name),
  };
}

const isSecret = (value: unknown): value is { value: unknown } =>
  typeof value === "object" && value !== null && (value as Props)[SECRET_KEY] === SECRET_SIGNATURE;

const isObject = (value: unknown): value is Props =>
  typeof value === "object" && value !== null && !Array.isArray(value) && !isSecret(value);

function unmarked(value: unknown, path: string[], secretPaths: string[]): unknown {
  if (isSecret(value)) {
    secretPaths.push(path.join("."));
    return unmarked(value.value, path, []);
  }
  if (Array.isArray(value))
    return value.map((item, index) => unmarked(item, [...path, String(index)], secretPaths));
  if (isObject(value))
    return Object.fromEntries(
      Object.entries(value).map(([key, item]) => [
        key,
        unmarked(item, [...path, key], secretPaths),
      ]),
    );
  return value;
}

const containsSecret = (value: unknown): boolean =>
  isSecret(value) ||
  (Array.isArray(value) && value.some(containsSecret)) ||
  (isObject(value) && Object.values(value).some(containsSecret));

const secret = (value: unknown) => ({ [SECRET_KEY]: SECRET_SIGNATURE, value });

/**
 * The engine's `annotateSecrets(outs, ins)`: a returned property gets the
 * secret mark where the registered input of the same name (recursing into
 * objects on both sides) holds a secret.
 */
export function annotateSecrets(outs: Props, ins: Props): Props {
  const marked: Props = { ...outs };
  for (const [key, inValue] of Object.entries(ins)) {
    if (!(key in marked)) continue;
    const outValue = marked[key];
    if (isObject(outValue) && isObject(inValue)) marked[key] = annotateSecrets(outValue, inValue);
    else if (!isSecret(outValue) && containsSecret(inValue)) marked[key] = secret(outValue);
  }
  return marked;
}

/**
 * The state the engine writes for a provider's reply (check inputs, or
 * create/read/update outputs): secret marks put back, `additionalSecretOutputs`
 * applied to outputs, and every secret value replaced by ciphertext as the
 * secrets manager does. What is left is stored in plaintext.
 */
export function stateAsStored(
  reply: Props,
  registration: Registration,
  kind: "inputs" | "outputs",
): string {
  let marked = annotateSecrets(reply, registration.wire);
  if (kind === "outputs")
    for (const name of registration.additionalSecretOutputs)
      if (name in marked && !isSecret(marked[name]))
        marked = { ...marked, [name]: secret(marked[name]) };
  return JSON.stringify(encrypted(marked));
}

function encrypted(value: unknown): unknown {
  if (isSecret(value)) return { [SECRET_KEY]: SECRET_SIGNATURE, ciphertext: "AAAA" };
  if (Array.isArray(value)) return value.map(encrypted);
  if (isObject(value))
    return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, encrypted(item)]));
  return value;
}
