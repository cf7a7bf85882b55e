/**
 * Guest files delivered in place (provider/common/guest-files.ts): the change
 * rule through each VM resource's real check and diff (a user-data that
 * differs only in the delivered files is an update, a new identity
 * replaces, a VM made before guestFiles existed is upgraded in place), what
 * an update delivers, and the delivery itself over a channel that keeps a
 * guest's files in memory: written, commands run, read back, port checked,
 * and everything put back when a step fails.
 */
import { strict as assert } from "node:assert";
import {
  deliverGuestFiles,
  GuestDeliveryError,
  guestFilesToDeliver,
  type GuestChannel,
  type GuestFiles,
} from "../../provider/common/guest-files";
import { disruptionLedger } from "../../provider/common/disruption-budget";
import * as kvm from "../../provider/kvm/provider";
import * as proxmox from "../../provider/proxmox/provider";
import { KVM_MINIMAL_INPUTS, PROXMOX_MINIMAL_INPUTS } from "../support/vm-inputs";

type Props = Record<string, unknown>;
const owner = { project: "p", stack: "s", resource: "crawl-kvm1-0" };
const files = (squidConf: string, identity = "skeleton-1") => ({
  files: [{ path: "/etc/squid/squid.conf", content: squidConf, permissions: "0644" }],
  commands: [["systemctl", "reload-or-restart", "squid"]],
  listensOn: 3128,
  userDataIdentity: identity,
});
const userData = (squidConf: string, packages = "squid") =>
  `#cloud-config\npackages: [${packages}]\nwrite_files:\n  - path: /etc/squid/squid.conf\n    content: |\n      ${squidConf}\n`;

const backends = [
  {
    name: "KvmProxy",
    provider: kvm,
    raw: (extra: Props): Props => ({ owner, ...KVM_MINIMAL_INPUTS, ...extra }),
  },
  {
    name: "ProxmoxProxy",
    provider: proxmox,
    raw: (extra: Props): Props => ({ owner, ...PROXMOX_MINIMAL_INPUTS, ...extra }),
  },
];

for (const backend of backends)
  describe(`guest files: ${backend.name}'s check and diff`, () => {
    const { provider } = backend;
    beforeEach(() => disruptionLedger.reset());

    async function created(extra: Props): Promise<Props> {
      const checked = await provider.check({}, backend.raw(extra));
      assert.deepEqual(checked.failures, []);
      return { ...checked.inputs, host: "h", state: "running" };
    }
    async function plan(olds: Props, extra: Props) {
      const checked = await provider.check(olds, backend.raw(extra));
      assert.deepEqual(checked.failures, []);
      const decision = await provider.diff("id", olds, checked.inputs);
      return { inputs: checked.inputs, changes: decision.changes, replaces: decision.replaces };
    }

    it("a squid.conf change with the same identity updates in place; the VM keeps its name", async () => {
      const olds = await created({
        userData: userData("http_port 3128"),
        guestFiles: files("http_port 3128"),
      });
      const next = await plan(olds, {
        userData: userData("http_port 3128\nvia off"),
        guestFiles: files("http_port 3128\nvia off"),
      });
      assert.deepEqual([next.changes, next.replaces], [true, []]);
      assert.equal(next.inputs.vmName, olds.vmName);
      assert.equal(
        guestFilesToDeliver(olds, next.inputs)?.files[0]?.content,
        "http_port 3128\nvia off",
      );
    });

    it("a new identity (another package, the user's own cloud-init) replaces, as user-data always did", async () => {
      const olds = await created({ userData: userData("a"), guestFiles: files("a") });
      const next = await plan(olds, {
        userData: userData("b", "squid, python3"),
        guestFiles: files("b", "skeleton-2"),
      });
      assert.ok(next.replaces?.includes("guestFiles.userDataIdentity"), String(next.replaces));
      // The whole document goes with it: a replacement the budget defers must leave all of it as it was.
      for (const path of ["userData", "guestFiles.files"])
        assert.ok(next.replaces?.includes(path), path);
      assert.notEqual(next.inputs.vmName, olds.vmName);
    });

    it("without guestFiles, or without an identity, a user-data change replaces", async () => {
      const bare = await created({ userData: userData("a") });
      assert.ok((await plan(bare, { userData: userData("b") })).replaces?.includes("userData"));
      const { userDataIdentity: _dropped, ...anonymous } = files("a");
      const unnamed = await created({ userData: userData("a"), guestFiles: anonymous });
      const next = await plan(unnamed, {
        userData: userData("b"),
        guestFiles: { ...anonymous, files: files("b").files },
      });
      assert.ok(next.replaces?.includes("userData"));
    });

    it("a VM made before guestFiles existed (the previous release) is upgraded in place, not replaced", async () => {
      const previous = await created({ userData: userData("old document") });
      const next = await plan(previous, {
        userData: userData("new document"),
        guestFiles: files("new document"),
      });
      assert.deepEqual([next.changes, next.replaces], [true, []]);
      assert.equal(guestFilesToDeliver(previous, next.inputs)?.files[0]?.content, "new document");
      // The same document as before: cloud-init wrote these very files; state only learns them.
      const same = await plan(previous, {
        userData: userData("old document"),
        guestFiles: files("old document"),
      });
      assert.deepEqual(same.replaces, []);
      assert.equal(guestFilesToDeliver(previous, same.inputs), undefined);
    });

    it("refuses guest files it could not deliver, naming the field and the fix", async () => {
      const checked = await provider.check(
        {},
        backend.raw({
          guestFiles: {
            files: [{ path: "etc/squid.conf", content: "x", permissions: "644x" }],
            commands: [[]],
          },
        }),
      );
      const messages = checked.failures.map((failure) => failure.reason).join("\n");
      assert.match(messages, /guestFiles\.files\[\]\.path must be an absolute file path/);
      assert.match(
        messages,
        /guestFiles\.files\[\]\.permissions must be an octal mode, e\.g\. "0644"/,
      );
      assert.match(messages, /guestFiles\.commands\[\] must be a non-empty argv/);
    });
  });

/** A guest's files in memory, its commands logged; `failing` makes a command exit 1. */
function guest(
  initial: Record<string, string>,
  options: { failing?: string; listens?: boolean } = {},
) {
  const files = new Map(Object.entries(initial).map(([path, text]) => [path, Buffer.from(text)]));
  const ran: string[] = [];
  const listenTable = (listening: boolean) =>
    Buffer.from(
      "  sl  local_address rem_address   st\n" +
        (listening
          ? "   0: 00000000:0C38 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 1\n"
          : ""),
    );
  const channel: GuestChannel = {
    read: async (path) =>
      path.startsWith("/proc/net/tcp")
        ? listenTable(options.listens !== false && path === "/proc/net/tcp")
        : files.get(path),
    write: async (path, content) => void files.set(path, Buffer.from(content)),
    run: async (argv) => {
      ran.push(argv.join(" "));
      if (argv[0] === "rm") files.delete(argv[2]!);
      const bad = files.get("/etc/squid/squid.conf")?.toString().includes("via off") === true;
      return bad && argv.join(" ") === options.failing
        ? { exitCode: 1, output: "Job failed.\nSee journalctl" }
        : { exitCode: 0, output: "" };
    },
  };
  const text = (path: string) => files.get(path)?.toString();
  return { channel, ran, text };
}

const delivery: GuestFiles = {
  files: [
    { path: "/etc/squid/squid.conf", content: "http_port 3128\nvia off\n", permissions: "0644" },
    {
      path: "/etc/squid/egress-proxies.htpasswd",
      content: "crawler:$6$s$h\n",
      permissions: "0640",
    },
  ],
  commands: [["systemctl", "reload-or-restart", "squid"]],
  listensOn: 3128,
};

describe("guest files: the delivery", () => {
  it("writes each file with its mode, runs the commands, reads back and sees the port listened on", async () => {
    const vm = guest({ "/etc/squid/squid.conf": "http_port 3128\n" });
    await deliverGuestFiles(vm.channel, delivery, "domain m on h");
    assert.equal(vm.text("/etc/squid/squid.conf"), "http_port 3128\nvia off\n");
    assert.equal(vm.text("/etc/squid/egress-proxies.htpasswd"), "crawler:$6$s$h\n");
    assert.deepEqual(vm.ran, [
      "chmod 0644 /etc/squid/squid.conf",
      "chmod 0640 /etc/squid/egress-proxies.htpasswd",
      "systemctl reload-or-restart squid",
    ]);
  });

  it("a command that fails: the previous files back (a new one removed), the commands again, an error that says so", async () => {
    const vm = guest(
      { "/etc/squid/squid.conf": "http_port 3128\n" },
      { failing: "systemctl reload-or-restart squid" },
    );
    await assert.rejects(
      deliverGuestFiles(vm.channel, delivery, "domain m on h"),
      (error: Error) => {
        assert.ok(error instanceof GuestDeliveryError);
        assert.match(
          error.message,
          /domain m on h: delivering guest files in place failed \(`systemctl reload-or-restart squid` exited 1: Job failed\. See journalctl\); the previous files are back in place\. .*rotate entry/,
        );
        assert.doesNotMatch(error.message, /via off|\$6\$/, "no file content in the error");
        return true;
      },
    );
    assert.equal(vm.text("/etc/squid/squid.conf"), "http_port 3128\n");
    assert.equal(vm.text("/etc/squid/egress-proxies.htpasswd"), undefined);
    assert.equal(
      vm.ran.filter((command) => command === "systemctl reload-or-restart squid").length,
      2,
    );
  });

  it("nothing listening after the commands (squid died on the new file): put back as well", async () => {
    const vm = guest({ "/etc/squid/squid.conf": "http_port 3128\n" }, { listens: false });
    await assert.rejects(
      deliverGuestFiles(vm.channel, delivery, "VM 101 on node pve", 600),
      /VM 101 on node pve: delivering guest files in place failed \(nothing listens on port 3128 after the commands\)/,
    );
    assert.equal(vm.text("/etc/squid/squid.conf"), "http_port 3128\n");
  });
});
