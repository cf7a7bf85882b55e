// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import assert from "node:assert/strict";
import { request } from "node:https";
import { Deadline } from "../../provider/common/deadline";
import { NotFoundError, PermanentError, TransientError } from "../../provider/common/errors";
import { SecretValue } from "../../provider/common/redact";
import { ProxmoxClient } from "../../provider/proxmox/client";
import { parseUpid, waitForTask } from "../../provider/proxmox/tasks";
import { useSimulator } from "./harness";
import { PveSimulator } from "./simulator";

const deadline = () => new Deadline(10_000, "timeouts.createSeconds");

describe("pve-sim + client: transport, auth and errors", () => {
  const env = useSimulator();

  it("trusts the simulator's private CA given as PEM", async () => {
    const version = await env.client().get<{ version: string }>("/version");
    assert.equal(version.version, "9.2.20");
  });

  it("reaches an API endpoint given by an IPv6 literal, verifying the certificate's IP address", async () => {
    const sim = new PveSimulator();
    const endpoint = await sim.listen(0, "::1");
    try {
      assert.match(endpoint, /^https:\/\/\[::1\]:\d+$/);
      const client = new ProxmoxClient({
        endpoint,
        apiToken: new SecretValue(sim.tokenFor()),
        caCertPem: sim.caCertPem,
      });
      assert.equal((await client.get<{ version: string }>("/version")).version, "9.2.20");
    } finally {
      await sim.close();
    }
  });

  it("refuses an untrusted certificate with a Permanent error that names caCertPem and insecure", async () => {
    const client = new ProxmoxClient({
      endpoint: env.sim.endpoint,
      apiToken: new SecretValue(env.sim.tokenFor()),
    });
    await assert.rejects(client.get("/version"), (error: unknown) => {
      assert.ok(error instanceof PermanentError);
      assert.match(error.message, /caCertPem/);
      assert.match(error.message, /insecure/);
      return true;
    });
  });

  it("connects without verification only when insecure is set explicitly", async () => {
    const client = new ProxmoxClient({
      endpoint: env.sim.endpoint,
      apiToken: new SecretValue(env.sim.tokenFor()),
      insecure: true,
    });
    assert.equal((await client.get<{ release: string }>("/version")).release, "9");
  });

  it("F22: a wrong secret is 'Authentication failed!', Permanent, and the secret never appears", async () => {
    const secret = "wrong-secret-value-1234";
    await assert.rejects(
      env.client(`automation@pve!egress=${secret}`).get("/version"),
      (error: unknown) => {
        assert.ok(error instanceof PermanentError);
        assert.match(error.message, /401 Authentication failed!/);
        assert.doesNotMatch(error.message, new RegExp(secret));
        return true;
      },
    );
  });

  it("F22: a 401 names the token id and where it was set, for a wrong secret and an unknown id alike", async () => {
    const secret = "d5f0c1e2-wrong-secret-5a6b";
    const cases: Array<[string, string]> = [
      ["automation@pve!egress", "a wrong secret for a token that exists"],
      ["automation@pve!egres", "a token id with a typo"],
    ];
    for (const [tokenId, what] of cases) {
      const client = new ProxmoxClient({
        endpoint: env.sim.endpoint,
        apiToken: new SecretValue(`PVEAPIToken=${tokenId}=${secret}`),
        apiTokenSource: "PROXMOX_VE_API_TOKEN",
        caCertPem: env.sim.caCertPem,
      });
      await assert.rejects(client.get("/nodes"), (error: unknown) => {
        assert.ok(error instanceof PermanentError, what);
        assert.match(error.message, /401 Authentication failed!/, what);
        assert.ok(
          error.message.includes(`API token ${tokenId} (from PROXMOX_VE_API_TOKEN)`),
          `${what}: ${error.message}`,
        );
        assert.match(
          error.message,
          /give PROXMOX_VE_API_TOKEN the token as user@realm!tokenid=secret/,
        );
        assert.ok(!error.message.includes(secret), what);
        assert.ok(!JSON.stringify(error, Object.getOwnPropertyNames(error)).includes(secret));
        return true;
      });
    }
  });

  it("F22: a token from the resource's input is named as apiToken", async () => {
    await assert.rejects(
      env.client("automation@pve!egress=not-the-secret").get("/version"),
      (error: unknown) => {
        assert.ok(error instanceof PermanentError);
        assert.match(error.message, /API token automation@pve!egress \(from apiToken\)/);
        assert.ok(!error.message.includes("not-the-secret"));
        return true;
      },
    );
  });

  it("F22: no credentials at all is '401 No ticket' with an empty body (reason phrase used, F1)", async () => {
    const { status, reason, body } = await rawRequest(
      env.sim.endpoint,
      env.sim.caCertPem,
      "/api2/json/version",
    );
    assert.equal(status, 401);
    assert.equal(reason, "No ticket");
    assert.equal(body, "");
  });

  it("F2: a missing VM is a 500 that the client classifies as NotFound", async () => {
    await assert.rejects(
      env.client().get("/nodes/pve/qemu/4242/status/current"),
      (error: unknown) => {
        assert.ok(error instanceof NotFoundError);
        assert.match(
          error.message,
          /Configuration file 'nodes\/pve\/qemu-server\/4242.conf' does not exist/,
        );
        return true;
      },
    );
  });

  it("F1: a 400 carries per-parameter errors, and the client puts them in the message", async () => {
    const client = env.client();
    const upid = await client.post<string>("/nodes/pve/qemu/9000/clone", {
      newid: 150,
      name: "a",
      full: 1,
    });
    await waitForTask(client, upid, { deadline: deadline(), pollMs: 5 });
    await assert.rejects(
      client.post("/nodes/pve/qemu/150/config", { tags: "bad tag" }),
      (error: unknown) => {
        assert.ok(error instanceof PermanentError);
        assert.match(
          error.message,
          /400 Parameter verification failed\. \(tags: invalid format - invalid characters in tag\)/,
        );
        return true;
      },
    );
  });

  it("every request has a deadline: a silent server gives a Transient timeout", async () => {
    env.sim.options.latencyMs = 500;
    const client = new ProxmoxClient(
      {
        endpoint: env.sim.endpoint,
        apiToken: new SecretValue(env.sim.tokenFor()),
        caCertPem: env.sim.caCertPem,
      },
      100,
    );
    await assert.rejects(client.get("/version"), (error: unknown) => {
      assert.ok(error instanceof TransientError);
      assert.match(error.message, /no answer within 100 ms/);
      return true;
    });
    env.sim.options.latencyMs = 0;
  });

  it("a request's timeout counts from when it is sent: 24 at once over the endpoint's 4 connections, each given 300 ms, a node answering in 100 ms: every one answered", async () => {
    env.sim.options.latencyMs = 100;
    try {
      const client = new ProxmoxClient(
        {
          endpoint: env.sim.endpoint,
          apiToken: new SecretValue(env.sim.tokenFor()),
          caCertPem: env.sim.caCertPem,
        },
        300,
      );
      const dialsBefore = env.sim.tlsConnections;
      const started = Date.now();
      const answers = await Promise.all(
        Array.from({ length: 24 }, () => client.get<{ version: string }>("/version")),
      );
      assert.ok(answers.every((answer) => answer.version === "9.2.20"));
      // Six rounds of four: queued for up to 500 ms, which a timeout counted from the call would not survive.
      assert.ok(Date.now() - started >= 550, `took ${Date.now() - started} ms`);
      assert.ok(env.sim.tlsConnections - dialsBefore <= 4, "at most 4 connections were opened");
    } finally {
      env.sim.options.latencyMs = 0;
    }
  });

  it("rejects endpoints with userinfo without echoing the password", () => {
    assert.throws(
      () =>
        new ProxmoxClient({
          endpoint: "https://root:hunter22@pve:8006",
          apiToken: new SecretValue(env.sim.tokenFor()),
        }),
      (error: unknown) =>
        error instanceof PermanentError &&
        !/hunter22/.test(error.message) &&
        /apiToken/.test(error.message),
    );
  });

  it("rejects a token that is not user@realm!id=secret, naming the field", () => {
    assert.throws(
      () =>
        new ProxmoxClient({
          endpoint: env.sim.endpoint,
          apiToken: new SecretValue("just-a-secret"),
        }),
      /apiToken must look like user@realm!tokenid=secret/,
    );
    assert.throws(
      () =>
        new ProxmoxClient({
          endpoint: env.sim.endpoint,
          apiToken: new SecretValue("automation@pve=just-a-secret"),
          apiTokenSource: "config egress-proxies:proxmoxApiToken",
        }),
      (error: unknown) =>
        error instanceof PermanentError &&
        /^config egress-proxies:proxmoxApiToken must look like user@realm!tokenid=secret/.test(
          error.message,
        ) &&
        !error.message.includes("just-a-secret"),
    );
  });
});

describe("pve-sim + tasks: UPIDs, exitstatus and log tails", () => {
  const env = useSimulator({
    failTask: (type) => (type === "qmstop" ? "command 'qm stop' failed: injected" : undefined),
  });

  it("UPIDs have the real format and carry the clone's source vmid", async () => {
    const upid = await env
      .client()
      .post<string>("/nodes/pve/qemu/9000/clone", { newid: 151, name: "b", full: 1 });
    const parsed = parseUpid(upid);
    assert.equal(parsed.node, "pve");
    assert.equal(parsed.type, "qmclone");
    assert.equal(parsed.id, "9000");
    assert.equal(parsed.user, "automation@pve!egress");
    assert.match(
      upid,
      /^UPID:pve:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:qmclone:9000:automation@pve!egress:$/,
    );
  });

  it("waits until stopped and returns on exitstatus OK", async () => {
    const client = env.client();
    const upid = await client.post<string>("/nodes/pve/qemu/9000/clone", {
      newid: 152,
      name: "c",
      full: 1,
    });
    await waitForTask(client, upid, { deadline: deadline(), pollMs: 5 });
    assert.equal(env.sim.vms.get(152)?.config.name, "c");
  });

  it("a failed task throws its exitstatus with the log tail", async () => {
    const client = env.client();
    const upid = await client.post<string>("/nodes/pve/qemu/9000/status/stop");
    await assert.rejects(
      waitForTask(client, upid, { deadline: deadline(), pollMs: 5 }),
      (error: unknown) => {
        assert.ok(error instanceof PermanentError);
        assert.match(error.message, /qmstop task failed: command 'qm stop' failed: injected/);
        assert.match(error.message, /TASK ERROR: command 'qm stop' failed: injected/);
        return true;
      },
    );
  });

  it("a task that outlives the deadline gives a Transient error naming the timeout setting", async () => {
    env.sim.options.defaultTaskMs = 2000;
    const client = env.client();
    const upid = await client.post<string>("/nodes/pve/qemu/9000/clone", {
      newid: 153,
      name: "d",
      full: 1,
    });
    await assert.rejects(
      waitForTask(client, upid, {
        deadline: new Deadline(150, "timeouts.createSeconds"),
        pollMs: 20,
      }),
      (error: unknown) =>
        error instanceof TransientError && /timeouts\.createSeconds/.test(error.message),
    );
    env.sim.options.defaultTaskMs = 20;
  });
});

function rawRequest(
  endpoint: string,
  ca: string,
  path: string,
): Promise<{ status: number; reason: string; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(`${endpoint}${path}`, { ca, timeout: 5000 }, (res) => {
      let body = "";
      res.on("data", (chunk: Buffer) => (body += chunk.toString()));
      res.on("end", () =>
        resolve({ status: res.statusCode ?? 0, reason: res.statusMessage ?? "", body }),
      );
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", reject);
    req.end();
  });
}
