/**
 * `egress-proxies doctor` and KvmProxy's preflight against the stock-host
 * profile: a libvirt host exactly as Debian's packages leave it (network
 * default defined but inactive, no pool), reached over SSH as a non-root
 * user in group libvirt. The doctor runs as the package's bin, as users run it.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { errorClassOf } from "../../provider/common/errors";
import { closeAllHosts } from "../../provider/kvm/connect";
import * as kvm from "../../provider/kvm/provider";
import { doctorTableRows, squashed } from "../support/doctor-table";
import { resetStockHost, stockVirsh, useStockHost, type StockHostEnv } from "./stock-fixture";

/** dist/cli/main.js, as npm links the egress-proxies bin. */
const BIN = resolve(__dirname, "..", "..", "cli", "main.js");

function egressProxies(args: string[], options: { asNobody?: boolean } = {}) {
  const command = options.asNobody
    ? ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", process.execPath, BIN]
    : [process.execPath, BIN];
  const result = spawnSync(command[0]!, [...command.slice(1), ...args], {
    encoding: "utf8",
    timeout: 60_000,
  });
  return { status: result.status, stdout: result.stdout, stderr: result.stderr };
}

interface JsonReport {
  ok: boolean;
  hosts: Array<{
    name: string;
    host: string;
    ready: boolean;
    problem?: string;
    checks: Array<{
      check: string;
      status: string;
      input: string;
      fix: string[];
      safeFix?: string;
    }>;
    fixed: string[];
  }>;
}

describe("lab: egress-proxies doctor on a stock Debian host", function () {
  this.timeout(120_000);
  let stock: StockHostEnv;
  let overSsh: string[];

  before(async () => {
    stock = await useStockHost();
    overSsh = [
      "--host",
      stock.sshHost,
      "--port",
      String(stock.sshPort),
      "--user",
      stock.sshUser,
      "--identity",
      stock.clientKey,
      "--known-hosts",
      stock.knownHosts,
      "--socket",
      stock.libvirtSocket,
    ];
  });
  beforeEach(() => resetStockHost());
  after(async () => {
    await closeAllHosts();
    if (stock !== undefined) await resetStockHost();
  });

  it("names the missing pool and the inactive network with their fixes, and exits 1", () => {
    const result = egressProxies(["doctor", ...overSsh]);
    assert.equal(result.status, 1, result.stderr);
    const lines = result.stdout.split("\n");
    assert.match(lines[0]!, /^HOST\s+CHECK\s+STATUS\s+WHAT\s+FIX$/);
    for (const line of lines) assert.ok(line.length <= 80, `wider than 80 columns: ${line}`);
    const rows = doctorTableRows(result.stdout);
    // A row's cells with the table's wrapping undone (compared without white space).
    const row = (check: string) => {
      const found = rows.find((candidate) => candidate.check === check);
      return found === undefined ? "" : squashed(`${found.status} ${found.what} ${found.fix}`);
    };
    assert.match(row("libvirt-version"), /^OKfirmware=uefi:libvirt\d+\.\d+\.\d+/);
    // The lab's hosts have no KVM, whatever this machine has (test/lab/lab-lib.sh, in_private_root):
    // the domain type fails with the way to emulation, and the firmware is answered for emulation.
    const domainType = row("domain-type");
    assert.ok(domainType.startsWith(squashed("FAIL domainType=kvm: no KVM (")), domainType);
    assert.ok(
      domainType.includes(
        squashed('only software emulation (domainType "qemu") is available set domainType: "qemu"'),
      ),
      domainType,
    );
    assert.equal(
      row("firmware"),
      squashed(
        'OK firmware=uefi: UEFI firmware (OVMF); answered for software emulation (domainType "qemu"): this host has no KVM',
      ),
    );
    // The finding, then (after the reason the distributions give) the fix.
    const pool = row("pool");
    assert.ok(pool.startsWith(squashed("FAIL pool=default: no such pool (no pools at all)")), pool);
    assert.ok(
      pool.endsWith(
        squashed(
          "virsh pool-define-as default dir --target /var/lib/libvirt/images; virsh pool-build default; virsh pool-start default; virsh pool-autostart default [--fix does this]",
        ),
      ),
      pool,
    );
    const network = row("network");
    assert.ok(
      network.startsWith(squashed("FAIL network.name=default: defined but not active")),
      network,
    );
    assert.ok(
      network.endsWith(
        squashed("virsh net-start default; virsh net-autostart default [--fix does this]"),
      ),
      network,
    );
    assert.match(
      result.stdout,
      /1 of 1 host\(s\) not ready; `egress-proxies doctor --fix` applies/,
    );
    assert.doesNotMatch(result.stdout + result.stderr, /PRIVATE KEY/);
  });

  it("--json says the same as one document", () => {
    const result = egressProxies(["doctor", "--json", ...overSsh]);
    assert.equal(result.status, 1, result.stderr);
    const report = JSON.parse(result.stdout) as JsonReport;
    assert.equal(report.ok, false);
    assert.equal(report.hosts.length, 1);
    const host = report.hosts[0]!;
    assert.equal(host.host, `${stock.sshHost}:${stock.sshPort}`);
    assert.equal(host.ready, false);
    const status = Object.fromEntries(host.checks.map((c) => [c.check, [c.status, c.safeFix]]));
    assert.deepEqual(status.pool, ["fail", "create-default-pool"]);
    assert.deepEqual(status.network, ["fail", "start-network"]);
    assert.deepEqual(host.fixed, []);
  });

  it("--fix defines, builds, starts and autostarts pool default and starts network default, says so, and exits 0", () => {
    // As the domain-type row's fix says on a host without KVM (the lab's hosts have none).
    const fixed = egressProxies(["doctor", "--fix", "--domain-type", "qemu", ...overSsh]);
    assert.equal(fixed.status, 0, fixed.stdout + fixed.stderr);
    assert.match(
      squashed(fixed.stdout), // the line wraps at 80 columns
      /fixedon127\.0\.0\.1:\d+:defined,built,startedandautostartedthedirpooldefaultat\/var\/lib\/libvirt\/images/,
    );
    assert.match(
      squashed(fixed.stdout),
      /fixedon127\.0\.0\.1:\d+:startedandautostartedthenetworkdefault/,
    );
    assert.match(fixed.stdout, /1 host\(s\) ready/);
    // What libvirt itself says now.
    assert.match(
      stockVirsh(stock, "pool-dumpxml", "default"),
      /<path>\/var\/lib\/libvirt\/images<\/path>/,
    );
    assert.match(
      stockVirsh(stock, "pool-info", "default"),
      /State:\s+running[\s\S]*Autostart:\s+yes/,
    );
    assert.match(stockVirsh(stock, "net-info", "default"), /Active:\s+yes[\s\S]*Autostart:\s+yes/);
    // A second run has nothing left to do.
    const again = egressProxies(["doctor", "--fix", "--json", "--domain-type", "qemu", ...overSsh]);
    assert.equal(again.status, 0, again.stderr);
    const report = JSON.parse(again.stdout) as JsonReport;
    assert.deepEqual(report.hosts[0]!.fixed, []);
    assert.deepEqual(
      report.hosts[0]!.checks.filter((c) => c.status !== "ok"),
      [],
      "every check passes for emulated guests, the firmware from qemu's own capabilities",
    );
    // Without --domain-type the fixes are in place, and the one failure left is KVM's, which --fix
    // cannot give a host: exit 1, firmware answered for emulation.
    const kvm = egressProxies(["doctor", "--fix", "--json", ...overSsh]);
    assert.equal(kvm.status, 1, kvm.stdout + kvm.stderr);
    const kvmReport = JSON.parse(kvm.stdout) as JsonReport;
    assert.deepEqual(
      kvmReport.hosts[0]!.checks.filter((c) => c.status !== "ok").map((c) => [c.check, c.status]),
      [["domain-type", "fail"]],
    );
    assert.deepEqual(kvmReport.hosts[0]!.fixed, []);
  });

  it("reports a fix the host refuses, still applies the others, and exits 1", () => {
    // Another pool already owns the distribution's image directory: libvirt refuses a second one there.
    stockVirsh(stock, "pool-define-as", "images", "dir", "--target", "/var/lib/libvirt/images");
    const result = egressProxies(["doctor", "--fix", ...overSsh]);
    assert.equal(result.status, 1, result.stdout + result.stderr);
    assert.match(
      squashed(result.stdout),
      /fixedon127\.0\.0\.1:\d+:couldnotcreatedefaultpool:.*images/,
    );
    assert.match(
      squashed(result.stdout),
      /fixedon127\.0\.0\.1:\d+:startedandautostartedthenetworkdefault/,
    );
    const rows = doctorTableRows(result.stdout);
    const row = (check: string) => {
      const found = rows.find((candidate) => candidate.check === check);
      return found === undefined ? "" : squashed(`${found.status} ${found.what}`);
    };
    assert.ok(
      row("pool").startsWith(
        squashed("FAIL pool=default: no such pool (pools: images (inactive))"),
      ),
      row("pool"),
    );
    assert.ok(
      row("network").startsWith(squashed("OK network.name=default: active")),
      row("network"),
    );
  });

  it("tells a user outside group libvirt about the group and a new login, and exits 1", () => {
    const result = egressProxies(["doctor", "--socket", stock.libvirtSocket], { asNobody: true });
    assert.equal(result.status, 1, result.stdout + result.stderr);
    // Said once, in the table (not repeated on stderr).
    const [row] = doctorTableRows(result.stdout);
    assert.match(
      squashed(row?.what ?? ""),
      /^cannotconnecttolibvirtsocket.*EACCES.*addtheusertothelibvirtgroup\(sudousermod-aGlibvirt\$USER\)andloginagain/,
    );
    assert.equal(result.stderr, "");
  });

  it("checks every KVM backend of a stack config under its config key", () => {
    const dir = mkdtempSync(join(tmpdir(), "doctor-config-"));
    try {
      const file = join(dir, "config.json");
      // A whole config, as the root program's own check wants it (count included).
      const pool = {
        count: 2,
        backends: [
          {
            name: "stock",
            kvm: {
              connection: {
                host: stock.sshHost,
                port: stock.sshPort,
                user: stock.sshUser,
                knownHosts: readFileSync(stock.knownHosts, "utf8"),
              },
              socketPath: stock.libvirtSocket,
              pool: "vms",
              network: { name: "default" },
            },
          },
          {
            name: "pve",
            proxmox: { node: "pve", templateVmid: 9000, diskStorage: "x", seedStorage: "y" },
          },
        ],
      };
      // The shape of `pulumi config --json --show-secrets`.
      writeFileSync(
        file,
        JSON.stringify({
          "egress-proxies:pool": { value: JSON.stringify(pool), objectValue: pool, secret: false },
          "egress-proxies:kvmPrivateKey": {
            value: readFileSync(stock.clientKey, "utf8"),
            secret: true,
          },
        }),
      );
      const result = egressProxies(["doctor", "--json", "--config-json", file]);
      assert.equal(result.status, 1, result.stderr);
      const report = JSON.parse(result.stdout) as JsonReport;
      assert.deepEqual(
        report.hosts.map((h) => h.name),
        ["stock"],
        "Proxmox backends are not the doctor's",
      );
      const poolCheck = report.hosts[0]!.checks.find((c) => c.check === "pool")!;
      assert.equal(poolCheck.input, "egress-proxies:pool.backends[0].kvm.pool");
      assert.equal(poolCheck.status, "fail");
      assert.equal(poolCheck.safeFix, undefined, "only the pool named default is created by --fix");
      assert.doesNotMatch(result.stdout, /PRIVATE KEY/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("KvmProxy create on the stock host fails before making anything, with the fixes", async () => {
    const { inputs } = await kvm.check(
      {},
      {
        vmName: "stock-preflight-1",
        owner: { project: "egress-lab", stack: "doctor", resource: "p" },
        socketPath: stock.libvirtSocket,
        image: { url: "http://127.0.0.1:9/never-fetched.qcow2", sha256: "0".repeat(64) },
        readiness: { mode: "none" },
      },
    );
    const error = await kvm.create(inputs).then(
      () => assert.fail("create must not succeed on a stock host"),
      (caught: unknown) => caught as Error,
    );
    assert.equal(errorClassOf(error), "Permanent");
    assert.match(error.message, /host local is not ready for this VM \(nothing was created\)/);
    assert.match(
      error.message,
      /- pool "default": no such pool .*virsh pool-define-as default dir/,
    );
    assert.match(
      error.message,
      /- network\.name "default": defined but not active.*virsh net-start default/,
    );
    assert.match(error.message, /- domainType "kvm": no KVM .*Fix: set domainType: "qemu"/);
    assert.equal(stockVirsh(stock, "list", "--all", "--name").trim(), "", "no domain was defined");
    assert.match(stockVirsh(stock, "pool-list", "--all"), /^\s*$/, "no pool was made");
  });
});
