/**
 * Everything a reader needs is in the repository: comments and docs cite only
 * files that ship with it, every path they name exists, and the Proxmox labels
 * (Fn, rule n) that comments use are defined in docs/proxmox.md, section 9.
 * Reads the sources (not dist/), so it fails on the comment itself.
 */
import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";

const REPOSITORY = resolve(__dirname, "..", "..", "..");
const ROOTS = ["provider", "components", "reaper", "cli", "test", "docs", "examples"];
const ROOT_FILES = ["index.ts", "README.md"];
const EXTENSIONS = /\.(ts|sh|md)$/;
const SKIP_DIRS = new Set(["node_modules", "dist", "data"]);

function sourceFiles(): string[] {
  const files: string[] = ROOT_FILES.map((name) => join(REPOSITORY, name));
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir)) {
      const path = join(dir, entry);
      if (statSync(path).isDirectory()) {
        if (!SKIP_DIRS.has(entry)) walk(path);
      } else if (EXTENSIONS.test(entry)) files.push(path);
    }
  };
  for (const root of ROOTS) walk(join(REPOSITORY, root));
  return files;
}

const files = sourceFiles().map((path) => ({
  path,
  name: relative(REPOSITORY, path),
  text: readFileSync(path, "utf8"),
}));

/** Lines matching `pattern`, as `file:line: text`. */
function hits(pattern: RegExp, only: (name: string) => boolean = () => true): string[] {
  const found: string[] = [];
  for (const file of files) {
    if (!only(file.name)) continue;
    file.text.split("\n").forEach((line, index) => {
      if (pattern.test(line)) found.push(`${file.name}:${index + 1}: ${line.trim()}`);
    });
  }
  return found;
}

describe("the repository is self-contained for a reader", () => {
  it("scans the sources (the check can see something)", () => {
    assert.ok(files.length > 100, `only ${files.length} files found under ${REPOSITORY}`);
    assert.ok(files.some((file) => file.name === "provider/proxmox/provider.ts"));
  });

  it("no comment or doc cites design files that are not part of the project", () => {
    // Built from pieces so this file does not match itself.
    const outside = new RegExp(
      [
        ["shared", "design"].join("/"),
        ["proxmox", "facts"].join("-"),
        ["pulumi", "dynamic\\.md"].join("-"),
        ["libvirt", "protocol\\.md"].join("-"),
        ["\\bBRIEF", "\\b"].join(""),
        ["\\blab", "\\.md\\b"].join(""),
        ["STYLE", "\\.md"].join(""),
      ].join("|"),
    );
    assert.deepEqual(hits(outside), []);
  });

  it("every repository path named in comments and docs exists", () => {
    const path =
      /(?<![\w./-])((?:provider|components|reaper|cli|docs|examples|test)\/[\w./-]+\.(?:ts|md|sh|json|yaml|py))\b/g;
    const missing: string[] = [];
    for (const file of files)
      for (const match of file.text.matchAll(path)) {
        const named = match[1];
        if (!existsSync(join(REPOSITORY, named)) && !existsSync(join(dirname(file.path), named)))
          missing.push(`${file.name} names ${named}`);
      }
    assert.deepEqual(missing, []);
  });

  describe("Proxmox labels", () => {
    const doc = readFileSync(join(REPOSITORY, "docs", "proxmox.md"), "utf8");
    const section = doc.slice(doc.indexOf("## 9. Proxmox VE behaviours we rely on"));
    const facts = new Set([...section.matchAll(/^- \*\*(F\d+) —/gm)].map((m) => m[1]));
    const rules = new Set(
      [...section.slice(section.indexOf("### How we answer them")).matchAll(/^(\d+)\. /gm)].map(
        (m) => Number(m[1]),
      ),
    );
    const citing = files.filter((file) => file.name !== "docs/proxmox.md");

    it("docs/proxmox.md defines F1–F23 and rules 1–13", () => {
      for (let n = 1; n <= 23; n++) assert.ok(facts.has(`F${n}`), `F${n} is not defined`);
      for (let n = 1; n <= 13; n++) assert.ok(rules.has(n), `rule ${n} is not defined`);
    });

    it("every Fn and rule n cited is defined there, and the citing file says where", () => {
      const problems: string[] = [];
      for (const file of citing) {
        const cited = [...file.text.matchAll(/\b(F\d{1,2})\b/g)].map((m) => m[1]);
        const citedRules = [...file.text.matchAll(/\brule (\d+)\b/gi)].map((m) => Number(m[1]));
        for (const fact of cited)
          if (!facts.has(fact)) problems.push(`${file.name} cites ${fact}, not in docs/proxmox.md`);
        for (const rule of citedRules)
          if (!rules.has(rule)) problems.push(`${file.name} cites rule ${rule}, not defined`);
        if ((cited.length > 0 || citedRules.length > 0) && !file.text.includes("docs/proxmox.md"))
          problems.push(`${file.name} cites Proxmox labels without pointing at docs/proxmox.md`);
      }
      assert.deepEqual(problems, []);
    });
  });
});
