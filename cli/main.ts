#!/usr/bin/env node
/**
 * egress-proxies: the package's command line. Subcommands:
 *   doctor   is this hypervisor ready for KvmProxy? (and --fix the standard set-up)
 *   check    are the proxies up, and which egress address does each give?
 *   gateway-metrics   the pool's gateway's requests per member and per user, for Prometheus
 */
import { versionText } from "../provider/common/version";
import { check, CHECK_USAGE } from "./check/command";
import { doctor, DOCTOR_USAGE } from "./doctor/command";
import { gatewayMetrics, GATEWAY_METRICS_USAGE } from "./gateway-metrics/command";

const USAGE = `usage: egress-proxies <command> [options]
       egress-proxies --version [--verbose]
commands:
  doctor   check the KVM hosts of a stack config (or one host) and optionally --fix them
  check    probe every proxy of a stack (HTTP, CONNECT, egress address); table, --json, --prometheus
  gateway-metrics  count the gateway's requests per member and per user from squid's log; /metrics

${DOCTOR_USAGE}

${CHECK_USAGE}

${GATEWAY_METRICS_USAGE}`;

const commands: Record<string, (argv: string[]) => Promise<number>> = {
  doctor: (argv) =>
    doctor(argv, {
      out: (text) => process.stdout.write(`${text}\n`),
      err: (text) => process.stderr.write(`${text}\n`),
      ...(process.stdout.isTTY && process.stdout.columns > 0
        ? { columns: process.stdout.columns }
        : {}),
    }),
  check: (argv) =>
    check(argv, {
      out: (text) => process.stdout.write(`${text}\n`),
      err: (text) => process.stderr.write(`${text}\n`),
      readStdin,
      stdinIsTerminal: process.stdin.isTTY === true,
      env: process.env,
      stopSignal,
    }),
  "gateway-metrics": (argv) =>
    gatewayMetrics(argv, {
      out: (text) => process.stdout.write(`${text}\n`),
      err: (text) => process.stderr.write(`${text}\n`),
      stopSignal,
    }),
};

/** Fires on the first SIGTERM or SIGINT; a second one of either ends the process at once. */
function stopSignal(): AbortSignal {
  const controller = new AbortController();
  for (const name of ["SIGTERM", "SIGINT"] as const)
    process.on(name, () => {
      if (controller.signal.aborted) process.exit(128 + (name === "SIGTERM" ? 15 : 2));
      controller.abort();
    });
  return controller.signal;
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (name === "--version" || name === "-V") {
    const extra = rest.filter((arg) => arg !== "--verbose");
    if (extra.length > 0) {
      process.stderr.write(
        `egress-proxies: --version takes only --verbose, not ${extra.join(" ")}\n`,
      );
      return 2;
    }
    process.stdout.write(`${versionText("egress-proxies", rest.includes("--verbose"))}\n`);
    return 0;
  }
  if (name === undefined || name === "help" || name === "--help" || name === "-h") {
    (name === undefined ? process.stderr : process.stdout).write(`${USAGE}\n`);
    return name === undefined ? 2 : 0;
  }
  const command = commands[name];
  if (command === undefined) {
    process.stderr.write(`egress-proxies: unknown command ${JSON.stringify(name)}\n${USAGE}\n`);
    return 2;
  }
  return command(rest);
}

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (status) => {
      process.exitCode = status;
    },
    (error: unknown) => {
      process.stderr.write(`egress-proxies: ${(error as Error).message}\n`);
      process.exitCode = 1;
    },
  );
}
