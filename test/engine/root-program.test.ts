/**
 * End to end: the repository's root program (dist/index.js) with a stack
 * config of one KVM backend (the lab, over SSH) and one Proxmox backend (the
 * simulator), run the way `pulumi up` runs it, with the Pulumi CLI's part
 * played by this test:
 *
 * 1. the program runs under mocks in preview mode from a consumer project
 *    where the package is installed from its tarball; every child's inputs
 *    (with the serialized `__provider`) are captured;
 * 2. each child goes through the real dynamic-provider gRPC server: Check,
 *    Create (the KVM VM really boots and runs squid from the pool's
 *    cloud-init; the Proxmox one is cloned on the simulator);
 * 3. the program runs again with the providers' real outputs, and its stack
 *    outputs (endpoints, proxies) are read;
 * 4. HTTP goes through the KVM proxy to a server on the lab bridge;
 * 5. Delete, and Read says nothing is left on either side.
 *
 * One KVM member, so one VM boot (TCG is slow; two members created at once on
 * one host, sharing one cached base, are the day-2 suite's start:
 * engine/kvm-egress-rotate), under a `pool-e2e` prefix.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { copyFileSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { engineCallMs, guestReadySeconds, guestTestTimeoutMs, kvmTimeouts } from "../lab/budgets";
import { useLab, type LabEnv } from "../lab/fixture";
import { dhcpAddressPattern } from "../lab/lab";
import { LabGuests } from "../lab/guests";
import {
  ensureProxyImage,
  linkHostToLab,
  serveImage,
  serveTarget,
  type ProxyImage,
  type RunningServer,
} from "../lab/kvm-support";
import { PveSimulator } from "../pve-sim/simulator";
import { getThroughProxy } from "../support/forward-proxy";
import {
  DynamicProviderServer,
  packIntoConsumerProject,
  unwrapSecrets,
  type ConsumerProject,
  type Props,
} from "./harness";

const REPOSITORY = resolve(__dirname, "..", "..", "..");
/** Runs the root program under mocks; with `outputs`, children get those outputs (as after `up`). */
const MOCK_RUNNER = `
const fs = require("node:fs");
const [seenFile, outputsFile] = process.argv.slice(2);
const pulumi = require("@pulumi/pulumi");
const real = outputsFile ? JSON.parse(fs.readFileSync(outputsFile, "utf8")) : undefined;
const seen = [];
process.on("exit", () => fs.writeFileSync(seenFile, JSON.stringify({ seen, exported: global.exported })));
pulumi.runtime
  .setMocks(
    {
      newResource(args) {
        seen.push({ type: args.type, name: args.name, inputs: args.inputs });
        const outs = real && real[args.name];
        return { id: outs ? outs.id : args.name + "-id", state: outs ? outs.properties : {} };
      },
      call: (args) => args.inputs,
    },
    "egress-proxies",
    "e2e",
    real === undefined,
  )
  .then(async () => {
    const program = require("./root-program.js");
    if (real === undefined) return;
    const valueOf = (output) => new Promise((resolve) => output.apply(resolve));
    global.exported = {
      endpoints: await valueOf(program.endpoints),
      proxies: await valueOf(program.proxies),
      count: await valueOf(program.count),
    };
  });
`;

interface Seen {
  seen: Array<{ type: string; name: string; inputs: Props }>;
  exported?: { endpoints: string[]; proxies: Array<Record<string, unknown>>; count: number };
}

describe("engine: the root program end to end (lab KVM + Proxmox simulator)", function () {
  // One TCG guest boots, then squid is awaited on it (test/lab/budgets.ts).
  this.timeout(guestTestTimeoutMs(1));
  let lab: LabEnv;
  let image: ProxyImage;
  let imageServer: RunningServer;
  let target: RunningServer;
  let sim: PveSimulator;
  let project: ConsumerProject;
  let server: DynamicProviderServer;
  const cleanups: Array<() => Promise<unknown>> = [];
  const guests = new LabGuests();

  before(async () => {
    lab = await useLab();
    const hostAddress = await linkHostToLab(lab);
    image = await ensureProxyImage();
    imageServer = await serveImage(image);
    target = await serveTarget(hostAddress, "hello through the pool\n");
    sim = new PveSimulator({ agentDelayMs: 20 });
    await sim.listen();
    project = packIntoConsumerProject();
    copyFileSync(join(REPOSITORY, "dist", "index.js"), join(project.dir, "root-program.js"));
    writeFileSync(join(project.dir, "mock-runner.js"), MOCK_RUNNER);
    server = await startProviderServer();
  });

  /** A provider process as the engine starts one per deployment. */
  async function startProviderServer(): Promise<DynamicProviderServer> {
    const started = await DynamicProviderServer.start(project, {
      project: "egress-proxies",
      stack: "e2e",
    });
    // The create call lasts as long as the guests take to boot: the provider's budget, plus a minute.
    started.callTimeoutMs = engineCallMs();
    await started.configure({});
    return started;
  }

  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
    await server?.stop();
    // Whatever the provider could not delete (a create cut short, a failed delete) goes by name,
    // once the provider server (and any create still running in it) is stopped.
    if (lab) await guests.removeAll(lab);
    await sim?.settle();
    await sim?.close();
    await imageServer?.close();
    await target?.close();
    project?.remove();
  });

  const labVirsh = (...args: string[]) =>
    execFileSync("virsh", ["-q", "-c", "qemu:///system", ...args], { encoding: "utf8" });

  function stackConfig(): Record<string, string> {
    const pool = {
      backends: [
        {
          name: "lab",
          count: 1,
          kvm: {
            connection: {
              host: lab.sshHost,
              port: lab.sshPort,
              user: lab.sshUser,
              knownHosts: readFileSync(lab.knownHosts, "utf8"),
            },
            pool: lab.pool,
            network: { bridge: lab.bridge },
            domainType: "qemu",
            memoryMiB: 512,
            timeouts: kvmTimeouts(),
          },
        },
        {
          name: "pve",
          count: 1,
          proxmox: {
            apiEndpoint: sim.endpoint,
            caCertPem: sim.caCertPem,
            apiToken: sim.tokenFor(),
            node: "pve",
            templateVmid: 9000,
            diskStorage: "local-lvm",
            seedStorage: "seeds",
            timeouts: { createSeconds: 60, readySeconds: 20, deleteSeconds: 60 },
          },
        },
      ],
      kvmImage: { url: imageServer.url, sha256: image.sha256 },
      squid: { allowedClientCidrs: [lab.subnet], basicAuthUser: "crawler" },
      // The simulator's VMs run no squid: finish at the address, then wait for squid below.
      readiness: "address",
    };
    return {
      "egress-proxies:pool": JSON.stringify(pool),
      "egress-proxies:poolName": "pool-e2e",
      "egress-proxies:basicAuthPassword": "e2e password / 1",
      "egress-proxies:kvmPrivateKey": readFileSync(lab.clientKey, "utf8"),
    };
  }

  function runProgram(outputs?: Record<string, { id: string; properties: Props }>): Seen {
    const seenFile = join(project.dir, "seen.json");
    const args = [join(project.dir, "mock-runner.js"), seenFile];
    if (outputs !== undefined) {
      writeFileSync(join(project.dir, "outputs.json"), JSON.stringify(outputs));
      args.push(join(project.dir, "outputs.json"));
    }
    execFileSync(process.execPath, args, {
      cwd: project.dir,
      stdio: ["ignore", "pipe", "pipe"],
      timeout: 60_000,
      env: {
        ...process.env,
        PULUMI_CONFIG: JSON.stringify(stackConfig()),
        PULUMI_CONFIG_SECRET_KEYS: JSON.stringify([
          "egress-proxies:basicAuthPassword",
          "egress-proxies:kvmPrivateKey",
        ]),
      },
    });
    return JSON.parse(readFileSync(seenFile, "utf8")) as Seen;
  }

  it("deploys the configured pool, serves traffic through each KVM proxy, and tears down to nothing", async () => {
    const preview = runProgram();
    const children = preview.seen.filter((r) => r.type.startsWith("pulumi-nodejs:dynamic/"));
    assert.deepEqual(
      children.map((r) => [r.type, r.name]),
      [
        ["pulumi-nodejs:dynamic/egress-proxies:KvmProxy", "pool-e2e-lab-0"],
        ["pulumi-nodejs:dynamic/egress-proxies:ProxmoxProxy", "pool-e2e-pve-0"],
      ],
    );

    const created: Record<string, { id: string; properties: Props; urn: string }> = {};
    const basesToRemove = new Set<string>();
    await Promise.all(
      children.map(async (child) => {
        const urn = `urn:pulumi:e2e::egress-proxies::egress-proxies:index:EgressProxyPool$${child.type}::${child.name}`;
        const inputs = unwrapSecrets(child.inputs) as Props;
        const checked = await server.check(urn, {}, inputs);
        assert.deepEqual(checked.failures, [], child.name);
        assert.match(String(checked.inputs.vmName), new RegExp(`^${child.name}-[a-z2-7]{10}$`));
        if (child.type.endsWith(":KvmProxy")) guests.add(String(checked.inputs.vmName));
        const result = await server.create(urn, checked.inputs);
        created[child.name] = { ...result, urn };
        cleanups.push(() => server.delete(urn, result.id, result.properties));
        // This run's image URL is new (a new port), so its cached base is this run's to remove.
        const base = result.properties.imageVolume;
        if (typeof base === "string" && !basesToRemove.has(base) && basesToRemove.add(base))
          cleanups.unshift(async () => {
            for (const volume of [`${base}.ready`, base])
              labVirsh("vol-delete", "--pool", lab.pool, volume);
          });
      }),
    );

    const applied = runProgram(created);
    const exported = applied.exported!;
    assert.equal(exported.count, 2);
    const kvmIps = ["pool-e2e-lab-0"].map((name) => String(created[name].properties.ip));
    const pveIp = String(created["pool-e2e-pve-0"].properties.ip);
    for (const ip of kvmIps) assert.match(ip, dhcpAddressPattern(lab.subnet));
    assert.deepEqual(exported.endpoints, [
      ...kvmIps.map((ip) => `http://${ip}:3128`),
      `http://${pveIp}:3128`,
    ]);
    assert.deepEqual(
      exported.proxies.map((proxy) => [proxy.name, proxy.kind, proxy.ip, proxy.id]),
      [
        ["lab-0", "kvm", kvmIps[0], created["pool-e2e-lab-0"].id],
        ["pve-0", "proxmox", pveIp, created["pool-e2e-pve-0"].id],
      ],
    );

    // squid from the pool's cloud-init on each KVM proxy: basic auth required, then the request passes.
    const credentials = { user: "crawler", password: "e2e password / 1" };
    for (const kvmIp of kvmIps) {
      const proxy = { host: kvmIp, port: 3128 };
      let response: { status: number; body: string } | undefined;
      const deadline = Date.now() + guestReadySeconds() * 1000;
      while (Date.now() < deadline) {
        response = await getThroughProxy(proxy, target.url, credentials).catch(() => undefined);
        if (response?.status === 200) break;
        await new Promise((resolveSleep) => setTimeout(resolveSleep, 3000));
      }
      assert.equal(response?.status, 200, `${kvmIp}: ${JSON.stringify(response)}`);
      assert.equal(response?.body, "hello through the pool\n");
      const anonymous = await getThroughProxy(proxy, target.url);
      assert.equal(anonymous.status, 407, "squid asks for the pool's credentials");
      const wrong = await getThroughProxy(proxy, target.url, {
        ...credentials,
        password: "wrong password",
      });
      assert.equal(wrong.status, 407, "and refuses a wrong password");
    }

    // `pulumi destroy`: a provider process of its own, whose program registers no pool (nothing drains).
    await server.stop();
    server = await startProviderServer();
    for (const [name, { id, properties, urn }] of Object.entries(created)) {
      await server.delete(urn, id, properties);
      const gone = await server.read(urn, id, properties, properties);
      assert.equal(gone.id, "", `${name} is gone`);
    }
    for (const name of ["pool-e2e-lab-0"]) {
      const kvmVmName = String(created[name].properties.vmName);
      assert.ok(
        !labVirsh("list", "--all", "--name").includes(kvmVmName),
        `no domain of ${name} is left`,
      );
      assert.ok(
        !labVirsh("vol-list", lab.pool).includes(kvmVmName),
        `no overlay or seed of ${name} is left`,
      );
    }
    assert.equal(
      [...sim.vms.values()].filter((vm) => vm.vmid !== 9000).length,
      0,
      "only the template is left on the simulator",
    );
  });
});
