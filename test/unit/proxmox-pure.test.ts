// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import {
  NotFoundError,
  PermanentError,
  TransientError,
  withContext,
} from "../../provider/common/errors";
import {
  classifyApiFailure,
  classifyTaskFailure,
  isCredentialRejected,
  classifyTransportFailure,
} from "../../provider/proxmox/classify";
import { decideProxmoxDiff as decideDiff } from "../../provider/proxmox/diff";
import * as provider from "../../provider/proxmox/provider";
import { UNKNOWN } from "../../provider/proxmox/schema";
import {
  bootDisk,
  diskSizeBytes,
  ide2Problem,
  rewriteNet0,
} from "../../provider/proxmox/vm-config";
import { preferredVmid, vmidCandidates } from "../../provider/proxmox/vmid";
import {
  CONFIG_KEYS,
  rememberProviderConfig,
  resolveConnection,
} from "../../provider/proxmox/connection";

const OWNER = { project: "egress", stack: "dev", resource: "edge-1" };
const BASE = {
  node: "pve",
  templateVmid: 9000,
  diskStorage: "local-lvm",
  seedStorage: "seeds",
  owner: OWNER,
};

describe("proxmox classify: a refused credential", () => {
  const refused = (status: number, message: string) =>
    classifyApiFailure({
      method: "POST",
      path: "/nodes/pve/qemu/9000/clone",
      status,
      message,
      parameterErrors: {},
      token: { id: "proxy@pve!egress", source: "PROXMOX_VE_API_TOKEN" },
    });

  it("a 401 and a 403 are refusals that stop the call; other Permanent errors are not", () => {
    assert.equal(isCredentialRejected(refused(401, "Authentication failed!")), true);
    assert.equal(isCredentialRejected(refused(403, "Only root may use this option.")), true);
    assert.equal(
      isCredentialRejected(
        withContext(refused(403, "Permission check failed (/, Sys.Audit)"), {
          operation: "create",
        }),
      ),
      true,
    );
    assert.equal(isCredentialRejected(refused(400, "Parameter verification failed.")), false);
    assert.equal(isCredentialRejected(refused(500, "VM 1 is running - destroy failed")), false);
  });

  it("a 403 names the token, and the privilege and path when PVE says them", () => {
    assert.match(
      refused(403, "Permission check failed (/vms/9000, VM.Clone)").message,
      /refused API token proxy@pve!egress \(from PROXMOX_VE_API_TOKEN\): grant privilege VM\.Clone on path \/vms\/9000/,
    );
    assert.match(
      refused(403, "Only root may use this option.").message,
      /refused API token proxy@pve!egress \(from PROXMOX_VE_API_TOKEN\); grant its role the privileges listed in docs\/proxmox\.md/,
    );
  });
});

describe("proxmox classify: the one table", () => {
  const api = (status: number, message: string, parameterErrors: Record<string, string> = {}) =>
    classifyApiFailure({ method: "GET", path: "/x", status, message, parameterErrors });
  const rows: Array<[string, ReturnType<typeof api>, new (...args: never[]) => Error]> = [
    [
      "F2 missing config → NotFound",
      api(500, "Configuration file 'nodes/pve/qemu-server/1.conf' does not exist"),
      NotFoundError,
    ],
    ["F22 401 → Permanent", api(401, "Authentication failed!"), PermanentError],
    ["F17 403 → Permanent", api(403, "Permission check failed (/vms/1, VM.Audit)"), PermanentError],
    [
      "flock got timeout → Transient",
      api(500, "can't lock file '/var/lock/qemu-server/lock-1.conf' - got timeout"),
      TransientError,
    ],
    [
      "got no worker upid → Transient",
      api(500, "got no worker upid - command failed"),
      TransientError,
    ],
    ["F7 locked → Transient", api(500, "VM is locked (clone)"), TransientError],
    [
      "F5 agent not running → Transient",
      api(500, "QEMU guest agent is not running"),
      TransientError,
    ],
    ["F5 VM not running → Transient", api(500, "VM 100 is not running"), TransientError],
    [
      "F5 qmp/qga timeout → Transient",
      api(500, "VM 100 qmp command 'guest-ping' failed - got timeout"),
      TransientError,
    ],
    [
      "F5 no agent configured → Permanent",
      api(500, "No QEMU guest agent configured"),
      PermanentError,
    ],
    ["596 proxy timeout → Transient", api(596, "Connection timed out"), TransientError],
    ["503 → Transient", api(503, "Service Unavailable"), TransientError],
    [
      "F4 taken → Permanent (handled by create)",
      api(500, "unable to create VM 5: config file already exists"),
      PermanentError,
    ],
    [
      "F9 400 → Permanent",
      api(400, "Parameter verification failed.", { tags: "invalid format" }),
      PermanentError,
    ],
    ["running destroy → Permanent", api(500, "VM 1 is running - destroy failed"), PermanentError],
    [
      "storage lock in a task → Transient",
      classifyTaskFailure(
        "UPID:pve:00000001:00000002:00000003:qmclone:9000:a@pve!t:",
        "can't lock file '/var/lock/pve-manager/pve-storage-x' - got timeout",
        [],
      ),
      TransientError,
    ],
    [
      "shrink in a task → Permanent",
      classifyTaskFailure(
        "UPID:pve:00000001:00000002:00000003:resize:1:a@pve!t:",
        "shrinking disks is not supported",
        [],
      ),
      PermanentError,
    ],
    [
      "TLS trust → Permanent",
      classifyTransportFailure(
        "GET",
        "/x",
        Object.assign(new Error("self-signed"), { code: "SELF_SIGNED_CERT_IN_CHAIN" }),
        1000,
      ),
      PermanentError,
    ],
    [
      "refused → Transient",
      classifyTransportFailure(
        "GET",
        "/x",
        Object.assign(new Error("refused"), { code: "ECONNREFUSED" }),
        1000,
      ),
      TransientError,
    ],
    [
      "abort → Transient",
      classifyTransportFailure(
        "GET",
        "/x",
        Object.assign(new Error("aborted"), { name: "TimeoutError" }),
        1000,
      ),
      TransientError,
    ],
  ];
  for (const [name, error, expected] of rows)
    it(name, () =>
      assert.ok(error instanceof expected, `${name}: got ${error.name}: ${error.message}`),
    );

  it("a 401 names the token id and where it was set, never more of the token", () => {
    const error = classifyApiFailure({
      method: "GET",
      path: "/nodes",
      status: 401,
      message: "Authentication failed!",
      parameterErrors: {},
      token: { id: "automation@pve!egress", source: "config egress-proxies:proxmoxApiToken" },
    });
    assert.ok(error instanceof PermanentError);
    assert.equal(
      error.message,
      "GET /nodes: 401 Authentication failed!: Proxmox rejected API token automation@pve!egress " +
        "(from config egress-proxies:proxmoxApiToken): that token id does not exist there, has expired, " +
        "or its secret is not this one; compare the id with Datacenter → Permissions → API Tokens and give " +
        "config egress-proxies:proxmoxApiToken the token as user@realm!tokenid=secret",
    );
  });

  it("puts the task log tail into the error and keeps tokens out", () => {
    const error = classifyTaskFailure(
      "UPID:pve:00000001:00000002:00000003:qmclone:9000:a@pve!t:",
      "boom",
      ["step 1", "Authorization: PVEAPIToken=a@pve!t=abcdef"],
    );
    assert.match(
      error.message,
      /qmclone task failed: boom\n--- task log \(last 2 lines\) ---\nstep 1/,
    );
    assert.doesNotMatch(error.message, /abcdef/);
  });
});

describe("proxmox VMIDs", () => {
  it("are deterministic per name and inside the range (property)", () => {
    fc.assert(
      fc.property(
        fc.string({ minLength: 1 }),
        fc.integer({ min: 100, max: 100000 }),
        fc.integer({ min: 0, max: 5000 }),
        (name, first, width) => {
          const range = { first, last: first + width };
          const vmid = preferredVmid(name, range);
          return vmid === preferredVmid(name, range) && vmid >= range.first && vmid <= range.last;
        },
      ),
    );
  });

  it("candidates visit every VMID of the range once, preferred first", () => {
    const range = { first: 100, last: 109 };
    const all = [...vmidCandidates("proxy-x", range)];
    assert.equal(all[0], preferredVmid("proxy-x", range));
    assert.deepEqual(
      [...all].sort((a, b) => a - b),
      [100, 101, 102, 103, 104, 105, 106, 107, 108, 109],
    );
  });
});

describe("proxmox config rules", () => {
  it("rule 12: net0 rewrite keeps model and MAC; unset leaves it alone", () => {
    const net0 = "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0,firewall=1";
    assert.equal(rewriteNet0(net0, undefined, undefined), undefined);
    assert.equal(
      rewriteNet0(net0, "vmbr1", 20),
      "virtio=BC:24:11:AA:BB:CC,bridge=vmbr1,firewall=1,tag=20",
    );
    assert.equal(
      rewriteNet0("model=e1000,macaddr=bc:24:11:00:00:01,bridge=vmbr0", undefined, 7),
      "e1000=BC:24:11:00:00:01,bridge=vmbr0,tag=7",
    );
  });

  it("rule 8 / F19: the boot disk skips ide2 and cdroms", () => {
    assert.equal(
      bootDisk({
        boot: "order=ide2;scsi0",
        scsi0: "local-lvm:vm-1-disk-0,size=3G",
        ide2: "seeds:iso/a.iso,media=cdrom",
      }),
      "scsi0",
    );
    assert.equal(
      bootDisk({ boot: "order=net0;virtio0", virtio0: "x:vm-1-disk-0,size=3G" }),
      "virtio0",
    );
    assert.equal(bootDisk({ scsi0: "x:vm-1-disk-0,size=3G" }), "scsi0");
  });

  it("reads disk sizes with units", () => {
    assert.equal(diskSizeBytes("local-lvm:vm-1-disk-0,size=3G"), 3 * 1024 ** 3);
    assert.equal(diskSizeBytes("local-lvm:vm-1-disk-0,size=512M,ssd=1"), 512 * 1024 ** 2);
    assert.equal(diskSizeBytes("local-lvm:vm-1-disk-0"), undefined);
  });

  it("F19: a template whose ide2 holds a cloud-init drive is unsuitable; an empty drive is fine", () => {
    assert.match(
      ide2Problem({ ide2: "local-lvm:vm-9000-cloudinit,media=cdrom" }, "seeds:iso/p.iso") ?? "",
      /remove the template's cloud-init drive/,
    );
    assert.equal(ide2Problem({ ide2: "none,media=cdrom" }, "seeds:iso/p.iso"), undefined);
    assert.equal(
      ide2Problem({ ide2: "seeds:iso/p.iso,media=cdrom" }, "seeds:iso/p.iso"),
      undefined,
    );
  });
});

describe("proxmox check: offline, pure, precise", () => {
  it("generates a VM name from the resource name and keeps it on later checks", async () => {
    const first = await provider.check({}, BASE);
    assert.deepEqual(first.failures, []);
    assert.match(String(first.inputs.vmName), /^edge-1-[a-z2-7]{10}$/);
    assert.equal(first.inputs.vmNameChosenBy, "provider");
    const again = await provider.check(first.inputs, BASE);
    assert.equal(again.inputs.vmName, first.inputs.vmName);
  });

  it("gives a replacement a fresh generated name, so create-before-delete cannot collide", async () => {
    const first = await provider.check({}, BASE);
    const sameAgain = await provider.check(first.inputs, { ...BASE });
    assert.equal(
      sameAgain.inputs.vmName,
      first.inputs.vmName,
      "defaults applied must not look like a change",
    );
    const inPlace = await provider.check(first.inputs, { ...BASE, tags: ["x"] });
    assert.equal(inPlace.inputs.vmName, first.inputs.vmName);
    const replaced = await provider.check(first.inputs, { ...BASE, cores: 4 });
    assert.notEqual(replaced.inputs.vmName, first.inputs.vmName);
    assert.match(String(replaced.inputs.vmName), /^edge-1-[a-z2-7]{10}$/);
    const fixed = await provider.check(
      { ...first.inputs, vmName: "edge", vmNameChosenBy: "user" },
      { ...BASE, vmName: "edge", cores: 4 },
    );
    assert.equal(fixed.inputs.vmName, "edge");
  });

  it("fills defaults and folds tags to a sorted set (no perpetual diff, rule 7)", async () => {
    const { inputs } = await provider.check({}, { ...BASE, tags: ["B", "a", "b"] });
    assert.deepEqual(inputs.tags, ["a", "b"]);
    assert.deepEqual(inputs.vmidRange, { first: 20000, last: 29999 });
    assert.deepEqual(inputs.readiness, { mode: "port", port: 3128 });
    assert.equal(inputs.installGuestAgent, true);
  });

  const failures: Array<[string, Record<string, unknown>, RegExp]> = [
    ["vlanTag", { vlanTag: 4095 }, /vlanTag must be at most 4094/],
    ["vlanTag", { vlanTag: 0 }, /vlanTag must be at least 1/],
    ["tags.0", { tags: ["has space"] }, /use letters, digits and _ - \+ \./],
    ["vmName", { vmName: "Bad_Name" }, /vmName "Bad_Name" must be a DNS label/],
    ["cores", { cores: 1.5 }, /cores must be a whole number/],
    ["diskStorage", { diskStorage: "bad storage" }, /diskStorage must be a Proxmox storage id/],
    ["apiToken", { apiToken: "secret-only" }, /apiToken must look like user@realm!tokenid=secret/],
    [
      "vmidRange",
      { vmidRange: { first: 300, last: 200 } },
      /vmidRange\.last must not be below vmidRange\.first/,
    ],
    ["colour", { colour: "blue" }, /colour is not an input of ProxmoxProxy; remove it/],
    ["apiEndpoint", { apiEndpoint: "http://pve:8006" }, /apiEndpoint must be an https URL/],
    ["apiEndpoint", { apiEndpoint: "https://root:pw@pve:8006" }, /without credentials/],
  ];
  for (const [property, extra, reason] of failures)
    it(`names ${property} and the fix when it is wrong`, async () => {
      const result = await provider.check({}, { ...BASE, ...extra });
      assert.equal(result.failures.length, 1, JSON.stringify(result.failures));
      assert.equal(result.failures[0].property, property);
      assert.match(result.failures[0].reason, reason);
    });

  it("never echoes a bad token back in its failure", async () => {
    const result = await provider.check({}, { ...BASE, apiToken: "hunter2-secret" });
    assert.doesNotMatch(JSON.stringify(result.failures), /hunter2/);
  });

  it("accepts unknown values (preview) without failures, keeping them unknown", async () => {
    const result = await provider.check(
      {},
      { ...BASE, node: UNKNOWN, vlanTag: UNKNOWN, tags: [UNKNOWN], userData: UNKNOWN },
    );
    assert.deepEqual(result.failures, []);
    assert.equal(result.inputs.node, UNKNOWN);
    assert.match(String(result.inputs.vmName), /^edge-1-/);
  });

  it("still reports a known bad value beside unknown ones", async () => {
    const result = await provider.check({}, { ...BASE, node: UNKNOWN, cores: 0 });
    assert.deepEqual(
      result.failures.map((f) => f.property),
      ["cores"],
    );
  });

  it("needs no credentials, no network and no environment", async () => {
    const saved = { ...process.env };
    delete process.env.PROXMOX_VE_ENDPOINT;
    delete process.env.PROXMOX_VE_API_TOKEN;
    try {
      const { inputs, failures } = await provider.check({}, BASE);
      assert.deepEqual(failures, []);
      const decision = await provider.diff("nodes/pve/qemu/1", inputs, inputs);
      assert.equal(decision.changes, false);
    } finally {
      Object.assign(process.env, saved);
    }
  });
});

describe("proxmox diff: the decision table", () => {
  const olds = {
    ...BASE,
    vmName: "edge-1-abcdefghij",
    vmNameChosenBy: "provider",
    cores: 1,
    tags: ["a"],
    apiToken: "u@pve!t=1",
    __provider: "p1",
  };

  it("replaces on anything about the VM itself", () => {
    for (const [key, value] of Object.entries({
      cores: 2,
      node: "pve2",
      templateVmid: 9001,
      userData: "#cloud-config\n",
      vlanTag: 5,
      diskGiB: 20,
    })) {
      const decision = decideDiff(olds, { ...olds, [key]: value });
      assert.deepEqual(decision.replaces, [key], key);
      assert.equal(decision.deleteBeforeReplace, false);
    }
  });

  it("updates in place for credentials, tags, readiness and timeouts", () => {
    for (const [key, value] of Object.entries({
      apiToken: "u@pve!t=2",
      tags: ["a", "b"],
      readiness: { mode: "none", port: 3128 },
      timeouts: { createSeconds: 60 },
    })) {
      const decision = decideDiff(olds, { ...olds, [key]: value });
      assert.equal(decision.changes, true, key);
      assert.deepEqual(decision.replaces, [], key);
    }
  });

  it("deletes before replacing only when the user fixed the name", () => {
    const fixed = { ...olds, vmName: "edge", vmNameChosenBy: "user" };
    assert.equal(decideDiff(fixed, { ...fixed, cores: 4 }).deleteBeforeReplace, true);
  });

  it("treats an unknown value as a change (replace when the field replaces)", () => {
    assert.deepEqual(decideDiff(olds, { ...olds, node: UNKNOWN }).replaces, ["node"]);
  });

  it("reports a new serialized provider as a change, so new code reaches state", () => {
    const decision = decideDiff(olds, { ...olds, __provider: "p2" });
    assert.deepEqual([decision.changes, decision.replaces], [true, []]);
  });

  it("sees no change in identical inputs", () => {
    assert.equal(decideDiff(olds, { ...olds }).changes, false);
  });
});

describe("proxmox connection resolution", () => {
  const env = {
    PROXMOX_VE_ENDPOINT: "https://env:8006",
    PROXMOX_VE_API_TOKEN: "e@pve!t=env",
    PROXMOX_VE_INSECURE: "1",
  };

  it("prefers inputs, then the environment", () => {
    const fromInputs = resolveConnection(
      { apiEndpoint: "https://in:8006", apiToken: "i@pve!t=in" },
      env,
    );
    assert.equal(fromInputs.endpoint, "https://in:8006");
    assert.equal(fromInputs.apiToken.reveal(), "i@pve!t=in");
    assert.equal(fromInputs.apiTokenSource, "apiToken");
    const fromEnv = resolveConnection({}, env);
    assert.equal(fromEnv.apiTokenSource, "PROXMOX_VE_API_TOKEN");
    assert.equal(fromEnv.endpoint, "https://env:8006");
    assert.equal(fromEnv.insecure, true);
    assert.equal(String(fromEnv.apiToken), "[redacted]");
  });

  it("remembers that a token came from provider config, for messages", () => {
    rememberProviderConfig({
      get: (key) => (key === CONFIG_KEYS.apiToken ? "c@pve!t=from-config" : undefined),
    });
    try {
      const connection = resolveConnection({ apiEndpoint: "https://in:8006" }, env);
      assert.equal(connection.apiToken.reveal(), "c@pve!t=from-config");
      assert.equal(connection.apiTokenSource, "config egress-proxies:proxmoxApiToken");
    } finally {
      rememberProviderConfig(undefined);
    }
  });

  it("says where credentials can come from when there are none", () => {
    assert.throws(
      () => resolveConnection({}, {}),
      /set apiEndpoint, config egress-proxies:proxmoxEndpoint, or PROXMOX_VE_ENDPOINT/,
    );
    assert.throws(
      () => resolveConnection({ apiEndpoint: "https://x:8006" }, {}),
      /PROXMOX_VE_API_TOKEN/,
    );
  });

  it("reads PROXMOX_VE_CA_CERT as a file path or as PEM text", () => {
    const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const dir = mkdtempSync(join(tmpdir(), "pve-ca-"));
    try {
      writeFileSync(join(dir, "ca.pem"), pem);
      assert.equal(
        resolveConnection({}, { ...env, PROXMOX_VE_CA_CERT: join(dir, "ca.pem") }).caCertPem,
        pem,
      );
      assert.equal(resolveConnection({}, { ...env, PROXMOX_VE_CA_CERT: pem }).caCertPem, pem);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("names PROXMOX_VE_CA_CERT when it is neither PEM nor a file", () => {
    assert.throws(
      () => resolveConnection({}, { ...env, PROXMOX_VE_CA_CERT: "/nonexistent/ca.pem" }),
      /PROXMOX_VE_CA_CERT/,
    );
  });
});
