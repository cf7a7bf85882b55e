/** Recorded in ownership marks; a unit test keeps it equal to package.json's version. */
export const packageVersion = "0.1.0";

/**
 * What `--version` prints for a program of this package: the package version,
 * and with `verbose` the runtime and the Pulumi SDK it would load (a peer
 * dependency: the user's copy, so it can differ from the one we test with).
 */
export function versionText(
  program: string,
  verbose: boolean,
  sdkVersion: () => string | undefined = pulumiSdkVersion,
): string {
  const lines = [`${program} ${packageVersion}`];
  if (verbose)
    lines.push(
      `Node.js ${process.versions.node}`,
      `@pulumi/pulumi ${sdkVersion() ?? "not installed (npm install @pulumi/pulumi)"}`,
    );
  return lines.join("\n");
}

/** The version of the @pulumi/pulumi this process resolves, read from its package.json. */
export function pulumiSdkVersion(): string | undefined {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const manifest = require("@pulumi/pulumi/package.json") as { version?: unknown };
    return typeof manifest.version === "string" ? manifest.version : undefined;
  } catch {
    return undefined;
  }
}
