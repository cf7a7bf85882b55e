import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { floorChoice } from "../runner/floor";

describe("floor run: which quick suites rerun on the lowest versions", () => {
  let dist: string;
  const write = (path: string, source: string) => {
    mkdirSync(join(dist, path, ".."), { recursive: true });
    writeFileSync(join(dist, path), source);
  };
  const choose = (spec: string) =>
    floorChoice(join(dist, spec), dist, "egress-proxies", "dist/components/index.js");

  before(() => {
    dist = join(mkdtempSync(join(tmpdir(), "egress-floor-rule-")), "dist");
    write("components/index.js", 'require("@pulumi/pulumi");');
    write("provider/xml.js", 'require("node:assert"); require("node:path");');
    write("provider/net.js", 'require("./xml"); const net = require("node:net");');
    write("provider/sub/index.js", 'require("node:stream/promises");');
    write("test/helper.js", 'require("../provider/net");');
    write("test/pure.test.js", 'require("node:assert/strict"); require("../provider/xml");');
    write("test/hashes.test.js", 'require("node:crypto"); require("../provider/xml.js");');
    write("test/deep.test.js", 'require("./helper");');
    write("test/dir.test.js", 'require("../provider/sub");');
    write("test/self.test.js", 'require("egress-proxies");');
    write("test/sdk.test.js", 'require("@pulumi/pulumi/runtime");');
    write("test/ssh.test.js", 'require("ssh2");');
    write("test/spawn.test.js", 'require("node:child_process");');
    write("cli/main.js", 'require("../provider/net");');
    write(
      "test/bin.test.js",
      'require("node:child_process"); const BIN = join(__dirname, "..", "cli", "main.js");',
    );
    write(
      "test/version.test.js",
      'require("@pulumi/pulumi/package.json"); require("../provider/xml");',
    );
    write("test/cycle.test.js", 'require("./cycle.test");');
  });
  after(() => rmSync(join(dist, ".."), { recursive: true, force: true }));

  it("leaves out pure builders, naming every builtin they use", () => {
    const choice = choose("test/pure.test.js");
    assert.equal(choice.floor, false);
    assert.match(choice.reason, /^pure: 2 module\(s\).*uses only assert, path\)$/);
    assert.equal(choose("test/hashes.test.js").floor, false, "crypto digests are stable");
    assert.equal(choose("test/cycle.test.js").floor, false);
  });

  it("reruns a spec that reaches a sensitive builtin through product code, saying through what", () => {
    assert.deepEqual(choose("test/deep.test.js"), {
      path: join(dist, "test/deep.test.js"),
      floor: true,
      reason: "node:net in provider/net.js via test/deep.test.js",
    });
    assert.equal(
      choose("test/dir.test.js").reason,
      "node:stream in provider/sub/index.js via test/dir.test.js",
    );
  });

  it("leaves out a test's own plumbing and a package's manifest, but follows a bin of ours it spawns", () => {
    // Spawning a tool (xmllint, cloud-init) runs the same on every major: not a reason.
    assert.equal(choose("test/spawn.test.js").floor, false);
    // Reading @pulumi/pulumi's package.json (a version for --version) is not the SDK at work.
    assert.equal(choose("test/version.test.js").floor, false);
    // The CLI it spawns runs on the floor Node: its closure counts.
    assert.equal(
      choose("test/bin.test.js").reason,
      "node:net in provider/net.js via test/bin.test.js",
    );
  });

  it("reruns a spec that reaches an SDK, ssh2, or the package by its own name", () => {
    assert.equal(choose("test/sdk.test.js").reason, "@pulumi/pulumi in test/sdk.test.js");
    assert.equal(choose("test/ssh.test.js").reason, "ssh2 in test/ssh.test.js");
    assert.equal(
      choose("test/self.test.js").reason,
      "@pulumi/pulumi in components/index.js via test/self.test.js",
    );
  });
});
