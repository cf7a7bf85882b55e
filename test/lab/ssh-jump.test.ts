/**
 * Jump hosts against real sshds: a hypervisor that this machine cannot reach
 * except through a jump host. Both sshds of this test run inside the lab's
 * network namespace: the "hypervisor" listens on the namespace's own loopback
 * (unreachable from here: 127.0.0.1 here is another host), forwarding the
 * lab's libvirt socket; the jump host listens on the lab bridge, which this
 * machine reaches through the lab's host link. So a link that works went
 * through the jump, and each has host keys of its own for known_hosts to check.
 */
import { strict as assert } from "node:assert";
import { execFileSync, spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomInt } from "node:crypto";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { errorClassOf } from "../../provider/common/errors";
import { classifyLibvirtError } from "../../provider/kvm/classify";
import { closeAllHosts } from "../../provider/kvm/connect";
import * as kvm from "../../provider/kvm/provider";
import { Procedures } from "../../provider/libvirt-rpc-xdr";
import {
  SshConnectError,
  SshHostKeyError,
  openLibvirtOverSsh,
  type SshHop,
  type SshTarget,
} from "../../provider/ssh";
import { useLab, type LabEnv } from "./fixture";
import { rejectionOf } from "./helpers";
import {
  ensureProxyImage,
  linkHostToLab,
  removeCachedBaseImage,
  serveImage,
  type ProxyImage,
  type RunningServer,
} from "./kvm-support";

/** The command-line program, as users run it (dist/cli/main.js). */
const CLI = join(__dirname, "..", "..", "cli", "main.js");

interface LabSshd {
  process: ChildProcess;
  /** What sshd said so far (-e: its log on stderr), shown when a test fails. */
  log(): string;
  port: number;
  /** `ssh-ed25519 AAAA...`, for known_hosts lines. */
  hostKey: string;
}

describe("ssh through a jump host to a hypervisor reachable only through it", function () {
  this.timeout(120_000);
  let lab: LabEnv;
  let scratch = "";
  let clientKey = "";
  let jump: LabSshd;
  let hypervisor: LabSshd;
  const started: ChildProcess[] = [];

  /** An sshd inside the lab's namespace on `address`, with its own ed25519 host key. */
  async function startLabSshd(name: string, address: string, extra: string[]): Promise<LabSshd> {
    const dir = join(scratch, name);
    execFileSync("mkdir", ["-p", dir]);
    execFileSync("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", join(dir, "host_key")]);
    copyFileSync(`${lab.clientKey}.pub`, join(dir, "authorized_keys"));
    // A port in the namespace nothing else of the lab listens on (its daemons hold no TCP ports).
    const port = randomInt(20_000, 60_000);
    writeFileSync(
      join(dir, "sshd_config"),
      [
        `ListenAddress ${address}:${port}`,
        `HostKey ${join(dir, "host_key")}`,
        `AuthorizedKeysFile ${join(dir, "authorized_keys")}`,
        "PidFile none",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        ...extra,
        "",
      ].join("\n"),
    );
    const child = spawn(
      "ip",
      ["netns", "exec", lab.netns, "/usr/sbin/sshd", "-D", "-e", "-f", join(dir, "sshd_config")],
      { stdio: ["ignore", "ignore", "pipe"] },
    );
    started.push(child);
    let log = "";
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`${name} sshd did not listen within 10 s: ${log}`)),
        10_000,
      );
      child.stderr!.on("data", (chunk: Buffer) => {
        log += chunk.toString();
        if (log.includes(`Server listening on ${address} port ${port}`)) {
          clearTimeout(timer);
          resolve();
        }
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`${name} sshd exited (${code}): ${log}`));
      });
    });
    const hostKey = readFileSync(join(dir, "host_key.pub"), "utf8")
      .split(" ")
      .slice(0, 2)
      .join(" ");
    return { process: child, port, hostKey, log: () => log };
  }

  before(async function () {
    this.timeout(180_000);
    lab = await useLab();
    await linkHostToLab(lab);
    scratch = mkdtempSync(join(tmpdir(), "egress-ssh-jump-"));
    clientKey = readFileSync(lab.clientKey, "utf8");
    jump = await startLabSshd("jump", lab.bridgeAddress, ["AllowTcpForwarding yes"]);
    hypervisor = await startLabSshd("hypervisor", "127.0.0.1", [
      "AllowTcpForwarding yes", // "no" denies the socket forward as well
      "AllowStreamLocalForwarding yes",
    ]);
  });

  afterEach(function () {
    if (this.currentTest?.state === "failed")
      for (const [name, sshd] of [
        ["jump host", jump],
        ["hypervisor", hypervisor],
      ] as const)
        console.error(`--- ${name} sshd log ---\n${sshd?.log().slice(-3000) ?? "(not started)"}`);
  });

  after(async () => {
    await closeAllHosts();
    for (const child of started)
      if (child.pid !== undefined && child.exitCode === null) {
        const exited = new Promise((resolve) => child.once("exit", resolve));
        process.kill(child.pid, "SIGTERM");
        await exited;
      }
    if (scratch !== "") rmSync(scratch, { recursive: true, force: true });
  });

  const jumpHop = (overrides: Partial<SshHop> = {}): SshHop => ({
    host: lab.bridgeAddress,
    port: jump.port,
    username: "root",
    privateKey: clientKey,
    knownHosts: `[${lab.bridgeAddress}]:${jump.port} ${jump.hostKey}\n`,
    ...overrides,
  });
  const hypervisorTarget = (jumps: SshHop[]): SshTarget => ({
    host: "127.0.0.1",
    port: hypervisor.port,
    username: "root",
    privateKey: clientKey,
    knownHosts: `[127.0.0.1]:${hypervisor.port} ${hypervisor.hostKey}\n`,
    socketPath: lab.libvirtSocket,
    uri: lab.uri,
    jumps,
  });

  it("reaches libvirt on the hypervisor through the jump host, both host keys verified", async () => {
    const conn = await openLibvirtOverSsh(hypervisorTarget([jumpHop()]), {
      handshakeTimeoutMs: 10_000,
    });
    try {
      assert.ok((await conn.call(Procedures.connectGetHostname, undefined)).length > 0);
    } finally {
      await conn.close();
    }
  });

  it("cannot reach the hypervisor without the jump host (the test proves the path)", async () => {
    const error = await rejectionOf(
      openLibvirtOverSsh(hypervisorTarget([]), { handshakeTimeoutMs: 5_000 }),
    );
    // 127.0.0.1 here is this machine, where nothing (or another sshd, with other host keys) answers.
    assert.ok(
      error instanceof SshConnectError || error instanceof SshHostKeyError,
      `${error.name}: ${error.message}`,
    );
  });

  it("refuses a wrong host key on the jump host, naming the hop, before anything reaches the hypervisor", async () => {
    const wrongKey = hypervisor.hostKey;
    const error = await rejectionOf(
      openLibvirtOverSsh(
        hypervisorTarget([
          jumpHop({ knownHosts: `[${lab.bridgeAddress}]:${jump.port} ${wrongKey}\n` }),
        ]),
        { handshakeTimeoutMs: 10_000 },
      ),
    );
    assert.ok(error instanceof SshHostKeyError, `${error.name}: ${error.message}`);
    assert.equal(error.problem, "mismatch");
    assert.ok(
      error.message.startsWith(`jump host root@${lab.bridgeAddress}:${jump.port}: ssh host `),
      error.message,
    );
    assert.equal(errorClassOf(classifyLibvirtError(error)), "Permanent");
  });

  it("refuses a wrong host key on the hypervisor behind a good jump host", async () => {
    const target = {
      ...hypervisorTarget([jumpHop()]),
      knownHosts: `[127.0.0.1]:${hypervisor.port} ${jump.hostKey}\n`,
    };
    const error = await rejectionOf(openLibvirtOverSsh(target, { handshakeTimeoutMs: 10_000 }));
    assert.ok(error instanceof SshHostKeyError, `${error.name}: ${error.message}`);
    assert.ok(error.message.startsWith(`ssh host [127.0.0.1]:${hypervisor.port} `), error.message);
  });

  it("says which hop could not open the next connection", async () => {
    const target = { ...hypervisorTarget([jumpHop()]), port: 1 };
    const error = await rejectionOf(openLibvirtOverSsh(target, { handshakeTimeoutMs: 10_000 }));
    assert.ok(error instanceof SshConnectError, `${error.name}: ${error.message}`);
    assert.match(
      error.message,
      new RegExp(
        `^jump host root@${lab.bridgeAddress.replace(/\./g, "\\.")}:${jump.port} cannot open a connection to 127\\.0\\.0\\.1:1: `,
      ),
    );
  });

  it("egress-proxies doctor checks the hypervisor through --jump", () => {
    const knownHostsFile = join(scratch, "known_hosts");
    writeFileSync(
      knownHostsFile,
      `[127.0.0.1]:${hypervisor.port} ${hypervisor.hostKey}\n[${lab.bridgeAddress}]:${jump.port} ${jump.hostKey}\n`,
    );
    const args = [
      ...["--host", "127.0.0.1", "--port", String(hypervisor.port), "--identity", lab.clientKey],
      ...["--known-hosts", knownHostsFile, "--jump", `root@${lab.bridgeAddress}:${jump.port}`],
      ...["--socket", lab.libvirtSocket, "--pool", lab.pool, "--bridge", lab.bridge],
      ...["--domain-type", "qemu", "--firmware", "bios", "--json"],
    ];
    const result = spawnSync(process.execPath, [CLI, "doctor", ...args], {
      encoding: "utf8",
      timeout: 60_000,
    });
    assert.equal(result.error, undefined);
    const report = JSON.parse(result.stdout) as { hosts: { host: string; ready: boolean }[] };
    assert.equal(report.hosts[0]?.host, `127.0.0.1:${hypervisor.port}`, result.stdout);
    assert.equal(report.hosts[0]?.ready, true, result.stdout);
    assert.equal(result.status, 0, `${result.stdout}\n${result.stderr}`);
    // A wrong key for the jump host: doctor says which hop, and the host is not ready.
    writeFileSync(knownHostsFile, `[127.0.0.1]:${hypervisor.port} ${hypervisor.hostKey}\n`);
    const refused = spawnSync(process.execPath, [CLI, "doctor", ...args.slice(0, -1)], {
      encoding: "utf8",
      timeout: 60_000,
    });
    assert.equal(refused.status, 1, refused.stdout + refused.stderr);
    assert.match(
      refused.stdout,
      new RegExp(`jump host root@${lab.bridgeAddress.replace(/\./g, "\\.")}:${jump.port}`),
    );
  });

  describe("KvmProxy through connection.proxyJump", () => {
    let image: ProxyImage;
    let imageServer: RunningServer;
    const owner = { project: "egress-lab", stack: "ssh-jump-test", resource: "proxy" };

    before(async function () {
      this.timeout(300_000);
      image = await ensureProxyImage();
      // The hypervisor downloads nothing: the provider (here) fetches the image and uploads it.
      imageServer = await serveImage(image);
    });
    after(async () => {
      await closeAllHosts();
      if (imageServer) {
        const inspector = await openLibvirtOverSsh(hypervisorTarget([jumpHop()]), {
          handshakeTimeoutMs: 10_000,
        });
        try {
          await removeCachedBaseImage(inspector, lab.pool, imageServer.url, image.sha256);
        } finally {
          await inspector.close();
        }
        await imageServer.close();
      }
    });

    it("creates, reads and deletes a proxy VM, every call through the jump host", async () => {
      const vmName = `jump-${randomInt(1e6, 1e7 - 1)}`;
      const inputs = {
        owner,
        vmName,
        connection: {
          host: "127.0.0.1",
          port: hypervisor.port,
          privateKey: clientKey,
          knownHosts: [
            `[127.0.0.1]:${hypervisor.port} ${hypervisor.hostKey}`,
            `[${lab.bridgeAddress}]:${jump.port} ${jump.hostKey}`,
          ].join("\n"),
          proxyJump: `root@${lab.bridgeAddress}:${jump.port}`,
        },
        socketPath: lab.libvirtSocket,
        pool: lab.pool,
        network: { bridge: lab.bridge },
        domainType: "qemu",
        firmware: "bios",
        vcpus: 1,
        memoryMiB: 256,
        diskGiB: 3,
        image: { url: imageServer.url, sha256: image.sha256 },
        readiness: { mode: "none" },
        // Defined and never started: nothing here needs the guest to boot.
        running: false,
      };
      const checked = await kvm.check({}, inputs);
      assert.deepEqual(checked.failures ?? [], []);
      const created = await kvm.create(checked.inputs);
      let deleted = false;
      try {
        assert.equal(created.id, `hosts/127.0.0.1:${hypervisor.port}/domains/${vmName}`);
        const read = await kvm.read(created.id, created.outs);
        assert.equal(read.id, created.id);
        assert.equal((read.props as { vmName: string }).vmName, vmName);
        await kvm.remove(created.id, created.outs);
        deleted = true;
        assert.deepEqual(await kvm.read(created.id, created.outs), {});
      } finally {
        if (!deleted) await kvm.remove(created.id, created.outs).catch(() => undefined);
      }
    });
  });
});
