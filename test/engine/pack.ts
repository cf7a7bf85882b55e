/**
 * `npm pack` of the built repository, as users install it. Apart from the
 * engine harness (which loads the SDK's gRPC stubs) so the test runner can
 * pack once without loading them.
 */
import { execFileSync } from "node:child_process";
import { join, resolve } from "node:path";

const REPOSITORY = resolve(__dirname, "..", "..", "..");

/** `npm pack` of the built repository into `destination`; the tarball's path. */
export function packRepository(destination: string): string {
  const packed = JSON.parse(
    execFileSync("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", destination], {
      cwd: REPOSITORY,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    }),
  ) as Array<{ filename: string }>;
  return join(destination, packed[0]!.filename);
}
