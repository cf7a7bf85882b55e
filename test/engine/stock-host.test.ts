/**
 * End to end on a stock host: the repository's root program with (almost) no
 * stack config, against a libvirt host exactly as Debian's packages leave it
 * (test/lab/stock-host-up.sh: network default defined but inactive, no
 * pool, socket root:libvirt). The provider and the doctor run where the
 * stock daemon's socket is the default /var/run/libvirt/libvirt-sock (a
 * mount namespace), so the program's default backend — the local socket —
 * is that host.
 *
 * 1. The first run fails at create with the preflight's fixes, and leaves
 *    nothing behind (no domain, no pool, no volume, network untouched).
 * 2. `egress-proxies doctor --fix` applies the standard set-up; without KVM it exits 1 until told
 *    `--domain-type qemu`, as its domain-type row says.
 * 3. The same run then creates one proxy that serves HTTP through squid.
 * 4. Delete leaves the host as it was after the fix (the base image cache
 *    stays by design, as on every host; this test removes it afterwards).
 *
 * The stack config holds the image source (the lab's image over HTTP on
 * loopback), squid's client range (the profile's subnet, picked when it comes
 * up, need not be one of squid's default private ranges) and
 * domainType "qemu" (the lab's hosts have no KVM, whatever this machine has: test/lab/lab-lib.sh).
 * Nothing else: one proxy on the local socket, as the program does with no config.
 */
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { copyFileSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { DEFAULT_POOL_CONFIG } from "../../components/stack-config";
import { ensureProxyImage, serveImage, serveTarget, type RunningServer } from "../lab/kvm-support";
import {
  linkStockHost,
  resetStockHost,
  stockVirsh,
  useStockHost,
  type StockHostEnv,
} from "../lab/stock-fixture";
import { dhcpAddressPattern } from "../lab/lab";
import { squashed } from "../support/doctor-table";
import { getThroughProxy } from "../support/forward-proxy";
import {
  DynamicProviderServer,
  packIntoConsumerProject,
  unwrapSecrets,
  type ConsumerProject,
  type Props,
} from "./harness";

const REPOSITORY = resolve(__dirname, "..", "..", "..");
const BIN = resolve(__dirname, "..", "..", "cli", "main.js");

/** Runs the root program under mocks (preview) and writes the resources it registers. */
const MOCK_RUNNER = `
const fs = require("node:fs");
const pulumi = require("@pulumi/pulumi");
const seen = [];
process.on("exit", () => fs.writeFileSync(process.argv[2], JSON.stringify(seen)));
pulumi.runtime
  .setMocks(
    {
      newResource(args) {
        seen.push({ type: args.type, name: args.name, inputs: args.inputs });
        return { id: args.name + "-id", state: {} };
      },
      call: (args) => args.inputs,
    },
    "egress-proxies",
    "stock",
    true,
  )
  .then(() => require("./root-program.js"));
`;

/** Commands run under this see the stock host's socket as the default /var/run/libvirt/libvirt-sock. */
function asIfOnTheStockHost(stock: StockHostEnv): string[] {
  return [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "--",
    "/bin/sh",
    "-c",
    'mount --bind "$0" /run/libvirt && exec "$@"',
    stock.libvirtRunDir,
  ];
}

/** What a person would compare before and after: libvirt's objects on the host. */
function hostState(stock: StockHostEnv) {
  const pools = stockVirsh(stock, "pool-list", "--all", "--name").trim();
  return {
    domains: stockVirsh(stock, "list", "--all", "--name").trim(),
    pools,
    networks: stockVirsh(stock, "net-list", "--all").trim(),
    volumes: pools.includes("default") ? stockVirsh(stock, "vol-list", "default").trim() : "",
    images: readdirSync(stock.imagesDir).sort(),
  };
}

describe("engine: the zero-config root program on a stock Debian host", function () {
  this.timeout(1_200_000);
  let stock: StockHostEnv;
  let imageServer: RunningServer;
  let target: RunningServer;
  let project: ConsumerProject;
  let server: DynamicProviderServer;
  const cleanups: Array<() => Promise<unknown>> = [];

  before(async () => {
    stock = await useStockHost();
    await resetStockHost();
    // The lab's proxy image (built once by build-image.sh, cached); the regular lab is not used.
    const image = await ensureProxyImage();
    imageServer = await serveImage(image);
    target = await serveTarget(stock.hostAddress, "hello from a stock host\n");
    project = packIntoConsumerProject();
    copyFileSync(join(REPOSITORY, "dist", "index.js"), join(project.dir, "root-program.js"));
    writeFileSync(join(project.dir, "mock-runner.js"), MOCK_RUNNER);
    writeFileSync(
      join(project.dir, "stack-config.json"),
      JSON.stringify({
        "egress-proxies:pool": JSON.stringify({
          ...DEFAULT_POOL_CONFIG, // what the program does with no pool config: one proxy, local socket
          // ... except software emulation: the stock host, like every lab host, has no KVM.
          backends: [{ name: "local", kvm: { domainType: "qemu" } }],
          kvmImage: { url: imageServer.url, sha256: image.sha256 },
          squid: { allowedClientCidrs: [stock.subnet] },
        }),
      }),
    );
    server = await startProviderServer();
  });

  /** A provider process as the engine starts one per deployment, as if on the stock host. */
  async function startProviderServer(): Promise<DynamicProviderServer> {
    const started = await DynamicProviderServer.start(
      project,
      { project: "egress-proxies", stack: "stock" },
      process.env,
      undefined,
      asIfOnTheStockHost(stock),
    );
    started.callTimeoutMs = 900_000; // a create boots a guest under TCG: 60-280 s here
    await started.configure({});
    return started;
  }

  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
    await server?.stop();
    await imageServer?.close();
    await target?.close();
    project?.remove();
    if (stock !== undefined) await resetStockHost();
  });

  function previewChildren(): Array<{ type: string; name: string; inputs: Props }> {
    const seenFile = join(project.dir, "seen.json");
    execFileSync(process.execPath, [join(project.dir, "mock-runner.js"), seenFile], {
      cwd: project.dir,
      stdio: ["ignore", "pipe", "pipe"],
      timeout: 60_000,
      env: {
        ...process.env,
        PULUMI_CONFIG: readFileSync(join(project.dir, "stack-config.json"), "utf8"),
      },
    });
    const seen = JSON.parse(readFileSync(seenFile, "utf8")) as Array<{
      type: string;
      name: string;
      inputs: Props;
    }>;
    return seen.filter((r) => r.type.startsWith("pulumi-nodejs:dynamic/"));
  }

  it("fails first with the fixes and leaves nothing; after doctor --fix creates a proxy that serves; delete leaves the host as it was", async () => {
    const children = previewChildren();
    assert.deepEqual(
      children.map((r) => [r.type, r.name]),
      [["pulumi-nodejs:dynamic/egress-proxies:KvmProxy", "egress-local-0"]],
    );
    const child = children[0]!;
    const urn = `urn:pulumi:stock::egress-proxies::egress-proxies:index:EgressProxyPool$${child.type}::${child.name}`;
    const checked = await server.check(urn, {}, unwrapSecrets(child.inputs) as Props);
    assert.deepEqual(checked.failures, []);

    // 1. The stock host as the packages leave it: create stops at the preflight.
    const before = hostState(stock);
    assert.equal(before.pools, "", "the packages define no pool");
    assert.match(before.networks, /^default\s+inactive\s+no/);
    await assert.rejects(server.create(urn, checked.inputs), (error: Error) => {
      assert.match(error.message, /host local is not ready for this VM \(nothing was created\)/);
      assert.match(
        error.message,
        /pool "default": no such pool .*virsh pool-define-as default dir --target \/var\/lib\/libvirt\/images/,
      );
      assert.match(
        error.message,
        /network\.name "default": defined but not active.*virsh net-start default/,
      );
      assert.match(error.message, /egress-proxies doctor --fix/);
      return true;
    });
    assert.deepEqual(hostState(stock), before, "the failed create left nothing behind");

    // 2. The fix the error names, run as a user would run it on that host: no flags at all. It fixes
    // the pool and the network, and still exits 1: the host has no KVM, and its row says to choose
    // emulation, which this stack does; asked for that, the doctor finds the host ready.
    const [launcher, ...launcherArgs] = asIfOnTheStockHost(stock);
    const doctorRun = (...args: string[]) =>
      spawnSync(launcher!, [...launcherArgs, process.execPath, BIN, "doctor", ...args], {
        encoding: "utf8",
        timeout: 120_000,
      });
    const doctor = doctorRun("--fix");
    assert.equal(doctor.status, 1, doctor.stdout + doctor.stderr);
    assert.match(squashed(doctor.stdout), /FAILdomainType=kvm:noKVM.*setdomainType:"qemu"/);
    const ready = doctorRun("--domain-type", "qemu");
    assert.equal(ready.status, 0, ready.stdout + ready.stderr);
    assert.match(ready.stdout, /1 host\(s\) ready/);
    assert.match(
      doctor.stdout,
      /fixed on local: defined, built, started and autostarted the dir pool default/,
    );
    assert.match(doctor.stdout, /fixed on local: started and autostarted the network default/);
    await linkStockHost(); // this machine's leg on virbr0, as a LAN would be
    const fixedState = hostState(stock);

    // 3. The same run again: one proxy, ready when squid answers.
    const created = await server.create(urn, checked.inputs);
    cleanups.push(() => server.delete(urn, created.id, created.properties));
    const base = String(created.properties.imageVolume);
    cleanups.unshift(async () => {
      for (const volume of [`${base}.ready`, base])
        stockVirsh(stock, "vol-delete", "--pool", "default", volume);
    });
    const ip = String(created.properties.ip);
    assert.match(
      ip,
      dhcpAddressPattern(stock.subnet),
      "an address from network default's DHCP range",
    );
    assert.equal(created.properties.endpoint, `http://${ip}:3128`);
    assert.equal(created.properties.state, "running");
    // The port answers as soon as the image's squid runs; cloud-init applies the pool's squid.conf a
    // little later (until then Debian's default config denies everybody but localhost).
    let response: { status: number; body: string } | undefined;
    for (const deadline = Date.now() + 300_000; Date.now() < deadline;) {
      response = await getThroughProxy({ host: ip, port: 3128 }, target.url).catch(() => undefined);
      if (response?.status === 200) break;
      await new Promise((resolveSleep) => setTimeout(resolveSleep, 3000));
    }
    assert.equal(response?.status, 200, JSON.stringify(response?.status));
    assert.equal(response?.body, "hello from a stock host\n");
    assert.ok(target.requests.length >= 1, "the request went through squid to the target");

    // 4. `pulumi destroy` (a provider process of its own; nothing drains): the host is as it was
    // after the fix, apart from the shared base image cache.
    await server.stop();
    server = await startProviderServer();
    await server.delete(urn, created.id, created.properties);
    cleanups.pop();
    const gone = await server.read(urn, created.id, created.properties, created.properties);
    assert.equal(gone.id, "");
    const after = hostState(stock);
    assert.equal(after.domains, fixedState.domains);
    assert.equal(after.pools, fixedState.pools);
    assert.equal(after.networks, fixedState.networks);
    const withoutCache = (names: string[]) => names.filter((name) => !name.startsWith(base));
    assert.deepEqual(withoutCache(after.images), withoutCache(fixedState.images));
    assert.deepEqual(
      after.volumes
        .split("\n")
        .filter((line) => line.trim() !== "")
        .map((line) => line.trim().split(/\s+/)[0]),
      [base, `${base}.ready`].sort(),
      "only the base image cache stays (the reaper's --prune-images removes it)",
    );
  });
});
