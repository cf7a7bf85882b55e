import { strict as assert } from "node:assert";
import { spawnSync } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { TargetError, targetFromFlags, targetsFromStackConfig } from "../../../cli/doctor/targets";
import { doctorTableRows, squashed } from "../../support/doctor-table";

/** dist/cli/main.js, as npm links the egress-proxies bin. */
const BIN = resolve(__dirname, "..", "..", "..", "cli", "main.js");

function egressProxies(args: string[], env: NodeJS.ProcessEnv = process.env) {
  const result = spawnSync(process.execPath, [BIN, ...args], {
    encoding: "utf8",
    timeout: 120_000,
    env,
  });
  return { status: result.status, stdout: result.stdout, stderr: result.stderr };
}

const poolEntry = (pool: unknown) => ({
  "egress-proxies:pool": { value: JSON.stringify(pool), objectValue: pool, secret: false },
});

describe("egress-proxies command line", () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "doctor-cli-"))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it("asks for a command, and refuses unknown ones (exit 2)", () => {
    const none = egressProxies([]);
    assert.equal(none.status, 2);
    assert.match(none.stderr, /usage: egress-proxies <command>[\s\S]*doctor/);
    const unknown = egressProxies(["chek"]);
    assert.equal(unknown.status, 2);
    assert.match(unknown.stderr, /unknown command "chek"/);
  });

  it("--version prints package.json's version; --verbose adds Node.js and the Pulumi SDK", () => {
    const manifest = JSON.parse(
      readFileSync(resolve(__dirname, "..", "..", "..", "..", "package.json"), "utf8"),
    ) as { version: string };
    const sdk = (
      JSON.parse(readFileSync(require.resolve("@pulumi/pulumi/package.json"), "utf8")) as {
        version: string;
      }
    ).version;
    const bins: Array<[string, string]> = [
      ["egress-proxies", BIN],
      ["egress-reaper", resolve(__dirname, "..", "..", "..", "reaper", "main.js")],
    ];
    for (const [name, bin] of bins) {
      const run = (args: string[]) =>
        spawnSync(process.execPath, [bin, ...args], { encoding: "utf8", timeout: 120_000 });
      const plain = run(["--version"]);
      assert.equal(plain.status, 0, plain.stderr);
      assert.equal(plain.stdout, `${name} ${manifest.version}\n`);
      const verbose = run(["--version", "--verbose"]);
      assert.equal(verbose.status, 0, verbose.stderr);
      assert.equal(
        verbose.stdout,
        `${name} ${manifest.version}\nNode.js ${process.versions.node}\n@pulumi/pulumi ${sdk}\n`,
      );
    }
  });

  it("rejects contradictory or incomplete doctor flags with the reason (exit 2)", () => {
    for (const [args, reason] of [
      [["--network", "default", "--bridge", "br0"], /give --network or --bridge, not both/],
      [["--user", "ops"], /--port, --user, --identity and --jump need --host/],
      [["--jump", "bastion"], /--port, --user, --identity and --jump need --host/],
      [
        ["--host", "kvm1.lan", "--jump", "bad host!"],
        /connection\.proxyJump is not \[user@\]host\[:port\]/,
      ],
      [["--timeout", "soon"], /--timeout must be whole seconds/],
      [["--firmware", "coreboot"], /firmware must be "uefi" or "bios"/],
      [
        ["--host", "kvm1.lan", "--config-json", "x.json"],
        /give one of --stack, --config-json and --host/,
      ],
      [["--frobnicate"], /Unknown option '--frobnicate'/],
    ] as const) {
      const result = egressProxies(["doctor", ...args]);
      assert.equal(result.status, 2, `${args.join(" ")}: ${result.stderr}`);
      assert.match(result.stderr, reason);
    }
  });

  it("reports a host it cannot reach as not ready (exit 1), with the cause in words", () => {
    const socket = join(dir, "no-such-socket");
    const table = egressProxies(["doctor", "--socket", socket]);
    assert.equal(table.status, 1, table.stderr);
    assert.match(table.stdout, /^HOST\s+CHECK\s+STATUS\s+WHAT\s+FIX/);
    const [row, ...others] = doctorTableRows(table.stdout);
    assert.equal(others.length, 0);
    assert.deepEqual([row!.host, row!.check, row!.status], ["local", "connect", "FAIL"]);
    assert.match(
      squashed(row!.what),
      /^cannotconnecttolibvirtsocket.*ENOENT.*libvirtdisnotrunningorlistenselsewhere/,
    );
    // Said once: in the table, not again on stderr.
    assert.equal(table.stderr, "");
    for (const line of table.stdout.split("\n")) assert.ok(line.length <= 80, line);
    assert.match(table.stdout, /1 of 1 host\(s\) not ready/);
    const json = egressProxies(["doctor", "--socket", socket, "--json"]);
    assert.equal(json.status, 1);
    const report = JSON.parse(json.stdout) as {
      ok: boolean;
      hosts: Array<{ ready: boolean; problem: string }>;
    };
    assert.equal(report.ok, false);
    assert.equal(report.hosts[0]!.ready, false);
    assert.match(report.hosts[0]!.problem, /cannot connect to libvirt socket/);
  });

  it("--stack reads the stack's config through `pulumi config --json --show-secrets`", () => {
    // A stand-in for the Pulumi CLI that records how it was called.
    const pulumi = join(dir, "pulumi");
    const socket = join(dir, "kvm1-socket");
    writeFileSync(
      join(dir, "config.json"),
      JSON.stringify(
        poolEntry({ count: 1, backends: [{ name: "kvm1", kvm: { socketPath: socket } }] }),
      ),
    );
    writeFileSync(
      pulumi,
      `#!/bin/sh\necho "$@" > "${join(dir, "args")}"\ncat "${join(dir, "config.json")}"\n`,
    );
    chmodSync(pulumi, 0o755);
    const result = egressProxies(["doctor", "--stack", "prod", "--json"], {
      ...process.env,
      PATH: `${dir}:${process.env.PATH}`,
    });
    assert.equal(result.status, 1, result.stderr);
    assert.equal(
      readFileSync(join(dir, "args"), "utf8").trim(),
      "config --json --show-secrets --stack prod",
    );
    const report = JSON.parse(result.stdout) as {
      hosts: Array<{ name: string; problem?: string }>;
    };
    assert.deepEqual(
      report.hosts.map((host) => host.name),
      ["kvm1"],
    );
    assert.match(report.hosts[0]!.problem ?? "", new RegExp(`${socket}.*ENOENT`));
  });

  it("names the config key of a stack config mistake (exit 2)", () => {
    const file = join(dir, "config.json");
    writeFileSync(
      file,
      JSON.stringify(
        poolEntry({ count: 1, backends: [{ name: "kvm1", kvm: { pool: "no good" } }] }),
      ),
    );
    const result = egressProxies(["doctor", "--config-json", file]);
    assert.equal(result.status, 2);
    assert.match(
      result.stderr,
      /egress-proxies:pool\.backends\[0\]\.kvm\.pool must be a libvirt storage pool name/,
    );
  });
});

describe("doctor targets", () => {
  it("with no pool config checks what the root program uses: the local socket with KvmProxy's defaults", () => {
    const [target, ...rest] = targetsFromStackConfig({}, "config");
    assert.equal(rest.length, 0);
    assert.deepEqual(
      {
        name: target!.name,
        label: target!.label,
        wants: target!.wants,
        socket: target!.connectTo.socketPath,
      },
      {
        name: "local",
        label: "local",
        wants: {
          pool: "default",
          network: { name: "default" },
          firmware: "uefi",
          domainType: "kvm",
        },
        socket: "/var/run/libvirt/libvirt-sock",
      },
    );
    assert.equal(target!.inputPrefix, "egress-proxies:pool.backends[0].kvm.");
  });

  it("gives each KVM backend the stack's kvmPrivateKey unless it has its own, and skips Proxmox backends", () => {
    const key = "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n";
    const targets = targetsFromStackConfig(
      {
        ...poolEntry({
          count: 2,
          backends: [
            {
              name: "pve",
              proxmox: { node: "p", templateVmid: 9000, diskStorage: "a", seedStorage: "b" },
            },
            {
              name: "kvm1",
              kvm: { connection: { host: "kvm1.lan", port: 2222 }, network: { bridge: "br0" } },
            },
          ],
        }),
        "egress-proxies:kvmPrivateKey": { value: key, secret: true },
      },
      "config",
    );
    assert.deepEqual(
      targets.map((t) => [t.name, t.label, t.inputPrefix]),
      [["kvm1", "kvm1.lan:2222", "egress-proxies:pool.backends[1].kvm."]],
    );
    assert.equal(targets[0]!.connectTo.connection?.privateKey, key);
    assert.deepEqual(targets[0]!.wants.network, { bridge: "br0" });
  });

  it("refuses secrets shown as [secret] and configs without a KVM backend", () => {
    assert.throws(
      () =>
        targetsFromStackConfig(
          {
            ...poolEntry({
              count: 1,
              backends: [{ name: "k", kvm: { connection: { host: "k.lan" } } }],
            }),
            "egress-proxies:kvmPrivateKey": { value: "[secret]", secret: true },
          },
          "config",
        ),
      (error: Error) => error instanceof TargetError && /--show-secrets/.test(error.message),
    );
    assert.throws(
      () =>
        targetsFromStackConfig(
          poolEntry({
            count: 1,
            backends: [
              {
                name: "p",
                proxmox: { node: "p", templateVmid: 9000, diskStorage: "a", seedStorage: "b" },
              },
            ],
          }),
          "config",
        ),
      /has no KVM backend/,
    );
  });

  it("builds one host from flags, reading the key file it names", () => {
    const dir = mkdtempSync(join(tmpdir(), "doctor-flags-"));
    try {
      const keyFile = join(dir, "id");
      writeFileSync(
        keyFile,
        "-----BEGIN OPENSSH PRIVATE KEY-----\ny\n-----END OPENSSH PRIVATE KEY-----\n",
      );
      const target = targetFromFlags({
        host: "kvm1.lan",
        user: "ops",
        identity: keyFile,
        bridge: "br0",
        firmware: "bios",
        domainType: "qemu",
      });
      assert.equal(target.label, "kvm1.lan");
      assert.equal(target.connectTo.connection?.user, "ops");
      // A refused login names the flag the key came from, not a resource input.
      assert.equal(target.privateKeySource, `--identity ${keyFile}`);
      assert.match(
        target.connectTo.connection?.privateKey ?? "",
        /^-----BEGIN OPENSSH PRIVATE KEY-----/,
      );
      assert.deepEqual(target.wants, {
        pool: "default",
        network: { bridge: "br0" },
        firmware: "bios",
        domainType: "qemu",
      });
      assert.throws(
        () => targetFromFlags({ host: "kvm1.lan", identity: join(dir, "missing") }),
        /--identity .* cannot be read/,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
