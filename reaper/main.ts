#!/usr/bin/env node
/**
 * egress-reaper: finds VMs, volumes and seeds that carry the egress-proxies
 * mark but that no given stack state references, and (with --apply) removes
 * them. Dry run by default. See docs/reaper.md.
 */
import { parseArgs } from "node:util";
import { versionText } from "../provider/common/version";
import { ConfigError, loadConfig } from "./config";
import { parseDuration } from "./plan";
import { EXIT, runSweep } from "./sweep";

const USAGE = `usage: egress-reaper --config <file.json> [--apply] [--json] [--min-age 1h] [--prune-images] [--project <name>]
       egress-reaper --version [--verbose]`;

export async function main(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        config: { type: "string", short: "c" },
        apply: { type: "boolean", default: false },
        json: { type: "boolean", default: false },
        "min-age": { type: "string", default: "1h" },
        "prune-images": { type: "boolean", default: false },
        project: { type: "string" },
        help: { type: "boolean", short: "h", default: false },
        version: { type: "boolean", short: "V", default: false },
        verbose: { type: "boolean", default: false },
      },
      strict: true,
    }));
  } catch (error) {
    process.stderr.write(`egress-reaper: ${(error as Error).message}\n${USAGE}\n`);
    return EXIT.usage;
  }
  if (values.version) {
    process.stdout.write(`${versionText("egress-reaper", values.verbose)}\n`);
    return EXIT.ok;
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    return EXIT.ok;
  }
  if (values.config === undefined) {
    process.stderr.write(`egress-reaper: --config is required\n${USAGE}\n`);
    return EXIT.usage;
  }
  const minAgeMs = parseDuration(values["min-age"]);
  if (minAgeMs === undefined) {
    process.stderr.write(
      `egress-reaper: --min-age ${JSON.stringify(values["min-age"])} is not a duration; write e.g. 90m, 1h or 2d\n`,
    );
    return EXIT.usage;
  }
  let config;
  try {
    config = loadConfig(values.config);
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    process.stderr.write(`egress-reaper: ${error.message}\n`);
    return EXIT.usage;
  }
  return runSweep(
    config,
    {
      apply: values.apply,
      json: values.json,
      minAgeMs,
      pruneImages: values["prune-images"],
      ...(values.project === undefined ? {} : { project: values.project }),
    },
    {
      out: (text) => process.stdout.write(`${text}\n`),
      err: (text) => process.stderr.write(`${text}\n`),
    },
  );
}

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (status) => {
      process.exitCode = status;
    },
    (error: unknown) => {
      process.stderr.write(`egress-reaper: ${(error as Error).message}\n`);
      process.exitCode = EXIT.incomplete;
    },
  );
}
