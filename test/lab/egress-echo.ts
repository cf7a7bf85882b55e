/**
 * The lab's echo service, run inside the lab network namespace by
 * engine/kvm-egress-rotate.test.ts: answers with the caller's address (plain text at /, JSON at
 * /json) on two ports of one address. The test puts a SNAT rule in front of
 * the second, so every proxy reaching it looks like one site behind one NAT
 * address. Prints `{"direct":<port>,"nat":<port>}` once both listen.
 */
import { startEchoServer } from "../support/forward-proxy";

async function main(): Promise<void> {
  const host = process.argv[2];
  if (host === undefined) throw new Error("usage: egress-echo <address>");
  const [direct, nat] = await Promise.all([startEchoServer(host), startEchoServer(host)]);
  process.stdout.write(`${JSON.stringify({ direct: direct!.port, nat: nat!.port })}\n`);
  process.on("SIGTERM", () => process.exit(0));
}

main().catch((error: unknown) => {
  process.stderr.write(`egress-echo: ${(error as Error).message}\n`);
  process.exit(1);
});
