// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import assert from "node:assert/strict";
import { createServer, Server } from "node:net";
import { isPermanent, PermanentError } from "../../provider/common/errors";
import { createMark, markFromText } from "../../provider/common/mark";
import { PartialCreateError } from "../../provider/common/partial-create";
import { preferredVmid } from "../../provider/proxmox/vmid";
import { vmDescription } from "../../provider/proxmox/vm-config";
import * as provider from "../../provider/proxmox/provider";
import { asIfNewProviderProcess, useSimulator } from "./harness";
import { checked, OWNER, userInputs, vmsNamed } from "./fixtures";
import { PveSimulator } from "./simulator";

const RANGE = { first: 20000, last: 29999 };

async function createdProxy(sim: PveSimulator, overrides: Record<string, unknown> = {}) {
  const inputs = await checked(userInputs(sim, overrides));
  const result = await provider.create(inputs);
  return { inputs, ...result };
}

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a rejection, but the promise resolved");
}

describe("ProxmoxProxy lifecycle against the simulator", () => {
  describe("create", () => {
    const env = useSimulator({ agentDelayMs: 30 });

    it("creates a fresh proxy: clone, seed, one config write, start, address from the NIC whose MAC is net0", async () => {
      const { id, outs, inputs } = await createdProxy(env.sim, {
        tags: ["Web", "b"],
        cores: 2,
        memoryMiB: 2048,
      });
      const vmid = outs.vmid;
      assert.equal(vmid, preferredVmid(String(inputs.vmName), RANGE));
      assert.equal(id, `nodes/pve/qemu/${vmid}`);
      const vm = env.sim.vms.get(vmid)!;
      assert.equal(vm.config.name, inputs.vmName);
      assert.equal(vm.status, "running");
      assert.equal(vm.config.cores, "2");
      assert.equal(vm.config.memory, "2048");
      assert.equal(vm.config.ide2, `seeds:iso/${inputs.vmName}-seed.iso,media=cdrom`);
      assert.equal(vm.config.boot, "order=scsi0;ide2"); // F19
      assert.equal(vm.config.tags, "b;egress-proxies;web"); // F9 folded, our tag added
      const mark = markFromText(vm.config.description);
      assert.equal(mark.kind, "marked");
      assert.equal(mark.kind === "marked" && mark.mark.createdAt, outs.createdAt); // F11: our own time
      assert.equal(outs.mac, /=([0-9A-F:]{17})/.exec(vm.config.net0)![1].toLowerCase());
      assert.match(outs.ip ?? "", /^192\.168\./);
      assert.equal(outs.endpoint, `http://${outs.ip}:3128`);
      assert.equal(outs.state, "running");
      assert.equal(outs.seedSha256.length, 64);
      assert.ok(env.sim.isoFile("seeds", `${inputs.vmName}-seed.iso`));
      // One config write, no resize task (diskGiB unset), no stray tasks.
      const types = [...env.sim.tasks.values()].map((task) => task.type);
      assert.deepEqual(types, ["qmclone", "imgcopy", "qmconfig", "qmstart"]);
    });

    it("accepts a config write answered with null instead of a UPID", async () => {
      env.sim.options.configWritesAnswerNull = true;
      const { outs } = await createdProxy(env.sim, { cores: 3 });
      assert.equal(env.sim.vms.get(outs.vmid)!.config.cores, "3");
      assert.equal(
        [...env.sim.tasks.values()].some((task) => task.type === "qmconfig"),
        false,
      );
    });

    it("keeps the clone's MAC when a bridge and VLAN tag rewrite net0 (rule 12)", async () => {
      const { outs } = await createdProxy(env.sim, { bridge: "vmbr1", vlanTag: 20 });
      const net0 = env.sim.vms.get(outs.vmid)!.config.net0;
      assert.match(net0, /^virtio=BC:24:11:[0-9A-F:]{8},bridge=vmbr1,firewall=1,tag=20$/);
      assert.equal(outs.mac, net0.slice("virtio=".length, "virtio=".length + 17).toLowerCase());
    });

    it("resizes the boot disk to an absolute size, and skips the task when it is equal (F20)", async () => {
      const bigger = await createdProxy(env.sim, { diskGiB: 8 });
      assert.match(env.sim.vms.get(bigger.outs.vmid)!.config.scsi0, /size=8G/);
      const before = env.sim.tasks.size;
      const equal = await createdProxy(env.sim, { diskGiB: 3, vmName: "proxy-equal-disk" });
      assert.match(env.sim.vms.get(equal.outs.vmid)!.config.scsi0, /size=3G/);
      const resizes = [...env.sim.tasks.values()]
        .slice(before)
        .filter((task) => task.type === "resize");
      assert.equal(resizes.length, 0);
    });

    it("refuses a disk smaller than the template's, naming diskGiB, and records the VM", async () => {
      const error = await rejection(createdProxy(env.sim, { diskGiB: 2 }));
      assert.ok(error instanceof PartialCreateError);
      assert.match(
        error.message,
        /diskGiB 2 is smaller than the template's scsi0 \(3\.0 GiB\); set diskGiB to at least 3/,
      );
    });

    it("F15: a disk storage without image support is refused up front and leaves no VM", async () => {
      const error = await rejection(createdProxy(env.sim, { diskStorage: "local" }));
      assert.ok(isPermanent(error));
      assert.match(error.message, /storage 'local' does not support vm images/);
      assert.equal(env.sim.vms.size, 1); // only the template
    });

    it("takes the address from the NIC whose MAC matches net0, not docker0 reported first", async () => {
      env.sim.options.agentReportsDockerFirst = true;
      const { outs } = await createdProxy(env.sim);
      assert.match(outs.ip ?? "", /^192\.168\./);
    });

    it("waits for the proxy port when readiness.mode is port", async () => {
      env.sim.options.guestAddress = () => "127.0.0.1";
      const server = await listeningServer();
      try {
        const port = (server.address() as { port: number }).port;
        const { outs } = await createdProxy(env.sim, { readiness: { mode: "port", port } });
        assert.equal(outs.endpoint, `http://127.0.0.1:${port}`);
      } finally {
        server.close();
      }
    });

    it("skips another owner's VM at the preferred VMID and clones into the next one", async () => {
      const inputs = await checked(userInputs(env.sim, { vmName: "proxy-next" }));
      const preferred = preferredVmid("proxy-next", RANGE);
      env.sim.addForeignVm(preferred, "someone-elses-vm");
      const { outs } = await provider.create(inputs);
      assert.equal(outs.vmid, preferred === RANGE.last ? RANGE.first : preferred + 1);
      assert.equal(env.sim.vms.get(preferred)!.config.name, "someone-elses-vm");
    });

    it("refuses a VM with our name but no mark, saying it was not made by this package", async () => {
      const inputs = await checked(userInputs(env.sim, { vmName: "proxy-taken" }));
      env.sim.addForeignVm(preferredVmid("proxy-taken", RANGE), "proxy-taken");
      const error = await rejection(provider.create(inputs));
      assert.ok(isPermanent(error));
      assert.match(error.message, /no egress-proxies mark/);
      assert.match(error.message, /choose another vmName/);
    });

    it("refuses a VM with our name carrying another stack's mark, naming that owner", async () => {
      const inputs = await checked(userInputs(env.sim, { vmName: "proxy-theirs" }));
      const theirs = createMark({ project: "other", stack: "prod", resource: "edge" });
      env.sim.addForeignVm(
        preferredVmid("proxy-theirs", RANGE),
        "proxy-theirs",
        vmDescription("proxy-theirs", theirs),
      );
      const error = await rejection(provider.create(inputs));
      assert.ok(isPermanent(error));
      assert.match(error.message, /belongs to other\/prod \(resource edge\), not to egress\/test/);
    });

    it("adopts its own VM when a concurrent attempt hits F4 on the same VMID", async () => {
      env.sim.options.taskMs = { qmclone: 150 };
      const inputs = await checked(userInputs(env.sim, { vmName: "proxy-twice" }));
      const [first, second] = await Promise.all([provider.create(inputs), provider.create(inputs)]);
      assert.equal(first.id, second.id);
      assert.deepEqual(vmsNamed(env.sim, "proxy-twice"), [first.outs.vmid]);
      const clones = [...env.sim.tasks.values()].filter((task) => task.type === "qmclone");
      assert.equal(clones.length, 1, "the second attempt must adopt, not clone again");
      const clonePosts = env.sim.requestLog.filter(
        (line) => line === "POST /api2/json/nodes/pve/qemu/9000/clone",
      );
      assert.equal(clonePosts.length, 2, "both attempts must have tried the clone, so one met F4");
    });

    it("survives a flaky API (5xx from the proxy) by retrying, with one VM in the end", async () => {
      env.sim.options.serverErrorRate = 0.15;
      const { inputs, outs } = await createdProxy(env.sim, { vmName: "proxy-flaky" });
      env.sim.options.serverErrorRate = 0;
      assert.deepEqual(vmsNamed(env.sim, String(inputs.vmName)), [outs.vmid]);
      assert.equal(env.sim.vms.get(outs.vmid)!.status, "running");
    });
  });

  describe("create resumed after a crash", () => {
    const env = useSimulator({ agentDelayMs: 30 });

    it("mid-clone: waits for the nameless, clone-locked entry (rule 1) and adopts it (rule 2)", async () => {
      env.sim.options.taskMs = { qmclone: 300 };
      const inputs = await checked(userInputs(env.sim, { vmName: "proxy-midclone" }));
      const vmid = preferredVmid("proxy-midclone", RANGE);
      // What the crashed attempt had done: the clone POST, nothing after it.
      const client = (await import("./harness")).clientFor(env.sim);
      await client.post(`/nodes/pve/qemu/9000/clone`, {
        newid: vmid,
        name: "proxy-midclone",
        full: 1,
        storage: "local-lvm",
        description: vmDescription("proxy-midclone", createMark(OWNER)),
      });
      const entry = (
        await client.get<Array<Record<string, unknown>>>("/cluster/resources", { type: "vm" })
      ).find((item) => item.vmid === vmid);
      assert.deepEqual(entry, {
        id: `qemu/${vmid}`,
        type: "qemu",
        vmid,
        node: "pve",
        lock: "clone",
        status: "unknown",
      });
      const { outs } = await provider.create(inputs);
      assert.equal(outs.vmid, vmid);
      assert.deepEqual(vmsNamed(env.sim, "proxy-midclone"), [vmid]);
      assert.equal([...env.sim.tasks.values()].filter((task) => task.type === "qmclone").length, 1);
    });

    for (const step of ["imgcopy", "qmconfig", "resize", "qmstart"] as const) {
      it(`a crash at ${step}: the next create converges to one running VM with its seed`, async () => {
        let failuresLeft = 1;
        env.sim.options.failTask = (type) =>
          type === step && failuresLeft-- > 0
            ? "connection to the caller lost (simulated crash)"
            : undefined;
        const inputs = await checked(
          userInputs(env.sim, { vmName: `proxy-crash-${step}`, diskGiB: 5 }),
        );
        const error = await rejection(provider.create(inputs));
        assert.ok(
          error instanceof PartialCreateError,
          `expected a partial-create error, got ${error}`,
        );
        assert.match(error.id, /^nodes\/pve\/qemu\/\d+$/);
        const { outs } = await provider.create(inputs);
        assert.equal(`nodes/pve/qemu/${outs.vmid}`, error.id);
        assert.deepEqual(vmsNamed(env.sim, `proxy-crash-${step}`), [outs.vmid]);
        const vm = env.sim.vms.get(outs.vmid)!;
        assert.equal(vm.status, "running");
        assert.match(vm.config.scsi0, /size=5G/);
        assert.ok(env.sim.isoFile("seeds", `proxy-crash-${step}-seed.iso`));
      });
    }

    it("after the guest agent never answered: the VM is recorded (partial create) with the timeout setting named", async () => {
      env.sim.options.agentNeverUp = true;
      const inputs = await checked(
        userInputs(env.sim, {
          vmName: "proxy-silent",
          timeouts: { createSeconds: 30, readySeconds: 1, deleteSeconds: 30 },
        }),
      );
      const error = await rejection(provider.create(inputs));
      assert.ok(error instanceof PartialCreateError);
      assert.match(error.message, /timeouts\.readySeconds/);
      assert.equal((error.properties as { state: string }).state, "running");
      env.sim.options.agentNeverUp = false;
      const { outs } = await provider.create(inputs);
      assert.equal(`nodes/pve/qemu/${outs.vmid}`, error.id);
    });
  });

  describe("read", () => {
    const env = useSimulator({ agentDelayMs: 30 });

    it("reports a paused VM as paused (F14), keeping its address", async () => {
      const { id, outs } = await createdProxy(env.sim);
      env.sim.pauseVm(outs.vmid);
      const read = await provider.read(id, { ...outs });
      assert.equal(read.id, id);
      assert.equal(read.props.state, "paused");
      assert.equal(read.props.ip, outs.ip);
    });

    it("keeps a VM deleted out of band while its seed is left (marked for replacement), drops it once nothing is", async () => {
      const { id, outs } = await createdProxy(env.sim);
      env.sim.removeVmOutOfBand(outs.vmid);
      const kept = await provider.read(id, { ...outs });
      assert.equal(kept.id, id);
      assert.match(String(kept.props.replaceBecause), /VM \d+ gone .*seed .* left behind/);
      assert.equal(kept.inputs?.replaceBecause, kept.props.replaceBecause);
      env.sim.storages.get("seeds")!.files.delete(String(outs.seedVolume));
      asIfNewProviderProcess();
      const read = await provider.read(id, { ...outs });
      assert.equal(read.id, undefined);
    });

    it("does not block on a silent agent: one short attempt, the known address kept", async () => {
      const { id, outs } = await createdProxy(env.sim);
      env.sim.options.agentNeverUp = true;
      const started = Date.now();
      const read = await provider.read(id, { ...outs });
      assert.ok(Date.now() - started < 2000);
      assert.equal(read.props.ip, outs.ip);
      assert.equal(read.props.state, "running");
    });

    it("rides out a flaky API during refresh", async () => {
      const { id, outs } = await createdProxy(env.sim);
      env.sim.options.serverErrorRate = 0.3;
      try {
        for (let i = 0; i < 5; i++)
          assert.equal((await provider.read(id, { ...outs })).props.state, "running");
      } finally {
        env.sim.options.serverErrorRate = 0;
      }
    });

    it("treats a locked VM as in progress, not gone (rule 1)", async () => {
      const { id, outs } = await createdProxy(env.sim);
      env.sim.vms.get(outs.vmid)!.config.lock = "backup";
      const read = await provider.read(id, { ...outs });
      assert.equal(read.id, id);
      assert.equal(read.props.state, "locked (backup)");
    });

    it("refuses a VM whose mark was replaced by another owner's", async () => {
      const { id, outs, inputs } = await createdProxy(env.sim);
      const theirs = createMark({ project: "other", stack: "prod", resource: "x" });
      env.sim.vms.get(outs.vmid)!.config.description = vmDescription(String(inputs.vmName), theirs);
      const error = await rejection(provider.read(id, { ...outs }));
      assert.ok(error instanceof PermanentError);
      assert.match(error.message, /belongs to other\/prod/);
    });
  });

  describe("update", () => {
    const env = useSimulator({ agentDelayMs: 30 });

    it("rewrites only the tags, in place, and carries the outputs", async () => {
      const { id, outs, inputs } = await createdProxy(env.sim, { tags: ["a"] });
      const news = await checked(userInputs(env.sim, { tags: ["Z", "a"], vmName: inputs.vmName }), {
        ...outs,
      });
      const tasksBefore = env.sim.tasks.size;
      const { outs: updated } = await provider.update(id, { ...outs }, news);
      assert.equal(env.sim.vms.get(outs.vmid)!.config.tags, "a;egress-proxies;z");
      assert.equal(updated.ip, outs.ip);
      assert.equal(updated.vmid, outs.vmid);
      assert.deepEqual(
        [...env.sim.tasks.values()].slice(tasksBefore).map((task) => task.type),
        ["qmconfig"],
      );
    });
  });

  describe("delete", () => {
    const env = useSimulator({ agentDelayMs: 30 });

    it("stops a running VM first, destroys it, then removes the seed (imgdel task)", async () => {
      const { id, outs, inputs } = await createdProxy(env.sim);
      await provider.remove(id, { ...outs });
      assert.equal(env.sim.vms.has(outs.vmid), false);
      assert.equal(env.sim.isoFile("seeds", `${inputs.vmName}-seed.iso`), undefined);
      const types = [...env.sim.tasks.values()].map((task) => task.type).slice(-3);
      assert.deepEqual(types, ["qmstop", "qmdestroy", "imgdel"]);
      assert.equal(
        [...env.sim.storages.get("local-lvm")!.files.keys()].some((v) =>
          v.includes(`vm-${outs.vmid}-`),
        ),
        false,
      );
    });

    it("is idempotent: a second delete succeeds and still asks for the seed's removal", async () => {
      const { id, outs } = await createdProxy(env.sim);
      await provider.remove(id, { ...outs });
      // The second through deleteProxy, what state stored by earlier versions calls (the same function).
      await provider.deleteProxy(id, { ...outs });
      assert.equal([...env.sim.tasks.values()].at(-1)!.type, "imgdel");
    });

    it("refuses to delete a VM with our name that lost our mark", async () => {
      const { id, outs } = await createdProxy(env.sim);
      env.sim.vms.get(outs.vmid)!.config.description = "taken over by hand";
      const error = await rejection(provider.remove(id, { ...outs }));
      assert.ok(isPermanent(error));
      assert.equal(env.sim.vms.has(outs.vmid), true);
    });

    it("leaves alone a VM by another name that reused our VMID, and removes our seed", async () => {
      const { id, outs, inputs } = await createdProxy(env.sim);
      env.sim.removeVmOutOfBand(outs.vmid);
      env.sim.addForeignVm(outs.vmid, "new-tenant");
      await provider.remove(id, { ...outs });
      assert.equal(env.sim.vms.get(outs.vmid)!.config.name, "new-tenant");
      assert.equal(env.sim.isoFile("seeds", `${inputs.vmName}-seed.iso`), undefined);
    });
  });
});

function listeningServer(): Promise<Server> {
  return new Promise((resolve) => {
    const server = createServer((socket) => socket.end());
    server.listen(0, "127.0.0.1", () => resolve(server));
  });
}

describe("ProxmoxProxy create: a clone that outlives the create timeout", function () {
  // The shortest create timeout the schema allows is 10 s; the clone takes longer.
  this.timeout(120_000);
  const env = useSimulator({ taskMs: { qmclone: 10_500 } });

  it("records the VM as partially created instead of forgetting it", async () => {
    const inputs = await checked(
      userInputs(env.sim, {
        vmName: "proxy-slowclone",
        timeouts: { createSeconds: 10, readySeconds: 10, deleteSeconds: 30 },
      }),
    );
    const error = await rejection(provider.create(inputs));
    assert.ok(error instanceof PartialCreateError, `got ${error}`);
    assert.match(error.message, /timeouts\.createSeconds/);
    assert.equal(error.id, `nodes/pve/qemu/${preferredVmid("proxy-slowclone", RANGE)}`);
  });
});

describe("ProxmoxProxy create: readiness port never opens", () => {
  const env = useSimulator({ agentDelayMs: 10, guestAddress: () => "127.0.0.1" });

  it("records the VM with its address, and names timeouts.readySeconds", async () => {
    const closedPort = await new Promise<number>((resolve) => {
      const server = createServer();
      server.listen(0, "127.0.0.1", () => {
        const port = (server.address() as { port: number }).port;
        server.close(() => resolve(port));
      });
    });
    const inputs = await checked(
      userInputs(env.sim, {
        readiness: { mode: "port", port: closedPort },
        timeouts: { createSeconds: 30, readySeconds: 1, deleteSeconds: 30 },
      }),
    );
    const error = await rejection(provider.create(inputs));
    assert.ok(error instanceof PartialCreateError, `got ${error}`);
    assert.equal((error.properties as { ip: string }).ip, "127.0.0.1");
    assert.match(
      error.message,
      /port \d+ on 127\.0\.0\.1 accepting connections did not finish within 1 s; raise timeouts\.readySeconds/,
    );
  });
});
