/**
 * The parts of ssh2 this package runs, each loaded from its own file: the
 * client, the key parser, and the modules that say what ssh2 decided about
 * its crypto (ciphers.ts).
 *
 * `require("ssh2")` also loads ssh2's server, its HTTP agents and its key
 * generator: 3.5 MB of resident memory in every process that dials (60 MB
 * with the SSH layer loaded instead of 63.5, Node 26), for code nothing
 * here runs; on the upload's 80 MB memory budget that was the
 * margin. ssh2's package has no `exports` map, so its files are reachable
 * from its main module; should a release move one, the package root is
 * loaded instead, which only costs that memory again.
 */
/* eslint-disable @typescript-eslint/no-require-imports -- ssh2's own files, found at run time */
import { createRequire } from "node:module";
import type * as Ssh2 from "ssh2";

/** One of ssh2's own modules, by its path from ssh2's `lib/`; throws when this ssh2 has no such file. */
export function ssh2File(pathFromLib: string): unknown {
  return createRequire(require.resolve("ssh2"))(pathFromLib);
}

function fromOwnFile<T>(
  pathFromLib: string,
  pick: (loaded: unknown) => unknown,
  fromRoot: () => T,
): T {
  try {
    const part = pick(ssh2File(pathFromLib));
    if (typeof part === "function") return part as T;
  } catch {
    // moved or renamed in this ssh2: the package root has it
  }
  return fromRoot();
}

const ssh2Root = (): typeof Ssh2 => require("ssh2") as typeof Ssh2;

/** ssh2's Client class (`require("ssh2").Client`). */
export const Ssh2Client: typeof Ssh2.Client = fromOwnFile(
  "./client.js",
  (loaded) => loaded,
  () => ssh2Root().Client,
);

/** ssh2's key parser (`require("ssh2").utils.parseKey`). */
export const parseSshKey: typeof Ssh2.utils.parseKey = fromOwnFile(
  "./protocol/keyParser.js",
  (loaded) => (loaded as { parseKey?: unknown } | null)?.parseKey,
  () => ssh2Root().utils.parseKey,
);
