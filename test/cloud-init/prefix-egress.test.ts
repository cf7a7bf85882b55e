/**
 * The prefix-egress pieces of the squid cloud-config (workloads/prefix-egress.ts):
 * validation messages that name the field and the fix; the document checked
 * by Debian's cloud-init (schema validator and merger) with the dialer carried
 * byte for byte; the systemd units checked by `systemd-analyze verify`; the
 * dialer script parsed as Python 3.9; and the script reached from the packed
 * tarball, the way users install the package.
 */
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import {
  chmodSync,
  cpSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  memberPrefix,
  PREFIX_DIALER_SCRIPT,
  prefixDialerUnit,
  prefixEgressProblems,
  prefixRouteUnit,
  type PrefixEgressSettings,
} from "../../workloads/prefix-egress";
import {
  squidCloudConfig,
  squidConfig,
  type SquidSettings,
} from "../../workloads/squid-cloud-init";
import { packRepository } from "../engine/pack";

const REPOSITORY = join(__dirname, "..", "..", "..");
const DIALER_SOURCE = join(REPOSITORY, "workloads", "prefix-dialer", "dialer.py");
const DEBIAN_PYTHON = "/usr/bin/python3";
const MERGE_PROBE = join(REPOSITORY, "test", "support", "cloudinit_merge.py");

const PREFIX: PrefixEgressSettings = { prefix: "2001:db8:1:2::/64", mode: "random" };
const SQUID: SquidSettings = {
  port: 3128,
  allowedClientCidrs: ["10.0.0.0/8"],
  basicAuth: { user: "crawler", password: "correct horse battery" },
  extraConfigLines: [],
  prefixEgress: PREFIX,
};

describe("prefix egress (a routed IPv6 prefix spread over one proxy)", function () {
  this.timeout(120_000);
  let scratch: string;
  beforeEach(() => (scratch = mkdtempSync(join(tmpdir(), "prefix-egress-"))));
  afterEach(() => rmSync(scratch, { recursive: true, force: true }));

  describe("a member's prefix (the pool's split, by member index)", () => {
    it("splits a /48 or /56 into /64s, member i taking the i-th, up to the last one", () => {
      assert.equal(memberPrefix("2001:db8:1::/48", 0), "2001:db8:1::/64");
      assert.equal(memberPrefix("2001:db8:1::/48", 1), "2001:db8:1:1::/64");
      assert.equal(memberPrefix("2001:db8:1::/48", 65535), "2001:db8:1:ffff::/64");
      assert.equal(memberPrefix("2001:db8:1:100::/56", 255), "2001:db8:1:1ff::/64");
      assert.throws(
        () => memberPrefix("2001:db8:1:100::/56", 256),
        /holds 256 \/64s, too few for member 256/,
      );
    });

    it("gives a /64 or longer prefix to member 0 only, in canonical form", () => {
      assert.equal(memberPrefix("2001:DB8:1:2:0::/64", 0), "2001:db8:1:2::/64");
      assert.equal(memberPrefix("2001:db8:1:2::/80", 0), "2001:db8:1:2::/80");
      assert.throws(
        () => memberPrefix("2001:db8:1:2::/64", 1),
        /serves one proxy, but member 1 needs one too/,
      );
      assert.throws(
        () => memberPrefix("10.0.0.0/8", 0),
        /ipv6Prefix\.prefix "10\.0\.0\.0\/8" must be an IPv6 prefix/,
      );
    });
  });

  describe("validation", () => {
    const problemsOf = (settings: Partial<PrefixEgressSettings>, squidPort?: number) =>
      prefixEgressProblems({ ...PREFIX, ...settings }, "ipv6Prefix", squidPort);

    it("accepts a routed /64, a /48, a /124 and unique-local space", () => {
      for (const prefix of [
        "2001:db8:1:2::/64",
        "2a01:4f8:abcd::/48",
        "2001:db8::10/124",
        "fd00:1:2:3::/64",
      ])
        assert.deepEqual(problemsOf({ prefix }), [], prefix);
      assert.deepEqual(problemsOf({ mode: "sticky" }), []);
      assert.deepEqual(problemsOf({ mode: "pool", count: 65536 }), []);
      assert.deepEqual(problemsOf({ prefix: "2001:db8::10/124", mode: "pool", count: 15 }), []);
    });

    const cases: Array<[string, Partial<PrefixEgressSettings>, RegExp, number?]> = [
      [
        "an IPv4 CIDR",
        { prefix: "192.0.2.0/24" },
        /ipv6Prefix\.prefix .* must be an IPv6 prefix in CIDR form, e\.g\. "2001:db8:1:2::\/64"/,
      ],
      ["no length", { prefix: "2001:db8:1:2::" }, /must be an IPv6 prefix in CIDR form/],
      [
        "a /47",
        { prefix: "2001:db8::/47" },
        /ipv6Prefix\.prefix .* must be from \/48 to \/124 long/,
      ],
      ["a /125", { prefix: "2001:db8::8/125" }, /must be from \/48 to \/124 long/],
      [
        "host bits",
        { prefix: "2001:db8:1:2::5/64" },
        /has host bits set; write the network itself: "2001:db8:1:2::\/64"/,
      ],
      ["link-local", { prefix: "fe80::/64" }, /is link-local \(fe80::\/10\)/],
      ["multicast", { prefix: "ff02::/64" }, /is multicast/],
      ["loopback/unspecified space", { prefix: "::/64" }, /in ::\/8 \(unspecified, loopback/],
      ["IPv4-mapped space", { prefix: "::ffff:0:0/96" }, /in ::\/8/],
      [
        "an unknown mode",
        { mode: "roundrobin" as never },
        /ipv6Prefix\.mode must be one of "random", "sticky", "pool"/,
      ],
      ["pool without count", { mode: "pool" }, /ipv6Prefix\.count is required in pool mode/],
      [
        "count 0",
        { mode: "pool", count: 0 },
        /ipv6Prefix\.count must be a whole number from 1 to 65536/,
      ],
      ["count 65537", { mode: "pool", count: 65537 }, /from 1 to 65536/],
      ["count 1.5", { mode: "pool", count: 1.5 }, /whole number/],
      [
        "count beyond a /124",
        { prefix: "2001:db8::10/124", mode: "pool", count: 16 },
        /ipv6Prefix\.count 16 does not fit in 2001:db8::10\/124: it has 15 usable addresses/,
      ],
      ["count in random mode", { count: 4 }, /ipv6Prefix\.count applies to mode "pool" only/],
      [
        "squid on the dialer's port",
        {},
        /squid's port 3129 is the prefix dialer's loopback port; give squid another port/,
        3129,
      ],
    ];
    for (const [name, settings, message, squidPort] of cases)
      it(`refuses ${name}, naming the field and the fix`, () => {
        const problems = problemsOf(settings, squidPort);
        assert.equal(problems.length, 1, problems.join("\n"));
        assert.match(problems[0]!, message);
      });

    it("the squid cloud-config refuses bad prefix settings under squid.prefixEgress", () => {
      assert.throws(
        () => squidCloudConfig({ ...SQUID, port: 3129 }),
        /squid\.prefixEgress: squid's port 3129/,
      );
      assert.throws(
        () => squidCloudConfig({ ...SQUID, prefixEgress: { prefix: "fe80::/64", mode: "random" } }),
        /squid\.prefixEgress\.prefix "fe80::\/64" is link-local/,
      );
    });
  });

  describe("the squid cloud-config with a prefix", () => {
    function cloudInit(args: string[]) {
      return spawnSync(args[0]!, args.slice(1), { encoding: "utf8" });
    }

    it("is a valid cloud-config for `cloud-init schema` in every mode", () => {
      for (const prefixEgress of [
        PREFIX,
        { ...PREFIX, mode: "sticky" as const },
        { ...PREFIX, mode: "pool" as const, count: 8 },
      ]) {
        const file = join(scratch, "user-data");
        writeFileSync(file, squidCloudConfig({ ...SQUID, prefixEgress }));
        const result = cloudInit(["/usr/bin/cloud-init", "schema", "--config-file", file]);
        assert.equal(result.status, 0, result.stdout + result.stderr);
        assert.match(result.stdout, /Valid cloud-config/);
      }
    });

    it("carries the dialer byte for byte, the units, the sysctl, and starts them before squid reloads", () => {
      const file = join(scratch, "user-data");
      writeFileSync(file, squidCloudConfig(SQUID));
      const { merged } = JSON.parse(
        execFileSync(DEBIAN_PYTHON, [MERGE_PROBE, file], { encoding: "utf8" }),
      ) as {
        merged: {
          packages: string[];
          write_files: Array<{ path: string; content: string; permissions: string }>;
          runcmd: unknown[];
        };
      };
      assert.deepEqual(merged.packages, ["squid", "python3"]);
      const byPath = new Map(merged.write_files.map((entry) => [entry.path, entry]));
      const dialer = byPath.get("/usr/local/lib/egress-proxies/prefix-dialer.py")!;
      assert.equal(dialer.content, readFileSync(DIALER_SOURCE, "utf8"), "the script survives YAML");
      assert.equal(dialer.permissions, "0755");
      assert.equal(
        byPath.get("/etc/systemd/system/egress-prefix-route.service")!.content,
        prefixRouteUnit("2001:db8:1:2::/64"),
      );
      assert.match(
        byPath.get("/etc/systemd/system/egress-prefix-dialer.service")!.content,
        /^ExecStart=\/usr\/bin\/python3 \/usr\/local\/lib\/egress-proxies\/prefix-dialer\.py --prefix 2001:db8:1:2::\/64 --mode random --port 3129$/m,
      );
      assert.match(
        byPath.get("/etc/sysctl.d/60-egress-prefix.conf")!.content,
        /^net\.ipv6\.ip_nonlocal_bind = 1$/m,
      );
      const squidConf = byPath.get("/etc/squid/squid.conf")!.content;
      assert.equal(squidConf, squidConfig(SQUID));
      assert.match(
        squidConf,
        /^cache_peer 127\.0\.0\.1 parent 3129 0 no-query no-digest default login=PASSTHRU name=prefixdialer$/m,
      );
      assert.match(squidConf, /^never_direct allow all$/m);
      assert.match(squidConf, /^server_persistent_connections off$/m);
      assert.match(squidConf, /^request_header_add X-Egress-Prefix-Client "%>a" all$/m);
      // The peer lines come before the access rules' final deny, like every other directive we add.
      assert.ok(squidConf.indexOf("cache_peer") < squidConf.indexOf("http_access deny all"));
      assert.deepEqual(merged.runcmd.slice(-4), [
        ["sysctl", "-p", "/etc/sysctl.d/60-egress-prefix.conf"],
        ["systemctl", "daemon-reload"],
        [
          "systemctl",
          "enable",
          "--now",
          "egress-prefix-route.service",
          "egress-prefix-dialer.service",
        ],
        ["systemctl", "reload-or-restart", "squid"],
      ]);
    });

    it("without a prefix the document has none of it (existing pools see no change)", () => {
      const plain = squidCloudConfig({ ...SQUID, prefixEgress: undefined });
      assert.doesNotMatch(plain, /prefix|cache_peer|never_direct|python3/);
    });

    it("writes the prefix in canonical form, and the pool count and mode into the dialer's arguments", () => {
      const unit = prefixDialerUnit({ prefix: "2001:DB8:1:2:0:0:0:0/64", mode: "pool", count: 12 });
      assert.match(unit, / --prefix 2001:db8:1:2::\/64 --mode pool --count 12 --port 3129$/m);
      assert.equal(
        squidCloudConfig({
          ...SQUID,
          prefixEgress: { prefix: "2001:0DB8:0001:0002::/64", mode: "random" },
        }),
        squidCloudConfig(SQUID),
        "two spellings of one prefix give one document (no VM replaced for a spelling)",
      );
    });
  });

  describe("the systemd units", () => {
    function verify(root: string, units: string[]): string {
      const run = spawnSync("systemd-analyze", [`--root=${root}`, "verify", ...units], {
        encoding: "utf8",
        env: { ...process.env, SYSTEMD_LOG_LEVEL: "notice" },
        timeout: 30_000,
      });
      if (run.error) throw run.error;
      return `${run.stdout}${run.stderr}`;
    }

    function rootWith(units: Record<string, string>): string {
      const root = join(scratch, "root");
      mkdirSync(join(root, "usr/lib/systemd"), { recursive: true });
      cpSync("/usr/lib/systemd/system", join(root, "usr/lib/systemd/system"), { recursive: true });
      mkdirSync(join(root, "etc/systemd/system"), { recursive: true });
      // Stand-ins for what the units run, so verify checks the rest.
      for (const command of ["/usr/bin/python3", "/sbin/ip"]) {
        mkdirSync(join(root, command, ".."), { recursive: true });
        writeFileSync(join(root, command), "#!/bin/sh\n");
        chmodSync(join(root, command), 0o755);
      }
      for (const [name, text] of Object.entries(units))
        writeFileSync(join(root, "etc/systemd/system", name), text);
      return root;
    }

    it("systemd-analyze verify has nothing to say about them", () => {
      const units = {
        "egress-prefix-route.service": prefixRouteUnit("2001:db8:1:2::/64"),
        "egress-prefix-dialer.service": prefixDialerUnit({ ...PREFIX, mode: "pool", count: 4 }),
      };
      const output = verify(rootWith(units), Object.keys(units));
      const ours = output.split("\n").filter((line) => line.includes("egress-prefix"));
      assert.deepEqual(ours, [], output);
    });

    it("the same check reports a misspelt key (it can fail)", () => {
      const broken = prefixRouteUnit("2001:db8:1:2::/64").replace(
        "RemainAfterExit",
        "RemainAfterExitt",
      );
      const output = verify(rootWith({ "egress-prefix-route.service": broken }), [
        "egress-prefix-route.service",
      ]);
      assert.match(output, /egress-prefix-route\.service:\d+: Unknown key 'RemainAfterExitt'/);
    });
  });

  describe("the dialer script", () => {
    it("parses as Python 3.9 and refuses bad arguments with the option named", () => {
      const check = spawnSync(
        DEBIAN_PYTHON,
        [
          "-c",
          "import ast,sys; ast.parse(open(sys.argv[1]).read(), feature_version=(3, 9)); print('ok')",
          DIALER_SOURCE,
        ],
        { encoding: "utf8" },
      );
      assert.equal(check.stdout.trim(), "ok", check.stderr);
      const bad = spawnSync(DEBIAN_PYTHON, [DIALER_SOURCE, "--prefix", "2001:db8::1/64"], {
        encoding: "utf8",
      });
      assert.equal(bad.status, 2);
      assert.match(bad.stderr, /--prefix: 2001:db8::1\/64 has host bits set/);
      const pool = spawnSync(
        DEBIAN_PYTHON,
        [DIALER_SOURCE, "--prefix", "2001:db8::/64", "--mode", "pool"],
        {
          encoding: "utf8",
        },
      );
      assert.equal(pool.status, 2);
      assert.match(pool.stderr, /--count must be from 1/);
    });

    it("rewrites plain requests for the origin, keys sticky mode and picks sources as documented", () => {
      const out = JSON.parse(
        execFileSync(
          DEBIAN_PYTHON,
          [join(REPOSITORY, "test", "support", "dialer_units.py"), DIALER_SOURCE],
          {
            encoding: "utf8",
          },
        ),
      ) as Record<string, unknown>;
      // Origin-form, one request per connection, and no credential, hop-by-hop or own header passed on.
      assert.deepEqual(out.plain, {
        head: [
          "GET /a?b=1 HTTP/1.1",
          "Host: example.com:8080",
          "Accept: */*",
          "Connection: close",
          "",
          "",
        ],
        host: "example.com",
        port: 8080,
        body: 0,
      });
      assert.deepEqual((out.noHost as { head: string[] }).head[1], "Host: [2001:db8::1]");
      assert.equal((out.post as { body: number }).body, 5, "exactly Content-Length bytes follow");
      assert.equal((out.chunked as { body: null }).body, null, "a chunked body streams");
      assert.deepEqual(out.twoLengths, { status: 400, text: "bad Content-Length" });
      assert.equal((out.https as { status: number }).status, 400);
      // The credential's user wins over squid's client header, which wins over the peer address.
      assert.deepEqual(out.keys, [
        "user\u0000alice",
        "client\u000010.0.0.7",
        "peer\u0000127.0.0.1",
      ]);
      // A /124 has 15 sources: every address but the subnet-router anycast one (offset 0).
      assert.deepEqual(
        out.randomSmall,
        Array.from({ length: 15 }, (_, i) => `2001:db8::${(0x11 + i).toString(16)}`),
      );
      assert.deepEqual(out.pool, ["2001:db8::1", "2001:db8::2", "2001:db8::3"]);
      const [first, again, bob, otherPrefix] = out.sticky as string[];
      assert.equal(first, again, "one user, one address");
      assert.notEqual(first, bob);
      assert.ok(
        otherPrefix!.startsWith("2001:db8:0:1:"),
        "another proxy's prefix, its own address",
      );
      // systemd's readiness (Type=notify) once it listens, and a clean exit on SIGTERM.
      assert.equal(out.notify, "READY=1");
      assert.equal(out.notifyExit, 0);
    });

    it("travels in the packed tarball, where the module finds it relative to dist/", () => {
      const tarball = packRepository(scratch);
      execFileSync("tar", ["-xzf", tarball, "-C", scratch]);
      const modulePath = join(scratch, "package", "dist", "workloads", "prefix-egress.js");
      const packed = execFileSync(
        process.execPath,
        ["-e", `process.stdout.write(require(${JSON.stringify(modulePath)}).PREFIX_DIALER_SCRIPT)`],
        { encoding: "utf8" },
      );
      assert.equal(packed, readFileSync(DIALER_SOURCE, "utf8"));
      assert.equal(packed, PREFIX_DIALER_SCRIPT);
      // Without the file (a "files" list that forgot it) the module fails at import, not at first boot.
      rmSync(join(scratch, "package", "workloads"), { recursive: true });
      const missing = spawnSync(
        process.execPath,
        ["-e", `require(${JSON.stringify(modulePath)})`],
        {
          encoding: "utf8",
        },
      );
      assert.notEqual(missing.status, 0);
      assert.match(missing.stderr, /ENOENT.*prefix-dialer\/dialer\.py/);
    });
  });
});
