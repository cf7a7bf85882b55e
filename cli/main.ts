#!/usr/bin/env node
/**
 * egress-proxies: the package's command line. Subcommands:
 *   doctor   is this hypervisor ready for KvmProxy? (and --fix the standard set-up)
 */
import { doctor, DOCTOR_USAGE } from "./doctor/command";

const USAGE = `usage: egress-proxies <command> [options]
commands:
  doctor   check the KVM hosts of a stack config (or one host) and optionally --fix them

${DOCTOR_USAGE}`;

const commands: Record<string, (argv: string[]) => Promise<number>> = {
  doctor: (argv) =>
    doctor(argv, {
      out: (text) => process.stdout.write(`${text}\n`),
      err: (text) => process.stderr.write(`${text}\n`),
    }),
};

export async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
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
