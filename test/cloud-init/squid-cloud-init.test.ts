/**
 * The pool's default cloud-init, checked by Debian's cloud-init itself: its
 * schema validator, its user-data processor and its cloud-config merger; and
 * the basic-auth hash, checked by the system's crypt(3) (what squid's
 * basic_ncsa_auth calls).
 */
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sha512Crypt, htpasswdLine } from "../../workloads/password-hash";
import {
  poolUserData,
  squidCloudConfig,
  squidConfig,
  squidGuestFiles,
  squidSettingsProblems,
  squidUserDataIdentity,
  type SquidSettings,
} from "../../workloads/squid-cloud-init";

const DEBIAN_PYTHON = "/usr/bin/python3";
const MERGE_PROBE = join(__dirname, "../../../test/support/cloudinit_merge.py");

const SETTINGS: SquidSettings = {
  port: 3129,
  allowedClientCidrs: ["198.51.100.0/24", "fd00::/8"],
  basicAuth: { user: "crawler", password: "correct horse battery" },
  extraConfigLines: ["acl blocked dstdomain .example.com", "http_access deny blocked"],
};

describe("squid cloud-init (the pool's default user-data)", function () {
  this.timeout(120_000);
  let scratch: string;
  beforeEach(() => (scratch = mkdtempSync(join(tmpdir(), "squid-cloud-init-"))));
  afterEach(() => rmSync(scratch, { recursive: true, force: true }));

  function schema(document: string) {
    const file = join(scratch, "user-data");
    writeFileSync(file, document);
    return spawnSync("/usr/bin/cloud-init", ["schema", "--config-file", file], {
      encoding: "utf8",
    });
  }

  function mergedByCloudInit(userData: string) {
    const file = join(scratch, "user-data.mime");
    writeFileSync(file, userData);
    return JSON.parse(execFileSync(DEBIAN_PYTHON, [MERGE_PROBE, file], { encoding: "utf8" })) as {
      parts: Array<{ type: string; filename: string }>;
      merged: Record<string, unknown>;
    };
  }

  it("is a valid cloud-config for `cloud-init schema`, with and without basic auth", () => {
    for (const settings of [SETTINGS, { ...SETTINGS, basicAuth: undefined }]) {
      const result = schema(squidCloudConfig(settings));
      assert.equal(result.status, 0, result.stdout + result.stderr);
      assert.match(result.stdout, /Valid cloud-config/);
    }
  });

  it("the validator rejects a broken document (the check can fail)", () => {
    const broken = squidCloudConfig(SETTINGS).replace("    defer: true", "    defer: sometimes");
    const result = schema(broken);
    assert.notEqual(result.status, 0, result.stdout);
  });

  it("carries the port, the allowed CIDRs, the hash and never the password", () => {
    const document = squidCloudConfig(SETTINGS);
    assert.ok(!document.includes("correct horse battery"));
    const merged = mergedByCloudInit(document).merged as {
      packages: string[];
      write_files: Array<{ path: string; content: string; defer: boolean }>;
    };
    assert.deepEqual(merged.packages, ["squid"]);
    const [config, passwords] = merged.write_files;
    assert.equal(config.path, "/etc/squid/squid.conf");
    assert.equal(config.content, squidConfig(SETTINGS), "YAML keeps squid.conf byte for byte");
    assert.match(config.content, /^http_port 3129$/m);
    assert.match(config.content, /^acl egress_clients src fd00::\/8$/m);
    assert.match(config.content, /^http_access allow egress_clients egress_users$/m);
    // The extra lines come before the final rules, so their denies take effect.
    assert.ok(
      config.content.indexOf("http_access deny blocked") <
        config.content.indexOf("allow egress_clients"),
    );
    assert.equal(passwords.content.trim(), htpasswdLine("crawler", "correct horse battery"));
    assert.ok(
      config.defer && passwords.defer,
      "written after the package, so it is not overwritten",
    );
  });

  it("the files delivered in place are byte for byte what cloud-init writes at first boot, prefix dialer included", () => {
    const prefixed: SquidSettings = {
      ...SETTINGS,
      // 3129 is the dialer's own loopback port.
      port: 3128,
      prefixEgress: { prefix: "2001:db8:7:100::/64", mode: "random" },
    };
    for (const settings of [SETTINGS, { ...SETTINGS, basicAuth: undefined }, prefixed]) {
      const merged = mergedByCloudInit(
        poolUserData(squidCloudConfig(settings), "#cloud-config\nruncmd: [[true]]\n"),
      ).merged as { write_files: Array<{ path: string; content: string; permissions: string }> };
      const delivered = squidGuestFiles(settings).files;
      assert.deepEqual(
        delivered.map((file) => [file.path, file.permissions, file.content]),
        merged.write_files.map((file) => [file.path, file.permissions, file.content]),
      );
    }
    // The identity leaves the files' text out: squid settings alone keep it, a prefix (a package) changes it.
    const identity = squidUserDataIdentity(SETTINGS);
    assert.equal(squidUserDataIdentity({ ...SETTINGS, extraConfigLines: [] }), identity);
    assert.equal(squidUserDataIdentity({ ...SETTINGS, port: 3130 }), identity);
    assert.notEqual(squidUserDataIdentity(prefixed), identity);
    assert.notEqual(squidUserDataIdentity(SETTINGS, "#cloud-config\npackages: [htop]\n"), identity);
  });

  it("the same settings give the same bytes (an unchanged pool replaces no VM)", () => {
    assert.equal(squidCloudConfig(SETTINGS), squidCloudConfig({ ...SETTINGS }));
    assert.notEqual(
      squidCloudConfig(SETTINGS),
      squidCloudConfig({
        ...SETTINGS,
        basicAuth: { user: "crawler", password: "another password" },
      }),
    );
  });

  it("hashes passwords the way crypt(3) checks them", () => {
    const hash = sha512Crypt("Hello world!", "saltstring");
    // The reference value from the SHA-crypt specification.
    assert.equal(
      hash,
      "$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOfaS35inz1",
    );
    for (const password of ["correct horse battery", "pässwörd-ünïcode", "x".repeat(200)]) {
      const line = htpasswdLine("crawler", password);
      const stored = line.slice("crawler:".length);
      const checked = execFileSync(
        DEBIAN_PYTHON,
        [
          "-W",
          "ignore",
          "-c",
          "import crypt,sys; print(crypt.crypt(sys.argv[1], sys.argv[2]) == sys.argv[2])",
          password,
          stored,
        ],
        { encoding: "utf8" },
      ).trim();
      assert.equal(checked, "True", password);
    }
  });

  it("extra cloud-init boots as its own part, verbatim, and cloud-init merges both", () => {
    const extra =
      "#cloud-config\n# mine: version 1.10 stays 1.10\npackages: [curl]\nruncmd:\n  - [touch, /run/mine]\nx-version: 1.10\n";
    const userData = poolUserData(squidCloudConfig(SETTINGS), extra);
    assert.ok(userData.includes(extra), "the user's document is carried byte for byte");
    const { parts, merged } = mergedByCloudInit(userData);
    assert.deepEqual(
      parts.map((part) => part.type),
      ["text/cloud-config", "text/cloud-config"],
    );
    assert.deepEqual(
      merged.packages,
      ["curl", "squid"],
      "lists append: neither side loses packages",
    );
    assert.deepEqual((merged.runcmd as unknown[])[0], ["touch", "/run/mine"]);
    assert.deepEqual((merged.runcmd as unknown[]).at(-1), [
      "systemctl",
      "reload-or-restart",
      "squid",
    ]);
    assert.equal(
      merged["x-version"],
      1.1,
      "YAML 1.1 reads 1.10 as 1.1 - which is why we never re-serialise",
    );
  });

  it("extra cloud-init in another format (a shell script) stays a script part", () => {
    const script = "#!/bin/sh\necho hello > /run/hello\n";
    const { parts, merged } = mergedByCloudInit(poolUserData(squidCloudConfig(SETTINGS), script));
    assert.deepEqual(
      parts.map((part) => part.type),
      ["text/x-shellscript", "text/cloud-config"],
    );
    assert.deepEqual(merged.packages, ["squid"]);
  });

  it("names the field and the fix for bad settings, and never echoes the password", () => {
    const problems = squidSettingsProblems({
      port: 70000,
      allowedClientCidrs: ["10.0.0.0", "10.0.0.0/33"],
      basicAuth: { user: "bad user", password: "short\n" },
      extraConfigLines: ["two\nlines"],
    });
    assert.deepEqual(
      problems.map((problem) => problem.split(" ")[0]),
      [
        "squid.port",
        "squid.allowedClientCidrs[0]",
        "squid.allowedClientCidrs[1]",
        "squid.basicAuth.user",
        "squid.basicAuth.password",
        "squid.basicAuth.password",
        "squid.extraConfigLines[0]",
      ],
    );
    assert.ok(problems.every((problem) => !problem.includes("short")));
    assert.match(
      squidSettingsProblems({ ...SETTINGS, allowedClientCidrs: [] })[0],
      /at least one CIDR/,
    );
  });
});
