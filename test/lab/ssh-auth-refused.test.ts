/**
 * A host that says no to our key is asked once. Against the lab's real sshd,
 * reached through a loopback relay that counts TCP connections: KvmProxy's
 * create and read with a key the host does not know end after one login, with
 * a Permanent error naming the user, the host and where the key came from
 * (with its public fingerprint, never the key); so does a login that offers
 * more keys than sshd's MaxAuthTries (6) allows, which sshd ends with a
 * disconnect ("Too many authentication failures") rather than a failure.
 */
import assert from "node:assert/strict";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { utils } from "ssh2";
import { errorClassOf } from "../../provider/common/errors";
import { closeAllHosts, rememberKvmProviderConfig } from "../../provider/kvm/connect";
import * as kvm from "../../provider/kvm/provider";
import { dialSsh, fingerprintOf, releaseSshClient, SshAuthError } from "../../provider/ssh";
import { useLab, type LabEnv } from "./fixture";

const run = promisify(execFile);
const owner = { project: "egress-lab", stack: "ssh-auth-refused", resource: "proxy" };

/** A TCP relay to the lab's sshd that counts the connections made through it. */
async function countingRelay(target: {
  host: string;
  port: number;
}): Promise<{ port: number; connections: () => number; close: () => Promise<void> }> {
  let connections = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    connections++;
    const upstream = connect(target.port, target.host);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on("close", () => sockets.delete(socket));
      socket.on("error", () => undefined);
    }
    client.pipe(upstream).pipe(client);
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  return {
    port: (server.address() as AddressInfo).port,
    connections: () => connections,
    close: () =>
      new Promise((done) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => done());
      }),
  };
}

async function failure(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a refusal, but the login succeeded");
}

describe("ssh: a host that refuses our key is asked once (lab sshd)", function () {
  this.timeout(120_000);
  let lab: LabEnv;
  let scratch: string;
  let relay: Awaited<ReturnType<typeof countingRelay>>;
  let strangerKey: string;
  let strangerFingerprint: string;
  let knownHosts: string;

  before(async () => {
    lab = await useLab();
    scratch = mkdtempSync(join(tmpdir(), "egress-ssh-refused-"));
    const keyFile = join(scratch, "stranger");
    await run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", keyFile]);
    strangerKey = readFileSync(keyFile, "utf8");
    const parsed = utils.parseKey(strangerKey);
    assert.ok(!(parsed instanceof Error));
    strangerFingerprint = fingerprintOf(parsed.getPublicSSH());
    relay = await countingRelay({ host: lab.sshHost, port: lab.sshPort });
    // The lab's host keys, pinned for the relay's address.
    knownHosts = readFileSync(lab.knownHosts, "utf8").replaceAll(
      `[${lab.sshHost}]:${lab.sshPort}`,
      `[127.0.0.1]:${relay.port}`,
    );
  });

  after(async () => {
    rememberKvmProviderConfig(undefined);
    await closeAllHosts();
    await relay?.close();
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  async function inputs(connection: Record<string, unknown>): Promise<Record<string, unknown>> {
    const { inputs: checked, failures } = await kvm.check(
      {},
      {
        owner,
        vmName: "refused-login",
        connection: {
          host: "127.0.0.1",
          port: relay.port,
          user: lab.sshUser,
          knownHosts,
          agentSocket: "",
          ...connection,
        },
        socketPath: lab.libvirtSocket,
        pool: lab.pool,
        network: { bridge: lab.bridge },
        image: { url: "https://images.example/never-fetched.qcow2" },
        readiness: { mode: "none" },
        timeouts: { createSeconds: 60, readySeconds: 5, deleteSeconds: 30 },
      },
    );
    assert.deepEqual(failures, []);
    return checked;
  }

  function assertRefusal(error: Error, source: RegExp): void {
    assert.equal(errorClassOf(error), "Permanent", `${error.name}: ${error.message}`);
    assert.ok(
      error.message.includes(`ssh to ${lab.sshUser}@127.0.0.1:${relay.port}`),
      error.message,
    );
    assert.match(error.message, /the host accepted none of the offered credentials/);
    assert.match(error.message, source);
    assert.ok(!error.message.includes("PRIVATE KEY"), "no key material in the message");
  }

  it("create with connection.privateKey the host does not know: one login, Permanent, naming the key's source", async () => {
    const before = relay.connections();
    const error = await failure(kvm.create(await inputs({ privateKey: strangerKey })));
    console.log(`      error: ${error.message}`);
    assert.equal(relay.connections() - before, 1, "exactly one SSH connection");
    assertRefusal(
      error,
      new RegExp(
        `the key from connection\\.privateKey \\(ssh-ed25519 ${strangerFingerprint.replace(/[+/]/g, "\\$&")}\\)`,
      ),
    );
  });

  it("read and delete with the provider config's key: one login each, naming egress-proxies:kvmPrivateKey", async () => {
    rememberKvmProviderConfig({
      get: (key) => (key === "egress-proxies:kvmPrivateKey" ? strangerKey : undefined),
    });
    try {
      const props = { ...(await inputs({})), vmName: "refused-login" };
      const id = `hosts/127.0.0.1/domains/refused-login`;
      for (const [what, call] of [
        ["read", () => kvm.read(id, props)],
        ["delete", () => kvm.remove(id, props)],
      ] as const) {
        const before = relay.connections();
        const error = await failure(call());
        assert.equal(relay.connections() - before, 1, `${what}: exactly one SSH connection`);
        assertRefusal(error, /the key from provider config egress-proxies:kvmPrivateKey/);
      }
    } finally {
      rememberKvmProviderConfig(undefined);
    }
  });

  describe("an ssh-agent that cannot be reached (a stale SSH_AUTH_SOCK)", () => {
    const home = (name: string, key: string | undefined) => {
      const dir = join(scratch, name);
      mkdirSync(join(dir, ".ssh"), { recursive: true });
      if (key !== undefined) copyFileSync(key, join(dir, ".ssh", "id_ed25519"));
      return dir;
    };
    const dial = (homeDirectory: string) =>
      dialSsh(
        {
          host: "127.0.0.1",
          port: relay.port,
          username: lab.sshUser,
          knownHosts,
          agentSocket: join(scratch, "no-agent-here.sock"),
          homeDirectory,
        },
        { handshakeTimeoutMs: 10_000 },
      );

    it("is passed over: the login goes on with ~/.ssh/id_ed25519", async () => {
      const client = await dial(home("home-good", lab.clientKey));
      releaseSshClient(client);
    });

    it("and no key after it is accepted: one login, an auth error that names the agent's problem", async () => {
      const before = relay.connections();
      const error = await failure(dial(home("home-stranger", join(scratch, "stranger"))));
      assert.equal(relay.connections() - before, 1, "exactly one SSH connection");
      assert.ok(error instanceof SshAuthError, `${error.name}: ${error.message}`);
      assert.match(
        error.message,
        /the keys of the ssh-agent at .*no-agent-here\.sock, then .*id_ed25519/,
      );
      assert.match(
        error.message,
        /the ssh-agent could not be used \(.*\): is SSH_AUTH_SOCK stale\?/,
      );
    });
  });

  describe("an ssh-agent offering more keys than MaxAuthTries", () => {
    let agent: ChildProcess | undefined;
    let socket: string;

    before(async () => {
      socket = join(scratch, "agent.sock");
      agent = spawn("ssh-agent", ["-D", "-a", socket], { stdio: "ignore" });
      const env = { ...process.env, SSH_AUTH_SOCK: socket };
      for (let i = 0; ; i++) {
        try {
          await run("ssh-add", ["-l"], { env });
          break;
        } catch (error) {
          // exit 1 = agent up but empty; 2 = not reachable yet
          if ((error as { code?: number }).code === 1) break;
          if (i > 50) throw error;
          await new Promise((done) => setTimeout(done, 100));
        }
      }
      for (let i = 0; i < 8; i++) {
        const file = join(scratch, `agent-key-${i}`);
        await run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-f", file]);
        await run("ssh-add", ["-q", file], { env });
      }
    });

    after(() => {
      if (agent?.pid !== undefined) process.kill(agent.pid);
    });

    it("sshd's disconnect after too many failures is the same Permanent refusal, after one login", async () => {
      const before = relay.connections();
      const error = await failure(kvm.create(await inputs({ agentSocket: socket })));
      console.log(`      error: ${error.message}`);
      assert.equal(relay.connections() - before, 1, "exactly one SSH connection");
      assertRefusal(error, new RegExp(`the keys of the ssh-agent at ${socket}`));
    });
  });
});
