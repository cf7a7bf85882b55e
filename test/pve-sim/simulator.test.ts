import assert from "node:assert/strict";
import { request } from "node:https";
import { useSimulator } from "./harness";
import { PveSimulator, PVE9_PROXY_PRIVILEGES } from "./simulator";

/**
 * The simulator against docs/proxmox.md, "Proxmox VE behaviours we rely on", fact by fact, at
 * the raw HTTP level (status, reason phrase, body), so the client's view
 * cannot hide a wrong shape.
 */

interface RawReply {
  status: number;
  reason: string;
  text: string;
  json: { data?: unknown; message?: string; errors?: Record<string, string> } | undefined;
}

interface RawOptions {
  form?: Record<string, string | number>;
  token?: string | null;
  body?: Buffer;
  headers?: Record<string, string>;
  chunked?: boolean;
}

function api(
  sim: PveSimulator,
  method: string,
  path: string,
  options: RawOptions = {},
): Promise<RawReply> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { ...(options.headers ?? {}) };
    if (options.token !== null)
      headers.authorization = `PVEAPIToken=${options.token ?? sim.tokenFor()}`;
    let body = options.body;
    if (options.form !== undefined) {
      body = Buffer.from(
        new URLSearchParams(
          Object.entries(options.form).map(([k, v]): [string, string] => [k, String(v)]),
        ).toString(),
      );
      headers["content-type"] = "application/x-www-form-urlencoded";
    }
    if (body !== undefined && !options.chunked) headers["content-length"] = String(body.length);
    const req = request(
      `${sim.endpoint}/api2/json${path}`,
      { method, headers, ca: sim.caCertPem, timeout: 5000 },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString();
          let json;
          try {
            json = text === "" ? undefined : JSON.parse(text);
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, reason: res.statusMessage ?? "", text, json });
        });
      },
    );
    req.on("timeout", () => req.destroy(new Error("request timed out")));
    req.on("error", reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}

async function taskDone(
  sim: PveSimulator,
  upid: string,
): Promise<{ status: string; exitstatus?: string }> {
  for (let i = 0; i < 400; i++) {
    const reply = await api(sim, "GET", `/nodes/pve/tasks/${encodeURIComponent(upid)}/status`);
    const status = reply.json?.data as { status: string; exitstatus?: string };
    if (status.status === "stopped") return status;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`task ${upid} did not stop`);
}

async function clone(
  sim: PveSimulator,
  newid: number,
  extra: Record<string, string | number> = {},
): Promise<string> {
  const reply = await api(sim, "POST", "/nodes/pve/qemu/9000/clone", {
    form: { newid, name: `vm-${newid}`, full: 1, storage: "local-lvm", ...extra },
  });
  assert.equal(reply.status, 200, reply.text);
  return reply.json!.data as string;
}

function multipart(
  parts: Array<{ name: string; fileName?: string; data: string }>,
  boundary = "b0undary",
): Buffer {
  const chunks = parts.map(
    (part) =>
      `--${boundary}\r\nContent-Disposition: form-data; name="${part.name}"${part.fileName === undefined ? "" : `; filename="${part.fileName}"`}\r\n\r\n${part.data}\r\n`,
  );
  return Buffer.from(`${chunks.join("")}--${boundary}--\r\n`);
}

const MULTIPART = { "content-type": "multipart/form-data; boundary=b0undary" };

describe("pve-sim reproduces the Proxmox behaviours of docs/proxmox.md", () => {
  const env = useSimulator({ agentDelayMs: 30, taskMs: { qmclone: 80 } });

  it("F1: errors carry the text as reason phrase and as message ending in a newline; 400s add errors", async () => {
    const reply = await api(env.sim, "POST", "/nodes/pve/qemu/9000/config", {
      form: { tags: "a b" },
    });
    assert.equal(reply.status, 400);
    assert.equal(reply.reason, "Parameter verification failed.");
    assert.equal(reply.json?.message, "Parameter verification failed.\n");
    assert.deepEqual(reply.json?.errors, { tags: "invalid format - invalid characters in tag" });
  });

  it("F2: a missing VM is the same 500 for GET config, GET status/current and DELETE", async () => {
    for (const [method, path] of [
      ["GET", "/nodes/pve/qemu/777/config"],
      ["GET", "/nodes/pve/qemu/777/status/current"],
      ["DELETE", "/nodes/pve/qemu/777"],
    ]) {
      const reply = await api(env.sim, method, path);
      assert.equal(reply.status, 500);
      assert.equal(
        reply.reason,
        "Configuration file 'nodes/pve/qemu-server/777.conf' does not exist",
      );
    }
  });

  it("F3: a start while clone-locked is accepted and runs when the clone is done", async () => {
    await clone(env.sim, 300);
    const start = await api(env.sim, "POST", "/nodes/pve/qemu/300/status/start");
    assert.equal(start.status, 200);
    const status = await taskDone(env.sim, start.json!.data as string);
    assert.equal(status.exitstatus, "OK");
    const task = env.sim.tasks.get(start.json!.data as string)!;
    assert.deepEqual(task.log.slice(0, 2), ["trying to acquire lock...", " OK"]);
    assert.equal(env.sim.vms.get(300)!.status, "running");
  });

  it("F4: a clone onto a taken VMID fails synchronously", async () => {
    const reply = await api(env.sim, "POST", "/nodes/pve/qemu/9000/clone", {
      form: { newid: 9000, full: 1 },
    });
    assert.equal(reply.status, 500);
    assert.equal(reply.reason, "unable to create VM 9000: config file already exists");
  });

  it("F5: agent errors by state, timeouts say qga on PVE 9", async () => {
    await taskDone(env.sim, await clone(env.sim, 301));
    const path = "/nodes/pve/qemu/301/agent/network-get-interfaces";
    assert.equal((await api(env.sim, "GET", path)).reason, "VM 301 is not running");
    await taskDone(
      env.sim,
      (await api(env.sim, "POST", "/nodes/pve/qemu/301/status/start")).json!.data as string,
    );
    env.sim.options.agentNeverUp = true;
    assert.equal((await api(env.sim, "GET", path)).reason, "QEMU guest agent is not running");
    env.sim.options.agentNeverUp = false;
    env.sim.pauseVm(301);
    assert.equal(
      (await api(env.sim, "GET", path)).reason,
      "VM 301 qga command 'guest-network-get-interfaces' failed - got timeout",
    );
    env.sim.vms.get(301)!.paused = false;
    delete env.sim.vms.get(301)!.config.agent;
    const reply = await api(env.sim, "GET", path);
    assert.equal(reply.status, 500);
    assert.equal(reply.reason, "No QEMU guest agent configured");
  });

  it("F7 + F8: mid-clone the entry is nameless and clone-locked, and config writes fail", async () => {
    const upid = await clone(env.sim, 302);
    const resources = (await api(env.sim, "GET", "/cluster/resources?type=vm")).json!.data as Array<
      Record<string, unknown>
    >;
    assert.deepEqual(
      resources.find((entry) => entry.vmid === 302),
      { id: "qemu/302", type: "qemu", vmid: 302, node: "pve", lock: "clone", status: "unknown" },
    );
    const write = await api(env.sim, "POST", "/nodes/pve/qemu/302/config", { form: { cores: 2 } });
    assert.equal(write.status, 500);
    assert.equal(write.reason, "VM is locked (clone)");
    await taskDone(env.sim, upid);
    const after = (await api(env.sim, "GET", "/cluster/resources?type=vm")).json!.data as Array<
      Record<string, unknown>
    >;
    const entry = after.find((item) => item.vmid === 302)!;
    assert.equal(entry.name, "vm-302");
    assert.equal(entry.status, "stopped");
    assert.equal("lock" in entry, false);
    for (const key of [
      "vmid",
      "name",
      "node",
      "status",
      "type",
      "template",
      "tags",
      "maxcpu",
      "maxmem",
      "maxdisk",
      "uptime",
      "id",
    ])
      assert.ok(key in entry, `F8: entry lacks ${key}`);
  });

  it("F9: tags fold to lower case, hyphens pass, spaces and '!' are refused", async () => {
    await taskDone(env.sim, await clone(env.sim, 303));
    const ok = await api(env.sim, "POST", "/nodes/pve/qemu/303/config", {
      form: { tags: "Web-Proxy;egress_1" },
    });
    await taskDone(env.sim, ok.json!.data as string);
    assert.equal(env.sim.vms.get(303)!.config.tags, "egress_1;web-proxy");
    for (const bad of ["a b", "wow!"]) {
      const reply = await api(env.sim, "POST", "/nodes/pve/qemu/303/config", {
        form: { tags: bad },
      });
      assert.equal(reply.status, 400);
      assert.equal(reply.json?.errors?.tags, "invalid format - invalid characters in tag");
    }
  });

  it("F10 + F11: description verbatim with newlines; meta and tags copied from the template", async () => {
    const description = "line one\n[egress-proxies]\nmanaged=true\n";
    await taskDone(
      env.sim,
      await clone(env.sim, 304, { name: "proxy-abcdefghijklmnop", description }),
    );
    const config = (await api(env.sim, "GET", "/nodes/pve/qemu/304/config")).json!.data as Record<
      string,
      string
    >;
    assert.equal(config.description, description);
    assert.equal(config.name, "proxy-abcdefghijklmnop");
    assert.equal(config.meta, env.sim.vms.get(9000)!.config.meta);
    assert.equal(config.tags, "debian;template");
    const underscore = await api(env.sim, "POST", "/nodes/pve/qemu/9000/clone", {
      form: { newid: 305, name: "bad_name" },
    });
    assert.equal(underscore.status, 400);
  });

  it("F12: uploads overwrite silently, need .iso, content before the file, and a Content-Length", async () => {
    const upload = (body: Buffer, extra: Partial<RawOptions> = {}) =>
      api(env.sim, "POST", "/nodes/pve/storage/seeds/upload", {
        body,
        headers: MULTIPART,
        ...extra,
      });
    const first = await upload(
      multipart([
        { name: "content", data: "iso" },
        { name: "filename", fileName: "s.iso", data: "one" },
      ]),
    );
    assert.match(String(first.json?.data), /:imgcopy::automation@pve!egress:$/);
    await taskDone(env.sim, first.json!.data as string);
    const second = await upload(
      multipart([
        { name: "content", data: "iso" },
        { name: "filename", fileName: "s.iso", data: "two" },
      ]),
    );
    assert.equal((await taskDone(env.sim, second.json!.data as string)).exitstatus, "OK");
    assert.equal(env.sim.isoFile("seeds", "s.iso")!.toString(), "two");
    const noExtension = await upload(
      multipart([
        { name: "content", data: "iso" },
        { name: "filename", fileName: "s.img2", data: "x" },
      ]),
    );
    assert.equal(noExtension.status, 400);
    assert.equal(noExtension.json?.errors?.filename, "wrong file extension");
    const wrongOrder = await upload(
      multipart([
        { name: "filename", fileName: "t.iso", data: "x" },
        { name: "content", data: "iso" },
      ]),
    );
    assert.equal(wrongOrder.status, 400);
    assert.match(wrongOrder.json?.errors?.content ?? "", /property is missing/);
    const chunked = await upload(
      multipart([
        { name: "content", data: "iso" },
        { name: "filename", fileName: "u.iso", data: "x" },
      ]),
      { chunked: true },
    );
    assert.equal(chunked.status, 411);
    assert.equal(env.sim.isoFile("seeds", "u.iso"), undefined);
  });

  it("F13: deleting a volume needs Datastore.Allocate, is an imgdel task, and a missing volume still ends OK", async () => {
    const lacking = new PveSimulator({
      tokens: [
        {
          id: "p@pve!t",
          secret: "s3cr3t",
          privileges: PVE9_PROXY_PRIVILEGES.filter((p) => p !== "Datastore.Allocate"),
        },
      ],
    });
    await lacking.listen();
    try {
      const denied = await api(
        lacking,
        "DELETE",
        "/nodes/pve/storage/seeds/content/seeds%3Aiso%2Fx.iso",
        { token: "p@pve!t=s3cr3t" },
      );
      assert.equal(denied.status, 403);
      assert.equal(denied.reason, "Permission check failed (/storage/seeds, Datastore.Allocate)");
    } finally {
      await lacking.close();
    }
    const reply = await api(
      env.sim,
      "DELETE",
      "/nodes/pve/storage/seeds/content/seeds%3Aiso%2Fnever-there.iso",
    );
    assert.match(String(reply.json?.data), /:imgdel:/);
    assert.equal((await taskDone(env.sim, reply.json!.data as string)).exitstatus, "OK");
  });

  it("F14: paused shows only in status/current (qmpstatus), /cluster/resources says running", async () => {
    await taskDone(env.sim, await clone(env.sim, 306));
    await taskDone(
      env.sim,
      (await api(env.sim, "POST", "/nodes/pve/qemu/306/status/start")).json!.data as string,
    );
    const suspend = await api(env.sim, "POST", "/nodes/pve/qemu/306/status/suspend");
    await taskDone(env.sim, suspend.json!.data as string);
    const current = (await api(env.sim, "GET", "/nodes/pve/qemu/306/status/current")).json!
      .data as Record<string, unknown>;
    assert.equal(current.status, "running");
    assert.equal(current.qmpstatus, "paused");
    const resources = (await api(env.sim, "GET", "/cluster/resources?type=vm")).json!.data as Array<
      Record<string, unknown>
    >;
    assert.equal(resources.find((entry) => entry.vmid === 306)!.status, "running");
    await taskDone(
      env.sim,
      (await api(env.sim, "POST", "/nodes/pve/qemu/306/status/stop")).json!.data as string,
    );
    const stopped = (await api(env.sim, "GET", "/nodes/pve/qemu/306/status/current")).json!
      .data as Record<string, unknown>;
    assert.deepEqual([stopped.status, stopped.qmpstatus], ["stopped", "stopped"]);
    const again = await api(env.sim, "POST", "/nodes/pve/qemu/306/status/stop");
    assert.equal((await taskDone(env.sim, again.json!.data as string)).exitstatus, "OK");
  });

  it("F25: the node's VM index names every VM (VM <vmid> mid-clone), shows lock and tags when set, and qmpstatus only with full=1", async () => {
    const upid = await clone(env.sim, 307);
    const index = async (query = "?full=1") =>
      new Map(
        (
          (await api(env.sim, "GET", `/nodes/pve/qemu${query}`)).json!.data as Array<
            Record<string, unknown>
          >
        ).map((entry) => [entry.vmid, entry]),
      );
    const midClone = (await index()).get(307)!;
    assert.deepEqual(
      [midClone.name, midClone.status, midClone.lock, midClone.qmpstatus],
      ["VM 307", "stopped", "clone", "stopped"],
    );
    await taskDone(env.sim, upid);
    await taskDone(
      env.sim,
      (await api(env.sim, "POST", "/nodes/pve/qemu/307/status/start")).json!.data as string,
    );
    await taskDone(
      env.sim,
      (await api(env.sim, "POST", "/nodes/pve/qemu/307/status/suspend")).json!.data as string,
    );
    const full = await index();
    const paused = full.get(307)!;
    assert.deepEqual(
      [paused.name, paused.status, paused.qmpstatus, "lock" in paused],
      ["vm-307", "running", "paused", false],
    );
    for (const key of ["cpus", "maxmem", "maxdisk", "uptime", "cpu", "mem", "netin", "netout"])
      assert.equal(typeof paused[key], "number", `F25: entry lacks ${key}`);
    const template = full.get(9000)!;
    assert.deepEqual(
      [template.status, template.qmpstatus, template.template, template.tags],
      ["stopped", "stopped", 1, "debian;template"],
    );
    const brief = await index("");
    assert.equal(brief.get(307)!.status, "running");
    assert.equal("qmpstatus" in brief.get(307)!, false, "qmpstatus only when QMP is asked");
    const current = (await api(env.sim, "GET", "/nodes/pve/qemu/307/status/current")).json!
      .data as Record<string, unknown>;
    assert.deepEqual([current.status, current.qmpstatus], [paused.status, paused.qmpstatus]);
    const otherNode = await api(env.sim, "GET", "/nodes/pve9/qemu?full=1");
    assert.equal(otherNode.status, 500);
    assert.match(otherNode.reason, /^hostname lookup 'pve9' failed/);
  });

  it("F25: the VM index leaves out, without an error, the VMs the token may not audit", async () => {
    const sim = new PveSimulator({
      tokens: [
        {
          id: "p@pve!t",
          secret: "s3cr3t",
          privileges: PVE9_PROXY_PRIVILEGES,
          pathPrivileges: { "/vms/9000": ["VM.Clone"] },
        },
      ],
    });
    await sim.listen();
    try {
      sim.addForeignVm(500, "visible");
      const reply = await api(sim, "GET", "/nodes/pve/qemu?full=1", { token: "p@pve!t=s3cr3t" });
      assert.equal(reply.status, 200, reply.text);
      const vmids = (reply.json!.data as Array<{ vmid: number }>).map((entry) => entry.vmid);
      assert.deepEqual(vmids, [500]);
      const current = await api(sim, "GET", "/nodes/pve/qemu/9000/status/current", {
        token: "p@pve!t=s3cr3t",
      });
      assert.deepEqual(
        [current.status, current.reason],
        [403, "Permission check failed (/vms/9000, VM.Audit)"],
      );
    } finally {
      await sim.close();
    }
  });

  it("F24: shutdown powers a running VM off cleanly; refused on a paused one; a hung guest times out unless forceStop", async () => {
    const post = async (path: string, form?: Record<string, string | number>) =>
      api(env.sim, "POST", `/nodes/pve/qemu/320/status/${path}`, form ? { form } : {});
    const run = async (path: string, form?: Record<string, string | number>) => {
      const reply = await post(path, form);
      assert.equal(reply.status, 200, reply.text);
      return taskDone(env.sim, reply.json!.data as string);
    };
    const status = () => env.sim.vms.get(320)!.status;
    await taskDone(env.sim, await clone(env.sim, 320));
    // Stopped already: the task just finishes OK, as a stop does.
    assert.equal((await run("shutdown", { timeout: 1 })).exitstatus, "OK");
    await run("start");
    const clean = await post("shutdown", { timeout: 1 });
    assert.match(String(clean.json?.data), /:qmshutdown:320:/);
    assert.equal((await taskDone(env.sim, clean.json!.data as string)).exitstatus, "OK");
    assert.equal(status(), "stopped");

    await run("start");
    await run("suspend");
    const paused = await post("shutdown", { timeout: 1 });
    assert.deepEqual([paused.status, paused.json?.data], [500, null]);
    assert.match(paused.reason, /VM is paused - cannot shutdown/);
    assert.equal(status(), "running");
    await run("stop");

    await run("start");
    env.sim.hangGuest(320);
    assert.equal(
      (await run("shutdown", { timeout: 1 })).exitstatus,
      "VM quit/powerdown failed - got timeout",
    );
    assert.equal(status(), "running");
    assert.equal((await run("shutdown", { timeout: 1, forceStop: 1 })).exitstatus, "OK");
    assert.equal(status(), "stopped");
  });

  it("F15: a clone onto a storage without image support is refused up front, no VM left", async () => {
    const reply = await api(env.sim, "POST", "/nodes/pve/qemu/9000/clone", {
      form: { newid: 307, full: 1, storage: "local" },
    });
    assert.equal(reply.status, 400);
    assert.equal(reply.json?.errors?.storage, "storage 'local' does not support vm images");
    assert.equal(env.sim.vms.has(307), false);
  });

  it("F16: task status fields and a [{n,t}] log with a default limit of 50", async () => {
    const upid = await clone(env.sim, 308);
    const status = (await taskDone(env.sim, upid)) as unknown as Record<string, unknown>;
    for (const key of [
      "status",
      "exitstatus",
      "type",
      "id",
      "node",
      "user",
      "tokenid",
      "upid",
      "starttime",
      "pid",
      "pstart",
    ])
      assert.ok(key in status, `task status lacks ${key}`);
    assert.deepEqual(
      [status.user, status.tokenid, status.type, status.id],
      ["automation@pve", "egress", "qmclone", "9000"],
    );
    const task = env.sim.tasks.get(upid)!;
    for (let i = 0; i < 60; i++) task.log.push(`line ${i}`);
    const log = (await api(env.sim, "GET", `/nodes/pve/tasks/${encodeURIComponent(upid)}/log`))
      .json!.data as Array<{ n: number; t: string }>;
    assert.equal(log.length, 50);
    assert.deepEqual(log[0], { n: 1, t: task.log[0] });
  });

  it("F19: attaching ide2 appends it to the boot order", async () => {
    await taskDone(env.sim, await clone(env.sim, 309));
    env.sim.storages.get("seeds")!.files.set("seeds:iso/x.iso", Buffer.from("iso"));
    const write = await api(env.sim, "POST", "/nodes/pve/qemu/309/config", {
      form: { ide2: "seeds:iso/x.iso,media=cdrom" },
    });
    await taskDone(env.sim, write.json!.data as string);
    assert.equal(env.sim.vms.get(309)!.config.boot, "order=scsi0;ide2");
  });

  it("F20: resize is a task; same size is OK; shrinking fails inside the task", async () => {
    await taskDone(env.sim, await clone(env.sim, 310));
    const resize = (size: string) =>
      api(env.sim, "PUT", "/nodes/pve/qemu/310/resize", { form: { disk: "scsi0", size } });
    assert.equal(
      (await taskDone(env.sim, (await resize("3G")).json!.data as string)).exitstatus,
      "OK",
    );
    assert.equal(
      (await taskDone(env.sim, (await resize("2G")).json!.data as string)).exitstatus,
      "shrinking disks is not supported",
    );
    assert.equal(
      (await taskDone(env.sim, (await resize("+1G")).json!.data as string)).exitstatus,
      "OK",
    );
    assert.match(env.sim.vms.get(310)!.config.scsi0, /size=4G/);
  });

  it("F21: the agent reply shape, with the MAC of net0", async () => {
    await taskDone(env.sim, await clone(env.sim, 311));
    await taskDone(
      env.sim,
      (await api(env.sim, "POST", "/nodes/pve/qemu/311/status/start")).json!.data as string,
    );
    await new Promise((resolve) => setTimeout(resolve, 40));
    const reply = await api(env.sim, "GET", "/nodes/pve/qemu/311/agent/network-get-interfaces");
    const result = (reply.json!.data as { result: Array<Record<string, unknown>> }).result;
    assert.deepEqual(
      result.map((nic) => nic.name),
      ["lo", "ens18"],
    );
    const mac = /=([0-9A-F:]{17})/.exec(env.sim.vms.get(311)!.config.net0)![1].toLowerCase();
    assert.equal(result[1]["hardware-address"], mac);
    assert.deepEqual(Object.keys((result[1]["ip-addresses"] as object[])[0]).sort(), [
      "ip-address",
      "ip-address-type",
      "prefix",
    ]);
  });

  it("F22: a wrong secret or unknown token is 401 Authentication failed!; none is 401 No ticket", async () => {
    const wrong = await api(env.sim, "GET", "/version", { token: "automation@pve!egress=nope" });
    assert.deepEqual([wrong.status, wrong.reason, wrong.text], [401, "Authentication failed!", ""]);
    const unknown = await api(env.sim, "GET", "/version", { token: "ghost@pve!x=nope" });
    assert.equal(unknown.reason, "Authentication failed!");
    const none = await api(env.sim, "GET", "/version", { token: null });
    assert.deepEqual([none.status, none.reason], [401, "No ticket"]);
  });

  it("nextid: 400 'VM N already exists' for a taken VMID, the VMID when free, no reservation", async () => {
    const taken = await api(env.sim, "GET", "/cluster/nextid?vmid=9000");
    assert.deepEqual([taken.status, taken.reason], [400, "VM 9000 already exists"]);
    const free = await api(env.sim, "GET", "/cluster/nextid?vmid=4000");
    assert.equal(free.json?.data, "4000");
    assert.equal((await api(env.sim, "GET", "/cluster/nextid?vmid=4000")).json?.data, "4000");
  });

  it("DELETE of a running VM fails; tokens cannot use skiplock", async () => {
    await taskDone(env.sim, await clone(env.sim, 312));
    await taskDone(
      env.sim,
      (await api(env.sim, "POST", "/nodes/pve/qemu/312/status/start")).json!.data as string,
    );
    const reply = await api(env.sim, "DELETE", "/nodes/pve/qemu/312?purge=1");
    assert.deepEqual([reply.status, reply.reason], [500, "VM 312 is running - destroy failed"]);
    const skiplock = await api(env.sim, "POST", "/nodes/pve/qemu/312/config", {
      form: { cores: 2, skiplock: 1 },
    });
    assert.equal(skiplock.status, 403);
  });

  it("storage lock: parallel clones queue, and one that waits too long fails with got timeout", async () => {
    env.sim.options.storageLockHoldMs = 100;
    env.sim.options.storageLockTimeoutMs = 150;
    const upids = await Promise.all([320, 321, 322, 323].map((vmid) => clone(env.sim, vmid)));
    const statuses = await Promise.all(upids.map((upid) => taskDone(env.sim, upid)));
    const timeouts = statuses.filter(
      (s) =>
        s.exitstatus ===
        "can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout",
    );
    assert.ok(timeouts.length >= 1);
    assert.ok(statuses.some((s) => s.exitstatus === "OK"));
    // A failed clone leaves no VM behind.
    assert.equal(
      [320, 321, 322, 323].filter((vmid) => env.sim.vms.has(vmid)).length,
      statuses.length - timeouts.length,
    );
  });

  it("per-VM flock: a task waiting longer than the flock timeout fails with got timeout", async () => {
    await taskDone(env.sim, await clone(env.sim, 330));
    env.sim.options.flockTimeoutMs = 50;
    env.sim.options.taskMs = { qmconfig: 150 };
    const first = await api(env.sim, "POST", "/nodes/pve/qemu/330/config", { form: { cores: 2 } });
    const second = await api(env.sim, "POST", "/nodes/pve/qemu/330/config", { form: { cores: 3 } });
    assert.equal((await taskDone(env.sim, first.json!.data as string)).exitstatus, "OK");
    assert.equal(
      (await taskDone(env.sim, second.json!.data as string)).exitstatus,
      "can't lock file '/var/lock/qemu-server/lock-330.conf' - got timeout",
    );
  });

  it("a token lacking a privilege gets 403 naming the path and privilege (F17)", async () => {
    const sim = new PveSimulator({
      tokens: [
        {
          id: "p@pve!t",
          secret: "s3cr3t",
          privileges: PVE9_PROXY_PRIVILEGES.filter((p) => p !== "VM.Clone"),
        },
      ],
    });
    await sim.listen();
    try {
      const reply = await api(sim, "POST", "/nodes/pve/qemu/9000/clone", {
        form: { newid: 400 },
        token: "p@pve!t=s3cr3t",
      });
      assert.deepEqual(
        [reply.status, reply.reason],
        [403, "Permission check failed (/vms/9000, VM.Clone)"],
      );
    } finally {
      await sim.close();
    }
  });
});

describe("pve-sim fault knobs", () => {
  const env = useSimulator({ serverErrorRate: 1 });

  it("answers pveproxy-style 5xx before doing anything when the 5xx rate is 1", async () => {
    const reply = await api(env.sim, "POST", "/nodes/pve/qemu/9000/clone", {
      form: { newid: 500 },
    });
    assert.ok(reply.status >= 500, `got ${reply.status}`);
    assert.equal(env.sim.vms.has(500), false);
  });
});
