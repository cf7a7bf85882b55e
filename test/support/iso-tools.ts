/**
 * Drives the real ISO readers Debian ships (installed by test/setup-host.sh):
 * isoinfo (genisoimage), xorriso, bsdtar (libarchive) and 7z. A missing tool
 * fails the test with the command that installs it; nothing is skipped.
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";

export type ReaderName = "xorriso" | "bsdtar" | "7z";

const PACKAGE_OF: Record<string, string> = {
  isoinfo: "genisoimage",
  genisoimage: "genisoimage",
  xorriso: "xorriso",
  bsdtar: "libarchive-tools",
  "7z": "p7zip-full",
};

export function run(
  command: string,
  args: string[],
  options: { input?: Buffer; env?: NodeJS.ProcessEnv } = {},
): Buffer {
  try {
    return execFileSync(command, args, {
      input: options.input,
      env: options.env ?? { ...process.env, LC_ALL: "C.UTF-8" },
      maxBuffer: 256 * 1024 * 1024,
      stdio: ["pipe", "pipe", "pipe"],
    });
  } catch (error) {
    const err = error as NodeJS.ErrnoException & { stderr?: Buffer; status?: number };
    if (err.code === "ENOENT")
      throw new Error(
        `${command} is not installed: run "bash test/setup-host.sh" (Debian package ${PACKAGE_OF[command] ?? command})`,
      );
    throw new Error(
      `${command} ${args.join(" ")} failed (exit ${err.status}): ${err.stderr?.toString() ?? err.message}`,
    );
  }
}

/** A scratch directory removed by the returned function. */
export function scratchDir(prefix: string): { dir: string; remove: () => void } {
  const dir = mkdtempSync(join(tmpdir(), `${prefix}-`));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

export function writeImage(dir: string, image: Buffer, name = "image.iso"): string {
  const path = join(dir, name);
  writeFileSync(path, image);
  return path;
}

export function extractWith(
  reader: ReaderName,
  isoPath: string,
  into: string,
): Map<string, Buffer> {
  switch (reader) {
    case "xorriso":
      run("xorriso", ["-osirrox", "on", "-indev", isoPath, "-extract", "/", into]);
      break;
    case "bsdtar":
      run("bsdtar", ["-xf", isoPath, "-C", into]);
      break;
    case "7z":
      run("7z", ["x", "-y", `-o${into}`, isoPath]);
      break;
  }
  return readTree(into);
}

/** Every regular file under `root`, keyed by its slash-separated relative path. */
export function readTree(root: string): Map<string, Buffer> {
  const files = new Map<string, Buffer>();
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir)) {
      const path = join(dir, entry);
      if (statSync(path).isDirectory()) walk(path);
      else files.set(relative(root, path).split("\\").join("/"), readFileSync(path));
    }
  };
  walk(root);
  return files;
}

export interface ListedEntry {
  path: string;
  size: number;
  isDirectory: boolean;
}

/**
 * `isoinfo -l` with the given tree selector ("" primary, "-J" Joliet, "-R" Rock
 * Ridge). Joliet names come out as ISO 8859-1, so callers compare those only
 * for names inside Latin-1.
 */
export function listWithIsoinfo(isoPath: string, tree: "" | "-J" | "-R"): ListedEntry[] {
  const args = ["-l", "-i", isoPath];
  if (tree === "-J") args.unshift("-J", "-j", "iso8859-1");
  if (tree === "-R") args.unshift("-R");
  const text = run("isoinfo", args).toString(tree === "-J" ? "latin1" : "utf8");
  const entries: ListedEntry[] = [];
  let directory = "/";
  for (const line of text.split("\n")) {
    const heading = /^Directory listing of (.*)$/.exec(line);
    if (heading) {
      directory = heading[1];
      continue;
    }
    const match =
      /^([d-])\S{9}\s+\d+\s+\d+\s+\d+\s+(\d+)\s+\w{3}\s+\d+\s+\d{4}\s+\[\s*\d+\s+\d+\]\s\s(.*) $/.exec(
        line,
      );
    if (!match || match[3] === "." || match[3] === "..") continue;
    entries.push({
      path: `${directory}${match[3]}`.slice(1),
      size: Number(match[2]),
      isDirectory: match[1] === "d",
    });
  }
  return entries;
}

/** One file's bytes as `isoinfo -R -x` reads them. */
export function readFileWithIsoinfo(isoPath: string, path: string): Buffer {
  return run("isoinfo", ["-R", "-x", `/${path}`, "-i", isoPath]);
}
