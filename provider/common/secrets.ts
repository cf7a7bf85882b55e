/**
 * The one definition of which inputs are secret, for KvmProxy and ProxmoxProxy
 * alike, and how a resource class registers them so that no plaintext of them
 * reaches state.
 *
 * How Pulumi keeps them secret (docs/pulumi.md, "Secrets"): the engine strips the
 * secret marks before it calls a dynamic provider, then puts them back on what
 * check, create, read and update return wherever the returned property has the
 * same name (and, inside objects, the same path) as a secret input.
 * Outputs derived from a secret under another name need
 * `additionalSecretOutputs`; a provider cannot return `pulumi.secret()` itself.
 */
import * as pulumi from "@pulumi/pulumi";

/** Inputs that always hold a secret: credentials and cloud-init. Dotted paths; `*` is every item of a list. */
export const SECRET_INPUT_PATHS = [
  "connection.privateKey",
  "connection.passphrase",
  "connection.proxyJump.*.privateKey",
  "connection.proxyJump.*.passphrase",
  "apiToken",
  "userData",
  "userDataBase64",
  "vendorData",
  "networkConfig",
  // The files user-data writes (a password file among them).
  "guestFiles.files",
  // A hash of the rest of the user-data: kept with it.
  "guestFiles.userDataIdentity",
  "egressCheck.proxyAuth.password",
] as const;

/** URL inputs: secret when they carry userinfo (`user:password@`). */
export const URL_INPUT_PATHS = [
  "image.url",
  "readiness.probeUrl",
  "egressCheck.url",
  "egressCheck.ipv6Url",
  "apiEndpoint",
  "url",
] as const;

/** Outputs computed from secret inputs under a name of their own. */
const DERIVED_SECRET_OUTPUTS = ["seedSha256"] as const;

/** True when the text is a URL with a user name or password in it. */
export function hasUserinfo(text: string): boolean {
  try {
    const url = new URL(text);
    return url.username !== "" || url.password !== "";
  } catch {
    // Not a URL we can parse: an "@" before the host part may still be userinfo.
    return /^[a-z][a-z0-9+.-]*:\/\/[^/?#]*@/i.test(text);
  }
}

/**
 * The `additionalSecretOutputs` of a resource whose inputs are `inputNames`:
 * every top-level output that holds a secret input anywhere inside it (the
 * whole `connection` output, not only its key), plus derived outputs.
 */
export function secretOutputNames(inputNames: readonly string[]): string[] {
  const names = new Set<string>(DERIVED_SECRET_OUTPUTS);
  for (const path of SECRET_INPUT_PATHS) names.add(path.split(".")[0]);
  return [...names].filter(
    (name) =>
      inputNames.includes(name) || (DERIVED_SECRET_OUTPUTS as readonly string[]).includes(name),
  );
}

type Args = Record<string, unknown>;

const isPlainObject = (value: unknown): value is Args =>
  typeof value === "object" &&
  value !== null &&
  !Array.isArray(value) &&
  !pulumi.Output.isInstance(value) &&
  typeof (value as { then?: unknown }).then !== "function";

const secretIfUserinfo = (url: unknown): unknown =>
  typeof url === "string" && hasUserinfo(url) ? pulumi.secret(url) : url;

/**
 * `args` with every secret input wrapped in `pulumi.secret`, leaf by leaf: a
 * known `connection.host` stays plain and known, so a private key that is
 * unknown at preview does not make the whole connection unknown (which would
 * show a replacement). Where a parent is itself an Output or a Promise, its
 * inside cannot be reached before it resolves: the whole parent is made
 * secret (always-secret paths) or made secret once resolved if its URL
 * carries userinfo.
 */
export function withSecretInputs<T extends object>(args: T): T {
  let result: Args = { ...(args as Args) };
  for (const path of SECRET_INPUT_PATHS)
    result = mapAtPath(result, path.split("."), (value) => pulumi.secret(value), true);
  for (const path of URL_INPUT_PATHS)
    result = mapAtPath(result, path.split("."), secretIfUserinfo, false);
  return result as T;
}

function mapAtPath(
  args: Args,
  path: string[],
  wrap: (value: unknown) => unknown,
  alwaysSecret: boolean,
): Args {
  const [key, ...rest] = path;
  const value = args[key];
  if (value === undefined || value === null) return args;
  if (rest.length === 0) {
    if (alwaysSecret || isPlainObject(value) || typeof value === "string")
      return { ...args, [key]: wrap(value) };
    return { ...args, [key]: pulumi.output(value).apply((resolved) => wrap(resolved)) };
  }
  if (isPlainObject(value)) return { ...args, [key]: mapAtPath(value, rest, wrap, alwaysSecret) };
  if (rest[0] === "*" && typeof value === "string") return args; // the one-line form holds no secret
  if (rest[0] === "*" && Array.isArray(value)) {
    // Items given as text (`"admin@bastion"`) hold no secret; objects are walked like any other.
    const items = value.map((item: unknown) =>
      isPlainObject(item)
        ? mapAtPath({ item }, ["item", ...rest.slice(1)], wrap, alwaysSecret).item
        : typeof item === "string" || !alwaysSecret
          ? item
          : pulumi.secret(item),
    );
    return { ...args, [key]: items };
  }
  if (alwaysSecret) return { ...args, [key]: pulumi.secret(value) };
  return {
    ...args,
    [key]: pulumi.output(value as pulumi.Input<Args>).apply((resolved) => {
      const leaf = leafAt(resolved, rest);
      return typeof leaf === "string" && hasUserinfo(leaf) ? pulumi.secret(resolved) : resolved;
    }),
  };
}

function leafAt(value: unknown, path: string[]): unknown {
  return path.reduce<unknown>(
    (inner, key) => (isPlainObject(inner) ? inner[key] : undefined),
    value,
  );
}
