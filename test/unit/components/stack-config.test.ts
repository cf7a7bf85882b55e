import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import {
  DEFAULT_POOL_CONFIG,
  poolArgsFromStackConfig,
  type RawStackConfig,
} from "../../../components/stack-config";
import { POOL_DECIDED_KVM_INPUTS, POOL_DECIDED_PROXMOX_INPUTS } from "../../../components/pool";
import { z } from "zod";
import { closestName, knownKeysAt } from "../../../components/config-keys";
import { kvmProxyInputsSchema } from "../../../provider/kvm/schema";
import { proxmoxProxyInputsSchema } from "../../../provider/proxmox/schema";

const REPOSITORY = resolve(__dirname, "..", "..", "..", "..");
const PRIVATE_KEY =
  "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n";
const PROXMOX = {
  node: "pve1",
  templateVmid: 9000,
  diskStorage: "local-lvm",
  seedStorage: "local",
};

function problemsOf(raw: RawStackConfig): string[] {
  const result = poolArgsFromStackConfig(raw);
  assert.ok(!result.ok, "expected the config to be refused");
  return result.problems;
}

describe("root program: stack config", () => {
  it("defaults to one proxy on the local libvirt socket", () => {
    const result = poolArgsFromStackConfig({});
    assert.ok(result.ok);
    assert.equal(result.args.count, 1);
    assert.deepEqual(result.args.backends, DEFAULT_POOL_CONFIG.backends);
  });

  it("passes a KVM backend's jump hosts to KvmProxy, and names a bad one under its config key", () => {
    const withJump = (proxyJump: unknown): RawStackConfig => ({
      pool: {
        count: 1,
        backends: [{ name: "kvm1", kvm: { connection: { host: "10.0.0.5", proxyJump } } }],
      },
    });
    const result = poolArgsFromStackConfig(withJump("admin@bastion.example:22"));
    assert.ok(result.ok, JSON.stringify(result));
    const kvm = result.args.backends[0] as unknown as {
      kvm: { connection: Record<string, unknown> };
    };
    assert.equal(kvm.kvm.connection.proxyJump, "admin@bastion.example:22");
    assert.ok(
      problemsOf(withJump("bad host!")).some((problem) =>
        /pool\.backends\[0\]\.kvm\.connection\.proxyJump/.test(problem),
      ),
    );
  });

  it("takes the pool's ipFamilies and egressCheck.ipv6Url, and a backend's own ipv6 settings", () => {
    const result = poolArgsFromStackConfig({
      pool: {
        count: 1,
        ipFamilies: ["ipv4", "ipv6"],
        egressCheck: { url: "http://192.0.2.7/", ipv6Url: "http://[2001:db8::7]/" },
        squid: { allowedClientCidrs: ["10.0.0.0/8", "fd00::/8"] },
        backends: [
          {
            name: "kvm1",
            kvm: { ipFamilies: ["ipv6"], ipv6: { mode: "static", address: "2001:db8::5/64" } },
          },
        ],
      },
    });
    assert.ok(result.ok, JSON.stringify(result));
    assert.deepEqual(result.args.ipFamilies, ["ipv4", "ipv6"]);
    assert.equal(result.args.egressCheck?.ipv6Url, "http://[2001:db8::7]/");
    const kvm = result.args.backends[0] as unknown as { kvm: { ipFamilies: string[] } };
    assert.deepEqual(kvm.kvm.ipFamilies, ["ipv6"]);
    assert.ok(
      problemsOf({ pool: { ipFamilies: ["ipv4", "ipv4"] } }).some((problem) =>
        /pool\.ipFamilies.*names a family twice/.test(problem),
      ),
      problemsOf({ pool: { ipFamilies: ["ipv4", "ipv4"] } }).join("\n"),
    );
  });

  it("takes ipv6Prefix on the pool and on a backend, egressCheck.ipv6Samples, and names a bad one under its key", () => {
    const config = (extra: Record<string, unknown>, backend: Record<string, unknown> = {}) => ({
      pool: {
        count: 1,
        ipFamilies: ["ipv4", "ipv6"],
        egressCheck: {
          url: "http://192.0.2.7/",
          ipv6Url: "http://[2001:db8::7]/",
          ipv6Samples: 50,
        },
        squid: { allowedClientCidrs: ["10.0.0.0/8", "fd00::/8"] },
        backends: [{ name: "kvm1", kvm: {}, ...backend }],
        ...extra,
      },
    });
    const pooled = poolArgsFromStackConfig(
      config({ ipv6Prefix: { prefix: "2001:db8:7::/56", mode: "random" } }),
    );
    assert.ok(pooled.ok, JSON.stringify(pooled));
    assert.deepEqual(pooled.args.ipv6Prefix, { prefix: "2001:db8:7::/56", mode: "random" });
    assert.equal(pooled.args.egressCheck?.ipv6Samples, 50);
    const own = poolArgsFromStackConfig(
      config({}, { ipv6Prefix: { prefix: "2001:db8:7:1::/64", mode: "pool", count: 8 } }),
    );
    assert.ok(own.ok, JSON.stringify(own));
    assert.deepEqual(own.args.backends[0]!.ipv6Prefix, {
      prefix: "2001:db8:7:1::/64",
      mode: "pool",
      count: 8,
    });
    const problems = problemsOf(
      config({}, { ipv6Prefix: { prefix: "10.0.0.0/8", mode: "random" } }) as RawStackConfig,
    );
    assert.ok(
      problems.some((problem) =>
        /pool\.backends\[0\]\.ipv6Prefix\.prefix "10\.0\.0\.0\/8" must be an IPv6 prefix/.test(
          problem,
        ),
      ),
      problems.join("\n"),
    );
    const shape = problemsOf(config({ ipv6Prefix: { prefix: "2001:db8:7::/56", mode: "fast" } }));
    assert.ok(
      shape.some((problem) =>
        /ipv6Prefix\.mode must be "random", "sticky" or "pool"/.test(problem),
      ),
      shape.join("\n"),
    );
    const v4 = problemsOf({
      pool: {
        count: 1,
        ipv6Prefix: { prefix: "2001:db8:7::/56", mode: "random" },
        backends: [{ name: "kvm1", kvm: {} }],
      },
    });
    assert.ok(
      v4.some((problem) => /pool\.ipv6Prefix needs IPv6 .*set ipFamilies/.test(problem)),
      v4.join("\n"),
    );
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
        recheckEgress: false,
        rotateAfterDays: 30,
        maxUnavailable: "10%",
        drainSeconds: 45,
        onCollision: "rotate",
      },
      basicAuthPassword: "<secret password>",
      kvmPrivateKey: PRIVATE_KEY,
    });
    assert.ok(result.ok, JSON.stringify(result));
    assert.deepEqual(
      [
        result.args.recheckEgress,
        result.args.rotateAfterDays,
        result.args.maxUnavailable,
        result.args.drainSeconds,
        result.args.onCollision,
      ],
      [false, 30, "10%", 45, "rotate"],
    );
    const kvm = result.args.backends[0] as unknown as {
      kvm: { connection: Record<string, unknown>; network: unknown };
    };
    assert.equal(kvm.kvm.connection.privateKey, PRIVATE_KEY);
    assert.deepEqual(kvm.kvm.network, { bridge: "br0" });
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
    const keys = result.problems.map((problem) => problem.split(" ")[0]);
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

  it("wraps the secret keys with the given function before they reach the arguments", () => {
    const result = poolArgsFromStackConfig(
      {
        pool: {
          count: 1,
          backends: [{ name: "kvm1", kvm: { connection: { host: "kvm1.lan" } } }],
          squid: { basicAuthUser: "crawler" },
        },
        basicAuthPassword: "correct horse",
        kvmPrivateKey: PRIVATE_KEY,
      },
      (text) => `secret(${text.length})`,
    );
    assert.ok(result.ok, JSON.stringify(result));
    const kvm = result.args.backends[0] as unknown as {
      kvm: { connection: { privateKey: string } };
    };
    assert.equal(kvm.kvm.connection.privateKey, `secret(${PRIVATE_KEY.length})`);
    assert.equal(result.args.squid?.basicAuth?.password, "secret(13)");
  });

  it("reports a typo inside a backend's kvm settings at its key, with the setting meant", () => {
    const problems = problemsOf({
      pool: { count: 1, backends: [{ name: "kvm1", kvm: { netwrok: { bridge: "br0" } } }] },
    });
    assert.deepEqual(problems, [
      "egress-proxies:pool.backends[0].kvm.netwrok is not a known setting; did you mean network?",
    ]);
  });

  it("checks each backend with its resource's own schema, naming every problem once at its key", () => {
    const problems = problemsOf({
      pool: {
        count: 2,
        backends: [
          {
            name: "kvm1",
            kvm: {
              connection: { host: "kvm1.lan", prot: 22 },
              memoryMib: 512,
              vcpus: "2",
              image: { url: "ftp://mirror/debian.qcow2" },
            },
          },
          { name: "pve1", wieght: 2, proxmox: { ...PROXMOX, cores: 0, tgas: ["edge"] } },
        ],
      },
    });
    assert.deepEqual(problems.slice().sort(), [
      "egress-proxies:pool.backends[0].kvm.connection.prot is not a known setting; did you mean port?",
      "egress-proxies:pool.backends[0].kvm.image.url must use https (or http with image.sha256), not ftp:",
      "egress-proxies:pool.backends[0].kvm.memoryMib is not a known setting; did you mean memoryMiB?",
      "egress-proxies:pool.backends[0].kvm.vcpus must be a whole number, e.g. 2",
      "egress-proxies:pool.backends[1].proxmox.cores must be at least 1",
      "egress-proxies:pool.backends[1].proxmox.tgas is not a known setting; did you mean tags?",
      "egress-proxies:pool.backends[1].wieght is not a known setting; did you mean weight?",
    ]);
  });

  it("lists the settings there are when an unknown key is like none of them", () => {
    const [problem] = problemsOf({
      pool: { count: 1, backends: [{ name: "pve1", proxmox: { ...PROXMOX, colour: "blue" } }] },
    });
    assert.match(
      problem!,
      /^egress-proxies:pool\.backends\[0\]\.proxmox\.colour is not a known setting; remove it \(the settings here are apiEndpoint, apiToken, .*node, templateVmid/,
    );
    assert.doesNotMatch(problem!, /owner|vmNameChosenBy|userData/);
  });

  it("says which inputs the pool sets for every proxy, and where to set them instead", () => {
    const problems = problemsOf({
      pool: {
        count: 2,
        backends: [
          { name: "kvm1", kvm: { userData: "#cloud-config\n", vmName: "mine" } },
          { name: "pve1", proxmox: { ...PROXMOX, readiness: { mode: "none" } } },
        ],
      },
    });
    assert.deepEqual(problems, [
      "egress-proxies:pool.backends[0].kvm.userData is set by the pool for every proxy; remove it and put your cloud-init in egress-proxies:extraCloudInit",
      "egress-proxies:pool.backends[0].kvm.vmName is set by the pool for every proxy; remove it (VM names are made from egress-proxies:poolName and the backend's name)",
      "egress-proxies:pool.backends[1].proxmox.readiness is set by the pool for every proxy; remove it and set egress-proxies:pool.readiness for the whole pool",
    ]);
  });

  it("accepts every input of KvmProxy and ProxmoxProxy that the pool leaves to a backend, and no other", () => {
    const cases = [
      { kind: "kvm", shape: kvmProxyInputsSchema.shape, decided: POOL_DECIDED_KVM_INPUTS },
      {
        kind: "proxmox",
        shape: proxmoxProxyInputsSchema.shape,
        decided: POOL_DECIDED_PROXMOX_INPUTS,
      },
    ] as const;
    for (const { kind, shape, decided } of cases) {
      const settable = Object.keys(shape).filter(
        (key) =>
          !(decided as readonly string[]).includes(key) &&
          key !== "owner" &&
          key !== "vmNameChosenBy",
      );
      for (const key of Object.keys(shape)) {
        // A value of the wrong type: a known key gets a type problem, an unknown one "not a known setting".
        const settings = { ...(kind === "proxmox" ? PROXMOX : {}), [key]: Symbol.for("wrong") };
        const problems = problemsOf({
          pool: { count: 1, backends: [{ name: "b", [kind]: settings }] },
        });
        const unknown = problems.some((p) => p.includes(`.${kind}.${key} is not a known setting`));
        const decidedByPool = problems.some((p) =>
          p.includes(`.${kind}.${key} is set by the pool`),
        );
        assert.equal(
          unknown,
          key === "owner" || key === "vmNameChosenBy",
          `${kind}.${key}: ${problems.join("; ")}`,
        );
        assert.equal(decidedByPool, (decided as readonly string[]).includes(key), `${kind}.${key}`);
        assert.equal(settable.includes(key), !unknown && !decidedByPool, `${kind}.${key}`);
      }
    }
  });

  it("takes a static backend's URLs, checks each at its key without quoting it, and counts them", () => {
    const result = poolArgsFromStackConfig({
      pool: {
        count: 2,
        backends: [
          { name: "kvm1", kvm: {} },
          { name: "shop", static: { urls: ["http://buyer:s3cret@203.0.113.7:3128"] } },
        ],
      },
    });
    assert.ok(result.ok, result.ok ? "" : result.problems.join("; "));
    assert.deepEqual(result.args.backends[1], {
      name: "shop",
      static: { urls: ["http://buyer:s3cret@203.0.113.7:3128"] },
    });
    const problems = problemsOf({
      pool: {
        backends: [
          {
            name: "shop",
            count: 3,
            static: {
              urls: ["http://buyer:s3cret@203.0.113.7:3128", "https://u:hunter2@h:1"],
              ip: 1,
            },
          },
        ],
      },
    });
    assert.deepEqual(problems, [
      "egress-proxies:pool.backends[0].static.urls[1]: a proxy URL must start with http:// (the proxy is spoken to in plain HTTP; CONNECT carries TLS to the target)",
      "egress-proxies:pool.backends[0].static.ip is not a known setting; remove it (the settings here are urls, readiness, timeouts)",
      "egress-proxies:pool.backends[0].count is 3 but that backend has only 2 proxies; lower its count or list more",
    ]);
    assert.ok(
      problems.every((problem) => !problem.includes("hunter2") && !problem.includes("s3cret")),
    );
  });

  it("reports duplicate backend names and counts that do not add up at their keys, once each", () => {
    const problems = problemsOf({
      pool: {
        count: 4,
        backends: [
          { name: "kvm1", count: 1, kvm: {} },
          { name: "kvm1", count: 1, kvm: {} },
          { name: "Bad Name", count: 1, kvm: {} },
        ],
      },
    });
    // The bad name is reported once, by the shape check, though the placement rules see it too.
    assert.deepEqual(problems, [
      'egress-proxies:pool.backends[2].name must be a short DNS label (a-z, 0-9, -), e.g. "kvm1"',
      'egress-proxies:pool.backends[1].name "kvm1" is used twice; names must be unique',
      "egress-proxies:pool.count is 4 but the backends' counts add up to 3; drop count or make them agree",
    ]);
  });

  it("checks the basic-auth password at parse time by its own key, never quoting it", () => {
    const password = "short";
    const problems = problemsOf({
      pool: { count: 1, backends: [{ name: "a", kvm: {} }], squid: { basicAuthUser: "crawler" } },
      basicAuthPassword: password,
    });
    assert.deepEqual(problems, [
      "egress-proxies:basicAuthPassword must be at least 8 characters; set it again with `pulumi config set --secret egress-proxies:basicAuthPassword <password>`",
    ]);
    assert.ok(!problems.join("\n").includes(password));
    const lineBreak = problemsOf({
      pool: { count: 1, backends: [{ name: "a", kvm: {} }], squid: { basicAuthUser: "crawler" } },
      basicAuthPassword: "long enough\nbut two lines",
    });
    assert.match(lineBreak[0]!, /^egress-proxies:basicAuthPassword must not contain line breaks/);
  });

  it("refuses a password without a user: the proxies would be open while the stack looks protected", () => {
    const problems = problemsOf({
      pool: { count: 1, backends: [{ name: "a", kvm: {} }] },
      basicAuthPassword: "correct horse battery",
    });
    assert.match(
      problems[0]!,
      /^egress-proxies:basicAuthPassword is set but egress-proxies:pool\.squid\.basicAuthUser is not/,
    );
  });

  it("checks the client CIDRs and the KVM private key at their keys", () => {
    const problems = problemsOf({
      pool: {
        count: 1,
        backends: [{ name: "a", kvm: {} }],
        squid: { allowedClientCidrs: ["10.0.0.0/8", "10.0.0.0/33"] },
      },
      kvmPrivateKey: "/home/me/.ssh/id_ed25519",
    });
    assert.deepEqual(problems, [
      'egress-proxies:pool.squid.allowedClientCidrs[1] "10.0.0.0/33" has a prefix longer than 32 bits',
      "egress-proxies:kvmPrivateKey must be the private key's text (-----BEGIN ... PRIVATE KEY-----), not a path; set it from the file: `pulumi config set --secret egress-proxies:kvmPrivateKey < ~/.ssh/id_ed25519`",
    ]);
    assert.ok(!problems.join("\n").includes("/home/me"));
  });

  it("names the pool's kvmImage key for KvmProxy's image rules", () => {
    const problems = problemsOf({
      pool: {
        count: 1,
        backends: [{ name: "a", kvm: {} }],
        kvmImage: { url: "http://mirror.lan/debian.qcow2", sha256: "abc" },
      },
    });
    assert.deepEqual(problems, [
      "egress-proxies:pool.kvmImage.sha256 must be 64 hex characters (the output of sha256sum)",
    ]);
    const capped = (maxMiB: unknown) =>
      poolArgsFromStackConfig({
        pool: {
          count: 1,
          backends: [{ name: "a", kvm: {} }],
          kvmImage: { url: "https://mirror.lan/debian.qcow2", maxMiB },
        },
      });
    const accepted = capped(4096);
    assert.ok(accepted.ok);
    assert.deepEqual(accepted.args.kvmImage, {
      url: "https://mirror.lan/debian.qcow2",
      maxMiB: 4096,
    });
    const refused = capped(0);
    assert.ok(!refused.ok);
    assert.deepEqual(refused.problems, ["egress-proxies:pool.kvmImage.maxMiB must be at least 1"]);
  });

  it("finds the keys a schema knows at a path, through optional, default, pipe, union and array", () => {
    const schema = z.strictObject({
      network: z
        .union([z.strictObject({ bridge: z.string() }), z.strictObject({ name: z.string() })])
        .default({ name: "default" }),
      disks: z.array(z.strictObject({ size: z.number(), bus: z.string() })).optional(),
      image: z.string().pipe(z.string()).optional(),
      nested: z.strictObject({ inner: z.strictObject({ leaf: z.number() }) }).optional(),
    });
    assert.deepEqual(knownKeysAt(schema, []), ["network", "disks", "image", "nested"]);
    assert.deepEqual(knownKeysAt(schema, ["network"]), ["bridge", "name"]);
    assert.deepEqual(knownKeysAt(schema, ["disks", 3]), ["size", "bus"]);
    assert.deepEqual(knownKeysAt(schema, ["nested", "inner"]), ["leaf"]);
    assert.deepEqual(knownKeysAt(schema, ["image"]), []);
    assert.deepEqual(knownKeysAt(schema, ["missing", "x"]), []);
    assert.deepEqual(knownKeysAt(kvmProxyInputsSchema, ["connection"]).slice(0, 3), [
      "host",
      "port",
      "user",
    ]);
  });

  it("suggests a known name only for a likely typo", () => {
    const known = ["network", "memoryMiB", "pool", "connection"];
    assert.equal(closestName("netwrok", known), "network");
    assert.equal(closestName("memorymib", known), "memoryMiB");
    assert.equal(closestName("pol", known), "pool");
    assert.equal(closestName("colour", known), undefined);
    assert.equal(closestName("net", known), undefined);
  });

  /** Runs the built root program under mocks with this stack config; its stdout and exit status. */
  function runRootProgram(config: Record<string, string>): {
    out: string;
    err: string;
    status: number;
  } {
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
    const result = spawnSync(process.execPath, ["--preserve-symlinks", "-e", program], {
      cwd: REPOSITORY,
      encoding: "utf8",
      env: { ...process.env, PULUMI_CONFIG: JSON.stringify(config) },
      timeout: 50_000,
    });
    return { out: result.stdout, err: result.stderr, status: result.status ?? -1 };
  }

  it("the built root program declares the pool and serializes providers as requires of the package", function () {
    this.timeout(120_000);
    const { out, err, status } = runRootProgram({});
    assert.equal(status, 0, err);
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

  it("the built root program stops on a bad config before declaring anything, each problem said once", function () {
    this.timeout(120_000);
    const pool = {
      count: 2,
      backends: [
        { name: "kvm1", kvm: { netwrok: { bridge: "br0" } } },
        { name: "kvm1", kvm: {} },
      ],
      squid: { basicAuthUser: "crawler" },
    };
    const { out, err, status } = runRootProgram({
      "egress-proxies:pool": JSON.stringify(pool),
      "egress-proxies:basicAuthPassword": "tiny",
    });
    assert.notEqual(status, 0, err);
    assert.deepEqual(JSON.parse(out.trim().split("\n").at(-1)!), [], "no resource is declared");
    const expected = [
      "egress-proxies:pool.backends[0].kvm.netwrok is not a known setting; did you mean network?",
      'egress-proxies:pool.backends[1].name "kvm1" is used twice; names must be unique',
      "egress-proxies:basicAuthPassword must be at least 8 characters",
    ];
    assert.match(err, /stack config is not valid:/);
    for (const line of expected)
      assert.equal(err.split(line).length - 1, 1, `once: ${line}\n${err}`);
    assert.ok(!`${out}${err}`.includes("tiny"), "the password is never printed");
  });
});

describe("root program: the gateway in stack config", () => {
  const pool = (gateway: unknown) => ({
    backends: [
      { name: "kvm1", kvm: {} },
      { name: "pve1", proxmox: PROXMOX },
    ],
    count: 2,
    gateway,
  });
  const PASSWORDS = JSON.stringify({
    crawler: "crawler-password-1",
    "team-b": "team-b-password-2",
  });

  it("becomes the pool's gateway: users with their passwords as secrets, where it runs, labels", () => {
    const wrapped: string[] = [];
    const result = poolArgsFromStackConfig(
      {
        pool: pool({
          users: ["crawler", "team-b"],
          backendLabels: { pve1: ["country-de"] },
          kubernetes: { namespace: "crawlers", replicas: 3 },
        }),
        gatewayPasswords: PASSWORDS,
      },
      (text) => {
        wrapped.push(text);
        return `secret(${text.length})`;
      },
    );
    assert.ok(result.ok, result.ok ? "" : result.problems.join("\n"));
    assert.deepEqual(result.args.gateway, {
      users: [
        { name: "crawler", password: "secret(18)" },
        { name: "team-b", password: "secret(17)" },
      ],
      backendLabels: { pve1: ["country-de"] },
      kubernetes: { namespace: "crawlers", replicas: 3 },
    });
    assert.ok(wrapped.includes("crawler-password-1") && wrapped.includes("team-b-password-2"));
  });

  it("publishes the gateway's metrics when kubernetes.metrics is given, and names a bad port by its key", () => {
    const result = poolArgsFromStackConfig(
      {
        pool: pool({
          users: ["crawler"],
          kubernetes: { namespace: "crawlers", metrics: { port: 9200 } },
        }),
        gatewayPasswords: JSON.stringify({ crawler: "crawler-password-1" }),
      },
      (text) => `secret(${text.length})`,
    );
    assert.ok(result.ok, result.ok ? "" : result.problems.join("\n"));
    assert.deepEqual(result.args.gateway?.kubernetes, {
      namespace: "crawlers",
      metrics: { port: 9200 },
    });
    const problems = problemsOf({
      pool: pool({
        users: ["crawler"],
        kubernetes: { namespace: "crawlers", metrics: { port: 80 } },
      }),
      gatewayPasswords: JSON.stringify({ crawler: "crawler-password-1" }),
    });
    assert.deepEqual(problems, [
      "egress-proxies:pool.gateway.kubernetes.metrics.port must be a whole number from 1024 to 65535 (the sidecar runs unprivileged), e.g. 9102",
    ]);
    const misspelt = problemsOf({
      pool: pool({
        users: ["crawler"],
        kubernetes: { namespace: "crawlers", metrics: { prot: 9200 } },
      }),
      gatewayPasswords: JSON.stringify({ crawler: "crawler-password-1" }),
    });
    assert.equal(misspelt.length, 1);
    assert.match(misspelt[0]!, /gateway\.kubernetes\.metrics/);
    assert.match(misspelt[0]!, /prot/);
  });

  it("names every problem by its key, never quoting a password", () => {
    const problems = problemsOf({
      pool: pool({ users: ["crawler", "nobody"], vm: { backend: "elsewhere" } }),
      gatewayPasswords: JSON.stringify({ crawler: "short", stranger: "stranger-password-9" }),
    });
    assert.deepEqual(problems, [
      `egress-proxies:gatewayPasswords: the password of "crawler" must be at least 12 characters, without line breaks; set it again with \`pulumi config set --secret egress-proxies:gatewayPasswords '{"<user>":"<password>"}'\``,
      `egress-proxies:pool.gateway.users names "nobody", who has no password in egress-proxies:gatewayPasswords: \`pulumi config set --secret egress-proxies:gatewayPasswords '{"<user>":"<password>"}'\``,
      'egress-proxies:gatewayPasswords has a password for "stranger", who is not in egress-proxies:pool.gateway.users: add the user or remove the password',
      'egress-proxies:pool.gateway.vm.backend must name one of the pool\'s KVM or Proxmox backends (kvm1, pve1), not "elsewhere"',
    ]);
    assert.doesNotMatch(problems.join("\n"), /short|stranger-password-9/);
    const garbled = problemsOf({
      pool: pool({ users: ["crawler"], vm: { backend: "kvm1" } }),
      gatewayPasswords: "{crawler: hunter2",
    });
    assert.equal(garbled.length, 1);
    assert.match(
      garbled[0]!,
      /^egress-proxies:gatewayPasswords must be a JSON object of user name to password/,
    );
    assert.doesNotMatch(garbled[0]!, /hunter2/);
    assert.deepEqual(problemsOf({ pool: pool(undefined), gatewayPasswords: PASSWORDS }), [
      "egress-proxies:gatewayPasswords is set but egress-proxies:pool.gateway is not: add the gateway, or `pulumi config rm egress-proxies:gatewayPasswords`",
    ]);
  });
});
