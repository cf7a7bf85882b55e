/**
 * Which quick suites the floor run (test/floor/run.sh: the lowest claimed
 * Node.js major and SDKs) reruns, decided from each compiled spec's require
 * closure: every module it requires, transitively, through relative requires
 * and the package's own name, across dist/ (test code and product code).
 *
 * A spec reruns on the floor when that closure reaches something whose
 * behaviour differs between the floor and the newest versions:
 *
 * - a floor-pinned or version-sensitive package: `@pulumi/*` (the SDKs the
 *   floor pins), `@grpc/*` and `google-protobuf` (the SDK's wire), `ssh2`,
 *   `undici` (they lean on Node's sockets, streams and crypto);
 * - a Node.js builtin whose behaviour changes between majors: streams,
 *   sockets and HTTP (`net`, `tls`, `http`, `https`, `http2`, `dgram`,
 *   `dns`, `stream`), `zlib` (the bundled zlib's output), `child_process`
 *   (what a spec spawns, e.g. the CLI, runs on the floor Node and its own
 *   requires are out of sight), `worker_threads`, `inspector`, `vm` (the
 *   SDK's closure serialization).
 *
 * Not `crypto`: the specs use it for digests and random bytes, stable across
 * majors (TLS, which is not, comes in through `tls`/`https`).
 *
 * Builtins count only in our code (dist/ outside test/): a test's own plumbing
 * (spawning xmllint or cloud-init's parser, an HTTP fixture, reading an ISO)
 * runs the same on every major, and what the test proves about our code on the
 * floor Node is in our code's closure. A bin of ours that a test spawns
 * (`"cli", "main.js"`) runs on the floor Node, so its closure counts as if
 * required. A package's `package.json` is metadata (a version for
 * `--version`), not its behaviour. Packages count on both sides: a test that
 * drives the SDK or ssh2's server exercises them on the floor versions.
 *
 * The rest (pure builders: XML, the ISO writer, zod schemas, names, plans,
 * XDR codecs over Buffers, using only fs, path, os, assert, util, events,
 * timers and the like) prove the same thing on every Node major; the main
 * run proves them on the current LTS.
 */
import { existsSync, readFileSync } from "node:fs";
import { builtinModules } from "node:module";
import { dirname, join, resolve } from "node:path";

/** Packages that are pinned at the floor or whose behaviour rides on Node's I/O. */
export const FLOOR_PACKAGES = [/^@pulumi\//, /^@grpc\//, /^google-protobuf$/, /^ssh2$/, /^undici$/];

/** Node.js builtins whose behaviour changes between majors. */
export const FLOOR_BUILTINS = new Set([
  "net",
  "tls",
  "http",
  "https",
  "http2",
  "dgram",
  "dns",
  "stream",
  "zlib",
  "child_process",
  "worker_threads",
  "inspector",
  "vm",
]);

const REQUIRE = /require\("([^"]+)"\)/g;
/** A test that names one of the package's bins (`resolve(__dirname, ..., "cli", "main.js")`) to spawn it. */
const SPAWNED_BIN = /"(cli|reaper)", "main\.js"/g;
const BUILTINS = new Set(builtinModules);

export interface FloorChoice {
  /** The spec's path, as given. */
  path: string;
  /** Whether the floor run reruns it. */
  floor: boolean;
  /** What it reaches that differs between versions (e.g. `@pulumi/pulumi via engine/harness.js`), or why not. */
  reason: string;
}

/** The top module of a require: `node:stream/promises` -> `stream`, `@pulumi/pulumi/x` -> `@pulumi/pulumi`. */
function moduleName(target: string): string {
  const bare = target.startsWith("node:") ? target.slice(5) : target;
  const parts = bare.split("/");
  return bare.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0]!;
}

/**
 * Whether the spec at `path` reruns on the floor, and why: the first
 * version-sensitive module its require closure under `distDir` reaches.
 * `packageName` (the package's own name) resolves to `packageMain` in dist.
 */
export function floorChoice(
  path: string,
  distDir: string,
  packageName: string,
  packageMain: string,
): FloorChoice {
  const seen = new Set<string>();
  const root = resolve(distDir);
  const queue: Array<{ file: string; via: string }> = [{ file: resolve(path), via: "" }];
  const builtinsUsed = new Set<string>();
  while (queue.length > 0) {
    const { file, via } = queue.shift()!;
    if (seen.has(file)) continue;
    seen.add(file);
    const here = file.slice(root.length + 1);
    const where = via === "" ? "" : ` via ${via}`;
    const source = readFileSync(file, "utf8");
    const testSide = here.startsWith("test/");
    // A bin of ours that a test spawns runs on the floor Node: it is in the closure as if required.
    if (testSide)
      for (const [, bin] of source.matchAll(SPAWNED_BIN)) {
        const main = join(root, bin!, "main.js");
        if (existsSync(main)) queue.push({ file: main, via: via || here });
      }
    for (const [, target] of source.matchAll(REQUIRE)) {
      // A package's manifest is metadata (a version read for --version), not its behaviour.
      if (target!.endsWith("/package.json")) continue;
      const name = moduleName(target!);
      if (target!.startsWith(".")) {
        const required = resolve(dirname(file), target!);
        const candidates = [required, `${required}.js`, join(required, "index.js")];
        const found = candidates.find((c) => c.endsWith(".js") && existsSync(c));
        if (found && found.startsWith(root)) queue.push({ file: found, via: via || here });
        continue;
      }
      if (name === packageName) {
        const main = resolve(root, "..", packageMain);
        if (existsSync(main)) queue.push({ file: main, via: via || here });
        continue;
      }
      const sensitivePackage = FLOOR_PACKAGES.some((pattern) => pattern.test(name));
      // The test's own plumbing (spawning xmllint, serving a fixture over HTTP, reading an ISO) runs the
      // same on every major; what it proves about our code on the floor Node is in our code's closure.
      const sensitiveBuiltin = !testSide && BUILTINS.has(name) && FLOOR_BUILTINS.has(name);
      if (sensitivePackage || sensitiveBuiltin)
        return {
          path,
          floor: true,
          reason: `${sensitivePackage ? "" : "node:"}${name} in ${here}${where}`,
        };
      if (BUILTINS.has(name)) builtinsUsed.add(name);
    }
  }
  const used = [...builtinsUsed].sort();
  return {
    path,
    floor: false,
    reason: `pure: ${seen.size} module(s), no SDK, ssh2, undici or version-sensitive builtin${
      used.length > 0 ? ` (uses only ${used.join(", ")})` : ""
    }`,
  };
}
