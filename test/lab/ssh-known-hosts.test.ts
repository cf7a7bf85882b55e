/**
 * Host-key verification and credentials against the lab's real sshd, which
 * has ed25519, ecdsa and rsa host keys (ed25519 is its first choice), and
 * against a throwaway sshd of this test's own that has an RSA key only.
 */
import assert from "node:assert/strict";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect, createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { classifyLibvirtError } from "../../provider/kvm/classify";
import { Procedures } from "../../provider/libvirt-rpc-xdr";
import {
  SshAuthError,
  SshConfigError,
  SshHostKeyError,
  dialSsh,
  fingerprintOf,
  hashKnownHostsName,
  openLibvirtOverSsh,
  type SshTarget,
} from "../../provider/ssh";
import { SecretValue } from "../../provider/common/redact";
import { useLab, type LabEnv } from "./fixture";
import { rejectionOf } from "./helpers";
import { labSshTarget } from "./ssh-helpers";

const run = promisify(execFile);

describe("ssh host keys and credentials against the lab's sshd", function () {
  this.timeout(60_000);
  let lab: LabEnv;
  let hostKeys: Record<"ed25519" | "ecdsa" | "rsa", string>;
  let scratch: string;

  before(async function () {
    this.timeout(180_000);
    lab = await useLab();
    const [ed25519, ecdsa, rsa] = lab.hostKeys.map((file) =>
      readFileSync(file, "utf8").split(" ").slice(0, 2).join(" "),
    );
    hostKeys = { ed25519: ed25519!, ecdsa: ecdsa!, rsa: rsa! };
    scratch = mkdtempSync(join(tmpdir(), "egress-ssh-test-"));
  });
  after(() => rmSync(scratch, { recursive: true, force: true }));

  async function connectWith(overrides: Partial<SshTarget>): Promise<string> {
    const conn = await openLibvirtOverSsh(labSshTarget(lab, overrides), {
      handshakeTimeoutMs: 10_000,
    });
    try {
      return await conn.call(Procedures.connectGetHostname, undefined);
    } finally {
      await conn.close();
    }
  }

  const hostName = () => `[${lab.sshHost}]:${lab.sshPort}`;

  it("accepts the host through a hashed known_hosts entry", async () => {
    const hashed = hashKnownHostsName(hostName(), randomBytes(20));
    assert.ok((await connectWith({ knownHosts: `${hashed} ${hostKeys.ed25519}\n` })).length > 0);
  });

  it("accepts the host through a plain [host]:port entry among others", async () => {
    const knownHosts = [
      `# lab`,
      `other.example ${hostKeys.rsa}`,
      `${hostName()} ${hostKeys.ed25519}`,
    ].join("\n");
    assert.ok((await connectWith({ knownHosts })).length > 0);
  });

  it("offers the pinned key type when it is not the server's first choice (rsa, ecdsa)", async () => {
    assert.ok((await connectWith({ knownHosts: `${hostName()} ${hostKeys.rsa}\n` })).length > 0);
    assert.ok((await connectWith({ knownHosts: `${hostName()} ${hostKeys.ecdsa}\n` })).length > 0);
  });

  it("rejects an entry without the port: the host is unknown on 2222", async () => {
    const error = await rejectionOf(
      connectWith({ knownHosts: `${lab.sshHost} ${hostKeys.ed25519}\n` }),
    );
    assert.ok(error instanceof SshHostKeyError, error.message);
    assert.equal(error.problem, "unknown");
    assert.equal(classifyLibvirtError(error).errorClass, "Permanent");
  });

  it("rejects a wrong key as a permanent error naming the host and the fingerprint", async () => {
    const keyFile = join(scratch, "other_host_key");
    await run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", keyFile]);
    const wrong = readFileSync(`${keyFile}.pub`, "utf8").split(" ").slice(0, 2).join(" ");
    const error = await rejectionOf(connectWith({ knownHosts: `${hostName()} ${wrong}\n` }));
    assert.ok(error instanceof SshHostKeyError, error.message);
    assert.equal(error.problem, "mismatch");
    const presented = fingerprintOf(Buffer.from(hostKeys.ed25519.split(" ")[1]!, "base64"));
    assert.equal(error.fingerprint, presented);
    assert.match(error.message, /\[127\.0\.0\.1\]:2222/);
    assert.ok(error.message.includes(presented));
    assert.equal(classifyLibvirtError(error).errorClass, "Permanent");
  });

  it("rejects a revoked key even when a plain entry also lists it", async () => {
    const knownHosts = `${hostName()} ${hostKeys.ed25519}\n@revoked * ${hostKeys.ed25519}\n`;
    const error = await rejectionOf(connectWith({ knownHosts }));
    assert.ok(error instanceof SshHostKeyError, error.message);
    assert.equal(error.problem, "revoked");
    assert.equal(classifyLibvirtError(error).errorClass, "Permanent");
  });

  it("connects with no known_hosts at all only through the insecure opt-out", async () => {
    const refused = await rejectionOf(connectWith({ knownHosts: "" }));
    assert.ok(refused instanceof SshHostKeyError);
    assert.ok(
      (await connectWith({ knownHosts: "", insecureSkipHostKeyVerification: true })).length > 0,
    );
  });

  it("uses an encrypted key with its passphrase, and names the problem without the secret when it is wrong", async () => {
    const passphrase = readFileSync(lab.clientKeyPassphraseFile, "utf8").trim();
    const privateKey = new SecretValue(readFileSync(lab.clientKeyWithPassphrase, "utf8"));
    assert.ok(
      (await connectWith({ privateKey, passphrase: new SecretValue(passphrase) })).length > 0,
    );
    const wrong = await rejectionOf(connectWith({ privateKey, passphrase: "not-the-passphrase" }));
    assert.ok(wrong instanceof SshConfigError, wrong.message);
    assert.match(wrong.message, /passphrase/);
    assert.ok(!wrong.message.includes("not-the-passphrase"));
    const missing = await rejectionOf(connectWith({ privateKey }));
    assert.ok(missing instanceof SshConfigError);
    assert.equal(classifyLibvirtError(missing).errorClass, "Permanent");
  });

  it("falls back to ~/.ssh/id_ed25519, and a key the host does not know is a permanent auth error", async () => {
    const home = join(scratch, "home");
    mkdirSync(join(home, ".ssh"), { recursive: true });
    copyFileSync(lab.clientKey, join(home, ".ssh", "id_ed25519"));
    const target: Partial<SshTarget> = {
      privateKey: undefined,
      agentSocket: "",
      homeDirectory: home,
    };
    assert.ok((await connectWith(target)).length > 0);

    const strangerHome = join(scratch, "stranger");
    mkdirSync(join(strangerHome, ".ssh"), { recursive: true });
    await run("ssh-keygen", [
      "-q",
      "-t",
      "ed25519",
      "-N",
      "",
      "-f",
      join(strangerHome, ".ssh", "id_ed25519"),
    ]);
    const error = await rejectionOf(connectWith({ ...target, homeDirectory: strangerHome }));
    assert.ok(error instanceof SshAuthError, error.message);
    assert.equal(classifyLibvirtError(error).errorClass, "Permanent");
  });

  describe("with an ssh-agent", () => {
    let agent: ChildProcess | undefined;
    let socket: string;
    before(async () => {
      socket = join(scratch, "agent.sock");
      agent = spawn("ssh-agent", ["-D", "-a", socket], { stdio: "ignore" });
      for (let i = 0; i < 50; i++) {
        try {
          await run("ssh-add", ["-l"], { env: { ...process.env, SSH_AUTH_SOCK: socket } });
          break;
        } catch (error) {
          // exit 1 = agent up but empty; 2 = not reachable yet
          if ((error as { code?: number }).code === 1) break;
          await new Promise((r) => setTimeout(r, 100));
        }
      }
      await run("ssh-add", [lab.clientKey], { env: { ...process.env, SSH_AUTH_SOCK: socket } });
    });
    // Waits for the agent to be gone: it unlinks its socket as it exits, and a scratch directory
    // removed while it does so was left half removed (three times in nine runs, outside the runner).
    after(async () => {
      if (agent?.pid === undefined || agent.exitCode !== null || agent.signalCode !== null) return;
      const exited = new Promise<void>((resolve) => agent!.once("exit", () => resolve()));
      process.kill(agent.pid, "SIGTERM");
      await exited;
    });

    it("authenticates through SSH_AUTH_SOCK when no key is configured", async () => {
      const emptyHome = join(scratch, "empty-home");
      mkdirSync(emptyHome, { recursive: true });
      assert.ok(
        (
          await connectWith({
            privateKey: undefined,
            agentSocket: socket,
            homeDirectory: emptyHome,
          })
        ).length > 0,
      );
    });
  });
});

/** A free loopback port: bound, read, released (sshd binds it right after). */
async function freeLoopbackPort(address = "127.0.0.1"): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, address, resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

async function waitForPort(
  port: number,
  sshd: ChildProcess,
  log: () => string,
  host = "127.0.0.1",
): Promise<void> {
  for (let attempt = 0; attempt < 100; attempt++) {
    if (sshd.exitCode !== null) throw new Error(`sshd exited (${sshd.exitCode}): ${log()}`);
    const open = await new Promise<boolean>((resolve) => {
      const socket = connect({ host, port }, () => {
        socket.destroy();
        resolve(true);
      });
      socket.on("error", () => resolve(false));
    });
    if (open) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`sshd did not listen on ${host} port ${port} within 5 s: ${log()}`);
}

describe("ssh against an sshd that no longer offers the pinned host-key type", function () {
  this.timeout(60_000);
  let scratch = "";
  let sshd: ChildProcess | undefined;
  let port: number;
  let stderr = "";
  const keyLine = (file: string) => readFileSync(file, "utf8").split(" ").slice(0, 2).join(" ");

  before(async () => {
    scratch = mkdtempSync(join(tmpdir(), "egress-sshd-rsa-only-"));
    for (const type of ["rsa", "ed25519"])
      await run("ssh-keygen", ["-q", "-t", type, "-N", "", "-f", join(scratch, `host_${type}`)]);
    port = await freeLoopbackPort();
    // Only the RSA key is served: the ed25519 one stands for the key the host used to have.
    writeFileSync(
      join(scratch, "sshd_config"),
      [
        `Port ${port}`,
        "ListenAddress 127.0.0.1",
        `HostKey ${join(scratch, "host_rsa")}`,
        "PidFile none",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        `AuthorizedKeysFile ${join(scratch, "authorized_keys")}`,
        "",
      ].join("\n"),
    );
    mkdirSync("/run/sshd", { recursive: true });
    sshd = spawn("/usr/sbin/sshd", ["-D", "-e", "-f", join(scratch, "sshd_config")], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    sshd.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    await waitForPort(port, sshd, () => stderr);
  });
  after(async () => {
    if (sshd?.pid !== undefined && sshd.exitCode === null) {
      const exited = new Promise((resolve) => sshd!.once("exit", resolve));
      process.kill(sshd.pid, "SIGTERM");
      await exited;
    }
    if (scratch !== "") rmSync(scratch, { recursive: true, force: true });
  });

  const dial = (knownHosts: string) =>
    dialSsh(
      {
        host: "127.0.0.1",
        port,
        username: "root",
        privateKey: readFileSync(join(scratch, "host_ed25519"), "utf8"),
        knownHosts,
      },
      { handshakeTimeoutMs: 10_000 },
    );

  it("is a permanent host-key error naming the pinned type, not a retryable connect error", async () => {
    const error = await rejectionOf(
      dial(`[127.0.0.1]:${port} ${keyLine(join(scratch, "host_ed25519.pub"))}\n`),
    );
    assert.ok(error instanceof SshHostKeyError, `${error.name}: ${error.message}`);
    assert.equal(error.problem, "type-not-offered");
    assert.deepEqual(error.pinnedKeyTypes, ["ssh-ed25519"]);
    assert.ok(
      error.message.includes(`[127.0.0.1]:${port} offers no host key of a type known_hosts pins`),
      error.message,
    );
    assert.ok(error.message.includes(`ssh-keyscan -p ${port} 127.0.0.1`), error.message);
    assert.equal(classifyLibvirtError(error).errorClass, "Permanent");
  });

  it("gets past the host key once known_hosts pins the key the host serves (then fails on auth)", async () => {
    const error = await rejectionOf(
      dial(`[127.0.0.1]:${port} ${keyLine(join(scratch, "host_rsa.pub"))}\n`),
    );
    assert.ok(error instanceof SshAuthError, `${error.name}: ${error.message}`);
  });
});

/**
 * A host reached by an IPv6 literal: an sshd of this test's own on ::1 (the
 * lab's listens on 127.0.0.1 only) forwarding the lab's libvirt socket.
 * known_hosts names it `[::1]:port`, as OpenSSH writes it; the config may give
 * the literal bare or bracketed as in URLs.
 */
describe("ssh to a host given by an IPv6 literal", function () {
  this.timeout(60_000);
  let lab: LabEnv;
  let scratch = "";
  let sshd: ChildProcess | undefined;
  let port: number;
  let stderr = "";
  let hostKey = "";

  before(async function () {
    this.timeout(180_000);
    lab = await useLab();
    const loopback6 = readFileSync("/proc/net/if_inet6", "utf8");
    assert.match(
      loopback6,
      /^0{31}1 .* lo$/m,
      "this machine has no ::1 on lo (IPv6 disabled?): the IPv6 host tests need it",
    );
    scratch = mkdtempSync(join(tmpdir(), "egress-sshd-ipv6-"));
    await run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", join(scratch, "host_ed25519")]);
    hostKey = readFileSync(join(scratch, "host_ed25519.pub"), "utf8")
      .split(" ")
      .slice(0, 2)
      .join(" ");
    copyFileSync(`${lab.clientKey}.pub`, join(scratch, "authorized_keys"));
    port = await freeLoopbackPort("::1");
    writeFileSync(
      join(scratch, "sshd_config"),
      [
        `Port ${port}`,
        "ListenAddress ::1",
        `HostKey ${join(scratch, "host_ed25519")}`,
        "PidFile none",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "PermitRootLogin prohibit-password",
        "AllowStreamLocalForwarding yes",
        `AuthorizedKeysFile ${join(scratch, "authorized_keys")}`,
        "",
      ].join("\n"),
    );
    mkdirSync("/run/sshd", { recursive: true });
    sshd = spawn("/usr/sbin/sshd", ["-D", "-e", "-f", join(scratch, "sshd_config")], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    sshd.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    await waitForPort(port, sshd, () => stderr, "::1");
  });
  after(async () => {
    if (sshd?.pid !== undefined && sshd.exitCode === null) {
      const exited = new Promise((resolve) => sshd!.once("exit", resolve));
      process.kill(sshd.pid, "SIGTERM");
      await exited;
    }
    if (scratch !== "") rmSync(scratch, { recursive: true, force: true });
  });

  const target = (host: string, knownHosts: string): SshTarget =>
    labSshTarget(lab, { host, port, knownHosts, knownHostsFile: undefined });

  for (const host of ["::1", "[::1]", "0:0:0:0:0:0:0:1"])
    it(`reaches libvirt through ${host}, verified by known_hosts' [::1]:port entry`, async () => {
      const conn = await openLibvirtOverSsh(target(host, `[::1]:${port} ${hostKey}\n`), {
        handshakeTimeoutMs: 10_000,
      });
      try {
        assert.ok((await conn.call(Procedures.connectGetHostname, undefined)).length > 0);
      } finally {
        await conn.close();
      }
    });

  it("does not take 127.0.0.1's entry for ::1, and names the host bracketed", async () => {
    const error = await rejectionOf(
      openLibvirtOverSsh(target("::1", `[127.0.0.1]:${port} ${hostKey}\n`), {
        handshakeTimeoutMs: 10_000,
      }),
    );
    assert.ok(error instanceof SshHostKeyError, `${error.name}: ${error.message}`);
    assert.equal(error.problem, "unknown");
    assert.ok(error.message.includes(`[::1]:${port}`), error.message);
    assert.ok(!error.message.includes(`::1:${port}`), error.message);
  });
});
