/** Prometheus's own parser and linter on a text exposition: `promtool check metrics`. */
import { spawn } from "node:child_process";

export function promtool(text: string): Promise<{ status: number; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn("promtool", ["check", "metrics"], { stdio: ["pipe", "pipe", "pipe"] });
    let output = "";
    child.stdout.on("data", (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (output += chunk.toString()));
    child.on("error", reject);
    child.on("close", (status) => resolve({ status: status ?? -1, output }));
    child.stdin.end(text);
  });
}

/** Fails loudly when promtool is not installed: the tests that read metrics with it never skip. */
export async function assertPromtoolInstalled(): Promise<void> {
  const { status } = await promtool("# HELP x A probe.\n# TYPE x gauge\nx 1\n").catch(() => ({
    status: -1,
  }));
  if (status !== 0)
    throw new Error("promtool is missing: run test/setup-host.sh (Debian package prometheus)");
}
