import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { DEFAULT_POOL_CONFIG, poolArgsFromStackConfig } from "../../../components/stack-config";

const REPOSITORY = resolve(__dirname, "..", "..", "..", "..");

describe("root program: stack config", () => {
  it("defaults to one proxy on the local libvirt socket", () => {
    const result = poolArgsFromStackConfig({});
    assert.ok(result.ok);
    assert.equal(result.args.count, 1);
    assert.deepEqual(result.args.backends, DEFAULT_POOL_CONFIG.backends);
  });

  it("builds pool arguments from a full config, the secret key going to every KVM connection", () => {
    const result = poolArgsFromStackConfig({
      pool: {
        count: 3,
        backends: [
          {
            name: "kvm1",
            weight: 2,
            kvm: { connection: { host: "kvm1.lan" }, network: { bridge: "br0" } },
          },
          {
            name: "pve1",
            count: 1,
            proxmox: {
              node: "pve1",
              templateVmid: 9000,
              diskStorage: "local-lvm",
              seedStorage: "local",
            },
          },
        ],
        squid: { port: 8080, basicAuthUser: "crawler", allowedClientCidrs: ["10.0.0.0/8"] },
        kubernetes: { namespace: "crawlers", name: "egress" },
        readiness: "address",
      },
      basicAuthPassword: "<secret password>",
      kvmPrivateKey: "<secret key>",
    });
    assert.ok(result.ok, JSON.stringify(result));
    const kvm = result.args.backends[0] as unknown as {
      kvm: { connection: Record<string, unknown> };
    };
    assert.equal(kvm.kvm.connection.privateKey, "<secret key>");
    assert.deepEqual(result.args.squid?.basicAuth, {
      user: "crawler",
      password: "<secret password>",
    });
    assert.deepEqual(result.args.readiness, { mode: "address" });
    assert.deepEqual(result.args.kubernetes, { namespace: "crawlers", name: "egress" });
  });

  it("names the exact config key and the fix for each problem", () => {
    const result = poolArgsFromStackConfig({
      pool: {
        count: -1,
        backends: [
          { name: "KVM 1", kvm: {} },
          {
            name: "pve1",
            proxmox: { node: "pve1", templateVmid: "9000", diskStorage: "x", seedStorage: "y" },
          },
        ],
        squid: { port: "3128" },
        colour: "blue",
      },
    });
    assert.ok(!result.ok);
    const keys = result.problems.map((problem) => problem.split(":").slice(0, 2).join(":"));
    assert.ok(keys.includes("egress-proxies:pool.count"), keys.join("\n"));
    assert.ok(keys.includes("egress-proxies:pool.squid.port"), keys.join("\n"));
    assert.ok(keys.includes("egress-proxies:pool.backends[0].name"), keys.join("\n"));
    assert.ok(
      keys.includes("egress-proxies:pool.backends[1].proxmox.templateVmid"),
      keys.join("\n"),
    );
    assert.ok(
      result.problems.some((p) => /colour/.test(p)),
      result.problems.join("\n"),
    );
  });

  it("asks for the secret password when basic auth is configured without one", () => {
    const result = poolArgsFromStackConfig({
      pool: { count: 1, backends: [{ name: "a", kvm: {} }], squid: { basicAuthUser: "crawler" } },
    });
    assert.ok(!result.ok);
    assert.match(result.problems[0], /pulumi config set --secret egress-proxies:basicAuthPassword/);
  });

  it("the built root program declares the pool and serializes providers as requires of the package", function () {
    this.timeout(60_000);
    // npm ci's prepare step makes this link; without it the program cannot run as `pulumi up` runs it.
    assert.ok(
      existsSync(join(REPOSITORY, "node_modules", "egress-proxies", "package.json")),
      "run npm ci (prepare links node_modules/egress-proxies)",
    );
    const program = `
      const pulumi = require("@pulumi/pulumi");
      const seen = [];
      process.on("exit", () => console.log(JSON.stringify(seen)));
      pulumi.runtime.setMocks({
        newResource(args) {
          const provider = String(args.inputs.__provider || "");
          seen.push({ type: args.type, name: args.name, requires: provider.match(/require\\("egress-proxies[^"]*"\\)/g) });
          return { id: args.name + "-id", state: {} };
        },
        call: (args) => args.inputs,
      }, "egress-proxies", "dev", true).then(() => require("./dist/index.js"));
    `;
    const out = execFileSync(process.execPath, ["--preserve-symlinks", "-e", program], {
      cwd: REPOSITORY,
      encoding: "utf8",
      env: { ...process.env, PULUMI_CONFIG: "{}" },
      timeout: 50_000,
    });
    const seen = JSON.parse(out.trim().split("\n").at(-1)!) as Array<{
      type: string;
      name: string;
      requires: string[] | null;
    }>;
    assert.deepEqual(
      seen.map((r) => r.name),
      ["egress", "egress-local-0"],
    );
    assert.deepEqual(seen[1].requires, ['require("egress-proxies/dist/provider/kvm/provider.js")']);
  });
});
