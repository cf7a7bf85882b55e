/**
 * Progress lines that reach the user's `pulumi up` output from inside a
 * dynamic provider. The Node dynamic-provider server is started with the
 * engine's address as its first argument but never connects to it, so
 * `pulumi.log` goes nowhere there; this sends the engine's own Log RPC.
 * Fire and forget, with a deadline: a slow engine must not slow a create.
 */
/* eslint-disable @typescript-eslint/no-require-imports -- loaded lazily, and only inside a provider process */
import { dirname } from "node:path";
import { redactText } from "./redact";

type EngineClient = {
  log(request: unknown, options: { deadline: number }, callback: (error: unknown) => void): void;
  close(): void;
};

let client: EngineClient | null | undefined;

/** The engine address when this process is Pulumi's Node dynamic-provider server, else undefined. */
export function engineAddressOfThisProcess(
  argv: readonly string[] = process.argv,
): string | undefined {
  const entry = argv[1] ?? "";
  const address = argv[2];
  if (!/cmd[\\/]dynamic-provider([\\/]index(\.js)?)?$/.test(entry)) return undefined;
  return address !== undefined && /^[^\s]+:\d+$/.test(address) ? address : undefined;
}

function engine(): EngineClient | null {
  if (client !== undefined) return client;
  const address = engineAddressOfThisProcess();
  if (address === undefined) return (client = null);
  try {
    // @grpc/grpc-js is @pulumi/pulumi's own dependency: resolve it from there, not from us.
    const pulumiDir = dirname(require.resolve("@pulumi/pulumi/package.json"));
    const grpc = require(require.resolve("@grpc/grpc-js", { paths: [pulumiDir] }));
    const rpc = require("@pulumi/pulumi/proto/engine_grpc_pb");
    client = new rpc.EngineClient(address, grpc.credentials.createInsecure()) as EngineClient;
  } catch {
    client = null;
  }
  return client;
}

export type LogSeverityName = "debug" | "info" | "warning" | "error";
const SEVERITY: Record<LogSeverityName, number> = { debug: 0, info: 1, warning: 2, error: 3 };

/** Sends one line to the engine (redacted); does nothing outside a provider process. */
export function logToEngine(
  message: string,
  severity: LogSeverityName = "info",
  ephemeral = false,
): void {
  const engineClient = engine();
  if (engineClient === null) return;
  const { LogRequest } = require("@pulumi/pulumi/proto/engine_pb");
  const request = new LogRequest()
    .setSeverity(SEVERITY[severity])
    .setMessage(redactText(message))
    .setEphemeral(ephemeral);
  engineClient.log(request, { deadline: Date.now() + 5000 }, () => undefined);
}
