import { strict as assert } from "node:assert";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { ConfigError, parseConfig } from "../../../reaper/config";
import { kvmDialTargetOf } from "../../../reaper/kvm";
import { parseState, readStates, StateReadError } from "../../../reaper/states";

const urn = (stack: string, project: string, name: string) =>
  `urn:pulumi:${stack}::${project}::pulumi-nodejs:dynamic:Resource::${name}`;

function exportOf(
  stack: string,
  project: string,
  resources: Array<{ name: string; id?: string; vmName?: string }>,
) {
  return JSON.stringify({
    version: 3,
    deployment: {
      manifest: { time: "2026-11-29T00:00:00Z" },
      resources: [
        {
          urn: `urn:pulumi:${stack}::${project}::pulumi:pulumi:Stack::${project}-${stack}`,
          custom: false,
        },
        ...resources.map((resource) => ({
          urn: urn(stack, project, resource.name),
          custom: true,
          ...(resource.id ? { id: resource.id } : {}),
          outputs: resource.vmName ? { vmName: resource.vmName } : {},
        })),
      ],
    },
  });
}

describe("reaper states and config", () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "reaper-states-"))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it("reads an export: project and stack from the URNs, ids and VM names from the resources", () => {
    const state = parseState(
      exportOf("prod", "web", [{ name: "p1", id: "hosts/h/domains/p1-abc", vmName: "p1-abc" }]),
      "export.json",
    );
    assert.equal(state.project, "web");
    assert.equal(state.stack, "prod");
    assert.ok(state.resourceIds.has("hosts/h/domains/p1-abc"));
    assert.ok(state.vmNames.has("p1-abc"));
  });

  it("refuses text that is not a version 3 export, naming the source and the fix", () => {
    assert.throws(
      () => parseState("{not json", "a.json"),
      (error: Error) =>
        error instanceof StateReadError && /a\.json is not JSON/.test(error.message),
    );
    assert.throws(
      () => parseState(JSON.stringify({ version: 2, deployment: {} }), "b.json"),
      /b\.json is neither a stack export nor a checkpoint of version 3/,
    );
    assert.throws(
      () => parseState(JSON.stringify({ version: 3, deployment: { resources: [] } }), "empty.json"),
      /has no resources to tell its project and stack; set project and stack/,
    );
    assert.equal(
      parseState(JSON.stringify({ version: 3, deployment: { resources: [] } }), "e", {
        project: "web",
        stack: "dev",
      }).stack,
      "dev",
    );
    assert.throws(
      () => parseState(exportOf("prod", "web", []), "c.json", { stack: "dev" }),
      /belongs to web\/prod, but the config says web\/dev/,
    );
  });

  it("reads every stack of a file backend (plain and gzipped, backups ignored)", async () => {
    const stacks = join(dir, ".pulumi", "stacks", "web");
    mkdirSync(stacks, { recursive: true });
    const checkpoint = (stack: string, id: string) =>
      JSON.stringify({
        version: 3,
        checkpoint: {
          stack,
          latest: { resources: [{ urn: urn(stack, "web", "p"), id, custom: true }] },
        },
      });
    writeFileSync(join(stacks, "prod.json"), checkpoint("prod", "hosts/h/domains/a"));
    writeFileSync(join(stacks, "dev.json.gz"), gzipSync(checkpoint("dev", "hosts/h/domains/b")));
    writeFileSync(join(stacks, "prod.json.bak"), "not even json");
    const states = await readStates([{ fileBackend: dir }]);
    assert.deepEqual(states.map((s) => `${s.project}/${s.stack}`).sort(), ["web/dev", "web/prod"]);
    writeFileSync(join(stacks, "broken.json"), "{");
    await assert.rejects(readStates([{ fileBackend: dir }]), StateReadError);
    await assert.rejects(
      readStates([{ fileBackend: join(dir, "nope") }]),
      /has no \.pulumi\/stacks directory/,
    );
  });

  it("runs a state command; a failing command is an error that does not echo its output", async () => {
    const file = join(dir, "export.json");
    writeFileSync(file, exportOf("prod", "web", [{ name: "p", id: "x" }]));
    const [state] = await readStates([{ command: ["cat", file], timeoutSeconds: 10 }]);
    assert.equal(state!.stack, "prod");
    const failing = readStates([
      { command: ["sh", "-c", "echo token=SECRET123 >&2; exit 4"], timeoutSeconds: 10 },
    ]);
    await assert.rejects(
      failing,
      (error: Error) =>
        /exited with status 4/.test(error.message) && !error.message.includes("SECRET123"),
    );
  });

  it("takes jump hosts for a KVM host and gives them to KvmProxy's connection with their files read", () => {
    const dir = mkdtempSync(join(tmpdir(), "reaper-jump-"));
    try {
      writeFileSync(
        join(dir, "hop_key"),
        "-----BEGIN OPENSSH PRIVATE KEY-----\nhop\n-----END OPENSSH PRIVATE KEY-----\n",
      );
      writeFileSync(join(dir, "hop_known_hosts"), "bastion ssh-ed25519 AAAA\n");
      const config = parseConfig({
        states: [{ checkpointFile: "/x.json" }],
        kvm: [
          {
            name: "kvm1",
            connection: {
              host: "10.0.0.5",
              proxyJump: [
                "ops@jump1:2222",
                {
                  host: "bastion",
                  privateKeyFile: join(dir, "hop_key"),
                  knownHostsFile: join(dir, "hop_known_hosts"),
                },
              ],
            },
            pools: ["default"],
          },
        ],
      });
      const target = kvmDialTargetOf(config.kvm[0]!);
      assert.deepEqual(target.connection?.proxyJump, [
        "ops@jump1:2222",
        {
          host: "bastion",
          port: 22,
          insecureIgnoreHostKey: false,
          privateKey:
            "-----BEGIN OPENSSH PRIVATE KEY-----\nhop\n-----END OPENSSH PRIVATE KEY-----\n",
          knownHosts: "bastion ssh-ed25519 AAAA\n",
        },
      ]);
      assert.throws(
        () =>
          parseConfig({
            states: [{ checkpointFile: "/x.json" }],
            kvm: [
              {
                name: "k",
                pools: ["p"],
                connection: { host: "h", proxyJump: [{ hostname: "x" }] },
              },
            ],
          }),
        ConfigError,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("validates the config with field paths and fixes", () => {
    const good = parseConfig({
      states: [{ checkpointFile: "/x.json" }],
      kvm: [
        {
          name: "kvm1",
          connection: { host: "kvm1.lan", privateKeyFile: "/k" },
          pools: ["default"],
        },
      ],
      proxmox: [
        {
          name: "pve1",
          apiEndpoint: "https://pve:8006",
          nodes: [{ node: "pve", seedStorage: "local" }],
        },
      ],
    });
    assert.equal(good.kvm[0]!.connection!.port, 22);
    assert.equal(good.proxmox[0]!.apiTokenEnv, "PROXMOX_VE_API_TOKEN");
    assert.throws(
      () => parseConfig({ states: [] }, "r.json"),
      (error: Error) =>
        error instanceof ConfigError &&
        /r\.json\.states: states must list at least one/.test(error.message),
    );
    assert.throws(
      () =>
        parseConfig(
          { states: [{ checkpointFile: "/x" }], kvm: [{ name: "k", pools: [] }] },
          "r.json",
        ),
      /r\.json\.kvm\[0\]\.pools: pools must name at least one storage pool/,
    );
    assert.throws(
      () =>
        parseConfig({
          states: [{ checkpointFile: "/x" }],
          kvm: [
            { name: "a", pools: ["p"] },
            { name: "a", pools: ["p"] },
          ],
        }),
      /backend name "a" is used twice/,
    );
    assert.throws(
      () =>
        parseConfig({
          states: [{ checkpointFile: "/x" }],
          proxmox: [
            { name: "p", apiEndpoint: "pve:8006", nodes: [{ node: "n", seedStorage: "s" }] },
          ],
        }),
      /proxmox\[0\]\.apiEndpoint: apiEndpoint must be a URL/,
    );
  });
});
