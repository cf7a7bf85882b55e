import { createHash, randomBytes } from "node:crypto";
import { createServer, Server } from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { parseMultipart } from "./multipart";
import { simulatorTls } from "./ca";

/**
 * A Proxmox VE API simulator that reproduces docs/proxmox.md, "Proxmox VE behaviours we rely on"
 * (the F-numbers in comments point there). Real where the protocol is real:
 * HTTPS with a private CA, token auth, multipart uploads with Content-Length,
 * asynchronous tasks with real-format UPIDs, config locks, per-VM flocks and a
 * storage lock that parallel clones contend for. One node, in memory.
 */

export type TaskType =
  | "qmclone"
  | "imgcopy"
  | "qmconfig"
  | "resize"
  | "qmstart"
  | "qmstop"
  | "qmshutdown"
  | "qmsuspend"
  | "qmresume"
  | "qmdestroy"
  | "imgdel";

export interface TokenSpec {
  /** `user@realm!tokenid` */
  id: string;
  secret: string;
  /** Privileges granted on every path ("all" for Administrator). */
  privileges: string[] | "all";
  /**
   * ACLs on more specific paths; the longest matching path wins and replaces
   * what would be inherited (F17).
   */
  pathPrivileges?: Record<string, string[]>;
}

export interface SimulatorOptions {
  node?: string;
  /** 9 (default): agent needs VM.GuestAgent.Audit, timeouts say "qga"; 8: VM.Monitor, "qmp" (F5, F17). */
  pveMajor?: 8 | 9;
  tokens?: TokenSpec[];
  /** Task running times in ms; unspecified types take `defaultTaskMs`. */
  taskMs?: Partial<Record<TaskType, number>>;
  defaultTaskMs?: number;
  /** Added before every response (fault knob). */
  latencyMs?: number;
  /** Fraction of requests answered with a pveproxy-style 5xx before doing anything (fault knob). */
  serverErrorRate?: number;
  /** Returns an exitstatus to make a task fail (fault knob). */
  failTask?: (type: TaskType, id: string) => string | undefined;
  /** Agent answers this long after start; `never` keeps it silent (fault knob). */
  agentDelayMs?: number;
  agentNeverUp?: boolean;
  /** The address the guest reports on its NIC; loopback keeps readiness probes local. */
  guestAddress?: (vmid: number) => string;
  /**
   * For a guest whose seed asks for IPv6: the global IPv6 address it reports
   * instead of the one the seed makes (null: none, an address lost).
   */
  guestIpv6?: (vmid: number) => string | null;
  /** A docker0-like interface reported before the real NIC (MAC matching must skip it). */
  agentReportsDockerFirst?: boolean;
  /**
   * The TCP ports the guest listens on, as its /proc/net/tcp and tcp6 say
   * through `agent/file-read` (default: sshd's 22 only; the simulator's
   * guests run no proxy of their own).
   */
  guestListens?: (vmid: number) => number[];
  /** Each clone holds the disk storage's lock this long while allocating its volume. */
  storageLockHoldMs?: number;
  /** A clone waiting longer than this for the storage lock fails with "got timeout". */
  storageLockTimeoutMs?: number;
  /** Waiting for a per-VM flock longer than this fails with "got timeout". */
  flockTimeoutMs?: number;
  /** Real milliseconds per second of a shutdown's `timeout` (a hung guest's shutdown waits that long). */
  shutdownSecondMs?: number;
  /** Config writes apply at once and answer `null` instead of a UPID (the flow allows both). */
  configWritesAnswerNull?: boolean;
  /** Random seed bytes for MACs are drawn from crypto; pid counters start here. */
  firstPid?: number;
}

export interface SimStorage {
  id: string;
  type: "lvmthin" | "dir";
  content: Set<string>;
  /** volid → bytes (ISO files) or size (disks). */
  files: Map<string, Buffer>;
  /** volid → when the file was written (seconds since the epoch): the content listing's `ctime`. */
  fileTimes?: Map<string, number>;
}

export interface SimVm {
  vmid: number;
  config: Record<string, string>;
  status: "running" | "stopped";
  paused: boolean;
  startedAt?: number;
  /** The guest ignores ACPI power-off and has no agent to shut down with (hung, or no handler). */
  ignoresShutdown?: boolean;
}

export interface SimTask {
  upid: string;
  node: string;
  type: TaskType;
  id: string;
  user: string;
  tokenid?: string;
  starttime: number;
  pid: number;
  pstart: number;
  status: "running" | "stopped";
  exitstatus?: string;
  log: string[];
  done: Promise<void>;
}

interface Caller {
  tokenId: string;
  user: string;
  tokenName: string;
  spec: TokenSpec;
}

class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly errors?: Record<string, string>,
  ) {
    super(message);
  }
}

const ALL_PRIVILEGES = "all";
const TAG_PATTERN = /^[a-z0-9_][a-z0-9_\-+.]*$/;
const DNS_NAME =
  /^(?=.{1,253}$)([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*$/;

export class PveSimulator {
  readonly node: string;
  readonly options: Required<
    Omit<
      SimulatorOptions,
      "failTask" | "guestAddress" | "guestIpv6" | "tokens" | "taskMs" | "node" | "guestListens"
    >
  > &
    Pick<SimulatorOptions, "failTask" | "guestAddress" | "guestIpv6" | "taskMs">;
  /** The guests' listening ports (SimulatorOptions.guestListens); a test may change them as it goes. */
  guestListens: (vmid: number) => number[];
  /** Files written into guests through agent/file-write, by VMID and path (what file-read then serves). */
  readonly guestFiles = new Map<number, Map<string, Buffer>>();
  /** Every command agent/exec ran, in order. */
  readonly guestCommands: { vmid: number; argv: string[] }[] = [];
  /** How a command run through agent/exec ends; a test may change it (default: exit 0, no output). */
  guestExec: (vmid: number, argv: string[]) => { exitCode: number; stderr?: string } = () => ({
    exitCode: 0,
  });
  private readonly execResults = new Map<number, { exitCode: number; stderr?: string }>();
  readonly vms = new Map<number, SimVm>();
  readonly storages = new Map<string, SimStorage>();
  readonly tasks = new Map<string, SimTask>();
  readonly tokens = new Map<string, TokenSpec>();
  /** Every request as "METHOD /path" (query excluded), for call counting. */
  readonly requestLog: string[] = [];
  /**
   * TLS connections clients opened to this API (its server's `secureConnection`
   * events), for counting dials: a client that reuses its keep-alive
   * connections opens few whatever it asks.
   */
  tlsConnections = 0;
  /** Every multipart upload's raw headers, so tests can check framing. */
  readonly uploadHeaders: Array<Record<string, string | string[] | undefined>> = [];
  private server: Server | undefined;
  private nextPid: number;
  private readonly pstart = 0x1a2b3c;
  private readonly flocks = new Map<number, Promise<void>>();
  private readonly storageLocks = new Map<string, Promise<void>>();
  private readonly inFlight = new Set<Promise<void>>();

  constructor(options: SimulatorOptions = {}) {
    this.node = options.node ?? "pve";
    this.options = {
      pveMajor: options.pveMajor ?? 9,
      defaultTaskMs: options.defaultTaskMs ?? 20,
      latencyMs: options.latencyMs ?? 0,
      serverErrorRate: options.serverErrorRate ?? 0,
      agentDelayMs: options.agentDelayMs ?? 50,
      agentNeverUp: options.agentNeverUp ?? false,
      agentReportsDockerFirst: options.agentReportsDockerFirst ?? false,
      storageLockHoldMs: options.storageLockHoldMs ?? 5,
      storageLockTimeoutMs: options.storageLockTimeoutMs ?? 60_000,
      flockTimeoutMs: options.flockTimeoutMs ?? 10_000,
      shutdownSecondMs: options.shutdownSecondMs ?? 1000,
      firstPid: options.firstPid ?? 0x3000,
      configWritesAnswerNull: options.configWritesAnswerNull ?? false,
      failTask: options.failTask,
      guestAddress: options.guestAddress,
      guestIpv6: options.guestIpv6,
      taskMs: options.taskMs,
    };
    this.guestListens = options.guestListens ?? (() => [22]);
    this.nextPid = this.options.firstPid;
    for (const token of options.tokens ?? [defaultToken()]) this.tokens.set(token.id, token);
    this.addStorage({ id: "local-lvm", type: "lvmthin", content: ["images", "rootdir"] });
    this.addStorage({ id: "local", type: "dir", content: ["iso", "vztmpl", "backup"] });
    this.addStorage({ id: "seeds", type: "dir", content: ["iso"] });
    this.addTemplate(9000);
  }

  // ---------------------------------------------------------------- setup API

  addStorage(spec: { id: string; type: "lvmthin" | "dir"; content: string[] }): void {
    this.storages.set(spec.id, {
      id: spec.id,
      type: spec.type,
      content: new Set(spec.content),
      files: new Map(),
    });
  }

  /** A template as F19 describes it (Debian 13 cloud image, 3 GiB scsi0 on thin LVM, agent on). */
  addTemplate(vmid: number, overrides: Record<string, string> = {}): void {
    this.vms.set(vmid, {
      vmid,
      status: "stopped",
      paused: false,
      config: {
        name: `debian-13-template`,
        template: "1",
        agent: "1",
        bios: "ovmf",
        machine: "q35",
        boot: "order=scsi0",
        cores: "1",
        memory: "2048",
        scsi0: `local-lvm:base-${vmid}-disk-0,size=3G`,
        scsihw: "virtio-scsi-single",
        net0: "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1",
        ostype: "l26",
        tags: "debian;template",
        meta: "creation-qemu=11.0.0,ctime=1750000000",
        ...overrides,
      },
    });
  }

  /** A VM that is not ours (someone else's, for refusal tests). */
  addForeignVm(vmid: number, name: string, description = "hand-made VM"): void {
    this.vms.set(vmid, {
      vmid,
      status: "running",
      paused: false,
      startedAt: Date.now(),
      config: {
        name,
        description,
        agent: "1",
        boot: "order=scsi0",
        cores: "2",
        memory: "2048",
        scsi0: `local-lvm:vm-${vmid}-disk-0,size=10G`,
        net0: `virtio=${newMac()},bridge=vmbr0`,
      },
    });
  }

  /** The guest stops answering power-off requests (hung): a shutdown task times out (F24). */
  hangGuest(vmid: number): void {
    this.requireVm(vmid).ignoresShutdown = true;
  }

  /** QEMU paused the VM (e.g. I/O error): status stays running, qmpstatus paused (F14). */
  pauseVm(vmid: number): void {
    const vm = this.requireVm(vmid);
    vm.paused = true;
  }

  /**
   * The node rebooted: every VM stopped, then the ones with `onboot=1` started
   * again (PVE's pve-guests service at boot), their guest agents booting anew.
   */
  rebootNode(): void {
    for (const vm of this.vms.values()) {
      vm.status = "stopped";
      vm.paused = false;
      vm.startedAt = undefined;
    }
    for (const vm of this.vms.values())
      if (vm.config.template !== "1" && /^1$/.test(vm.config.onboot ?? "")) {
        vm.status = "running";
        vm.startedAt = Date.now();
      }
  }

  /** Someone deleted the VM out of band. */
  removeVmOutOfBand(vmid: number): void {
    this.vms.delete(vmid);
  }

  /** Puts an ISO file on a storage as if it was uploaded `ageSeconds` ago (out of band, no task). */
  putIsoFile(storageId: string, fileName: string, data: Buffer, ageSeconds = 0): void {
    const storage = this.storages.get(storageId);
    if (storage === undefined) throw new Error(`no storage ${storageId}`);
    const volid = `${storageId}:iso/${fileName}`;
    storage.files.set(volid, data);
    (storage.fileTimes ??= new Map()).set(volid, Math.floor(Date.now() / 1000) - ageSeconds);
  }

  isoFile(storage: string, fileName: string): Buffer | undefined {
    return this.storages.get(storage)?.files.get(`${storage}:iso/${fileName}`);
  }

  /** Resolves when every task started so far has stopped. */
  async settle(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.all([...this.inFlight]);
  }

  // ---------------------------------------------------------------- server

  /** Listens on loopback: 127.0.0.1 unless `address` is "::1" (an API endpoint given by an IPv6 literal). */
  async listen(port = 0, address: "127.0.0.1" | "::1" = "127.0.0.1"): Promise<string> {
    const tls = simulatorTls();
    const server = createServer({ key: tls.serverKeyPem, cert: tls.serverCertPem }, (req, res) => {
      void this.handle(req, res);
    });
    server.on("secureConnection", () => this.tlsConnections++);
    this.server = server;
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, address, () => resolve());
    });
    return this.endpoint;
  }

  get endpoint(): string {
    const address = this.server?.address() as AddressInfo | null | undefined;
    if (!address) throw new Error("simulator is not listening");
    const host = address.family === "IPv6" ? `[${address.address}]` : address.address;
    return `https://${host}:${address.port}`;
  }

  get caCertPem(): string {
    return simulatorTls().caCertPem;
  }

  /** The full token header value for a configured token. */
  tokenFor(id = "automation@pve!egress"): string {
    const token = this.tokens.get(id);
    if (!token) throw new Error(`no such token ${id}`);
    return `${token.id}=${token.secret}`;
  }

  async close(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "https://sim");
    const method = req.method ?? "GET";
    this.requestLog.push(`${method} ${url.pathname}`);
    const body = await readBody(req);
    if (this.options.latencyMs > 0) await sleep(this.options.latencyMs);
    try {
      if (!url.pathname.startsWith("/api2/json/")) throw new ApiError(501, "Not Implemented");
      if (this.options.serverErrorRate > 0 && Math.random() < this.options.serverErrorRate)
        throw pick([
          new ApiError(596, "Connection timed out"),
          new ApiError(500, "got no worker upid - command failed"),
          new ApiError(503, "Service Unavailable"),
        ]);
      const caller = this.authenticate(req);
      const path = url.pathname.slice("/api2/json".length);
      const params =
        method === "GET" || method === "DELETE" ? Object.fromEntries(url.searchParams) : {};
      const data = await this.route(method, path, params, body, req, caller);
      send(res, 200, "OK", { data });
    } catch (error) {
      if (error instanceof ApiError) {
        // F1: the text travels as the reason phrase and as `message` ending in "\n";
        // a 401 has an empty body (F22).
        if (error.status === 401) send(res, 401, error.message, undefined);
        else
          send(res, error.status, error.message, {
            data: null,
            message: `${error.message}\n`,
            ...(error.errors === undefined ? {} : { errors: error.errors }),
          });
      } else {
        const message = error instanceof Error ? error.message : String(error);
        send(res, 500, message, { data: null, message: `${message}\n` });
      }
    }
  }

  /** F22 */
  private authenticate(req: IncomingMessage): Caller {
    const header = req.headers.authorization;
    if (header === undefined) throw new ApiError(401, "No ticket");
    const match = /^PVEAPIToken=([^@\s]+)@([^!\s]+)!([^=\s]+)=(\S+)$/.exec(header.trim());
    if (match === null) throw new ApiError(401, "No ticket");
    const tokenId = `${match[1]}@${match[2]}!${match[3]}`;
    const spec = this.tokens.get(tokenId);
    if (spec === undefined || spec.secret !== match[4])
      throw new ApiError(401, "Authentication failed!");
    return { tokenId, user: `${match[1]}@${match[2]}`, tokenName: match[3], spec };
  }

  private async route(
    method: string,
    path: string,
    query: Record<string, string>,
    body: Buffer,
    req: IncomingMessage,
    caller: Caller,
  ): Promise<unknown> {
    const form = (): Record<string, string> =>
      (req.headers["content-type"] ?? "").startsWith("application/x-www-form-urlencoded")
        ? Object.fromEntries(new URLSearchParams(body.toString("utf8")))
        : body.length > 0 && (req.headers["content-type"] ?? "").includes("json")
          ? (JSON.parse(body.toString("utf8")) as Record<string, string>)
          : {};
    const segments = path
      .split("/")
      .filter((s) => s !== "")
      .map(decodeURIComponent);
    const key = `${method} /${segments
      .map((s, i) =>
        i > 0 && /^(nodes|qemu|storage|tasks|content)$/.test(segments[i - 1]) ? "*" : s,
      )
      .join("/")}`;
    if (segments[0] === "nodes" && segments[1] !== undefined && segments[1] !== this.node)
      throw new ApiError(
        500,
        `hostname lookup '${segments[1]}' failed - failed to get address info for: ${segments[1]}: Name or service not known`,
      );
    const vmid = Number(segments[3]);
    switch (key) {
      case "GET /version":
        return {
          version: this.options.pveMajor === 9 ? "9.2.20" : "8.4.1",
          release: `${this.options.pveMajor}`,
          repoid: "sim",
        };
      case "GET /cluster/nextid":
        return this.nextId(query.vmid);
      case "GET /cluster/resources":
        return this.clusterResources(caller, query.type);
      case "POST /nodes/*/qemu/*/clone":
        return this.clone(caller, vmid, form());
      case "POST /nodes/*/storage/*/upload":
        return this.upload(caller, segments[3], body, req);
      case "POST /nodes/*/qemu/*/config":
        return this.writeConfig(caller, vmid, form());
      case "GET /nodes/*/qemu/*/config":
        return this.readConfig(caller, vmid);
      case "PUT /nodes/*/qemu/*/resize":
        return this.resize(caller, vmid, form());
      case "GET /nodes/*/qemu":
        return this.vmIndex(caller, query.full);
      case "GET /nodes/*/qemu/*/status/current":
        return this.statusCurrent(caller, vmid);
      case "POST /nodes/*/qemu/*/status/start":
        return this.start(caller, vmid);
      case "POST /nodes/*/qemu/*/status/stop":
        return this.stop(caller, vmid);
      case "POST /nodes/*/qemu/*/status/shutdown":
        return this.shutdown(caller, vmid, form());
      case "POST /nodes/*/qemu/*/status/suspend":
        return this.powerTask(caller, vmid, "qmsuspend", (vm) => (vm.paused = true));
      case "POST /nodes/*/qemu/*/status/resume":
        return this.powerTask(caller, vmid, "qmresume", (vm) => (vm.paused = false));
      case "GET /nodes/*/qemu/*/agent/network-get-interfaces":
        return this.agentInterfaces(caller, vmid);
      case "GET /nodes/*/qemu/*/agent/file-read":
        return this.agentFileRead(caller, vmid, query.file);
      case "POST /nodes/*/qemu/*/agent/file-write":
        return this.agentFileWrite(caller, vmid, form());
      case "POST /nodes/*/qemu/*/agent/exec":
        return this.agentExec(
          caller,
          vmid,
          new URLSearchParams(body.toString("utf8")).getAll("command"),
        );
      case "GET /nodes/*/qemu/*/agent/exec-status":
        return this.agentExecStatus(caller, vmid, query.pid);
      case "DELETE /nodes/*/qemu/*":
        return this.destroy(caller, vmid);
      case "DELETE /nodes/*/storage/*/content/*":
        return this.deleteVolume(caller, segments[3], segments.slice(5).join("/"));
      case "GET /nodes/*/storage/*/content":
        return this.listContent(caller, segments[3]);
      case "GET /nodes/*/tasks/*/status":
        return this.taskStatus(segments[3]);
      case "GET /nodes/*/tasks/*/log":
        return this.taskLog(segments[3], query);
      default:
        throw new ApiError(501, `Method '${method} ${path}' not implemented`);
    }
  }

  // ---------------------------------------------------------------- permissions (F17)

  private privilegesAt(caller: Caller, path: string): Set<string> | typeof ALL_PRIVILEGES {
    const specific = Object.keys(caller.spec.pathPrivileges ?? {})
      .filter((acl) => path === acl || path.startsWith(acl.endsWith("/") ? acl : `${acl}/`))
      .sort((a, b) => b.length - a.length)[0];
    if (specific !== undefined) return new Set(caller.spec.pathPrivileges![specific]);
    return caller.spec.privileges === ALL_PRIVILEGES
      ? ALL_PRIVILEGES
      : new Set(caller.spec.privileges);
  }

  private can(caller: Caller, path: string, privilege: string): boolean {
    const granted = this.privilegesAt(caller, path);
    return granted === ALL_PRIVILEGES || granted.has(privilege);
  }

  private require(caller: Caller, path: string, privilege: string): void {
    if (!this.can(caller, path, privilege))
      throw new ApiError(403, `Permission check failed (${path}, ${privilege})`);
  }

  // ---------------------------------------------------------------- cluster

  /** Flow step 1: not permission-filtered; no reservation. */
  private nextId(requested: string | undefined): string {
    if (requested !== undefined) {
      const vmid = Number(requested);
      if (!Number.isInteger(vmid) || vmid < 100 || vmid > 999_999_999)
        throw new ApiError(400, "Parameter verification failed.", {
          vmid: "invalid format - value must be a valid VM ID",
        });
      if (this.vms.has(vmid)) throw new ApiError(400, `VM ${vmid} already exists`);
      return String(vmid);
    }
    let vmid = 100;
    while (this.vms.has(vmid)) vmid++;
    return String(vmid);
  }

  /** F8: permission-filtered; a mid-clone entry has no name, status unknown, lock clone. */
  private clusterResources(caller: Caller, type: string | undefined): unknown[] {
    if (type !== undefined && type !== "vm") return [];
    const out: unknown[] = [];
    for (const vm of this.vms.values()) {
      if (!this.can(caller, `/vms/${vm.vmid}`, "VM.Audit")) continue;
      const base = { id: `qemu/${vm.vmid}`, type: "qemu", vmid: vm.vmid, node: this.node };
      const lock = vm.config.lock;
      if (lock === "clone" || lock === "create") {
        out.push({ ...base, lock, status: "unknown" });
        continue;
      }
      out.push({
        ...base,
        name: vm.config.name,
        status: vm.status, // F14: paused shows as plain running here
        template: vm.config.template === "1" ? 1 : 0,
        ...(vm.config.tags === undefined ? {} : { tags: vm.config.tags }),
        maxcpu: Number(vm.config.cores ?? 1),
        maxmem: Number(vm.config.memory ?? 512) * 1024 * 1024,
        maxdisk: diskBytes(vm.config.scsi0),
        uptime:
          vm.status === "running" && vm.startedAt
            ? Math.floor((Date.now() - vm.startedAt) / 1000)
            : 0,
        ...(lock === undefined ? {} : { lock }),
      });
    }
    return out;
  }

  // ---------------------------------------------------------------- VMs

  private requireVm(vmid: number): SimVm {
    const vm = this.vms.get(vmid);
    // F2: a 500, not a 404, identical for config, status/current and DELETE.
    if (vm === undefined)
      throw new ApiError(
        500,
        `Configuration file 'nodes/${this.node}/qemu-server/${vmid}.conf' does not exist`,
      );
    return vm;
  }

  private checkLock(vm: SimVm): void {
    if (vm.config.lock !== undefined) throw new ApiError(500, `VM is locked (${vm.config.lock})`);
  }

  /** Flow step 2. */
  private clone(caller: Caller, source: number, form: Record<string, string>): string {
    const template = this.requireVm(source);
    const newid = Number(form.newid);
    if (!Number.isInteger(newid) || newid < 100)
      throw new ApiError(400, "Parameter verification failed.", {
        newid: "invalid format - value must be a valid VM ID",
      });
    if (form.name !== undefined && !DNS_NAME.test(form.name))
      throw new ApiError(400, "Parameter verification failed.", {
        name: "invalid format - value does not look like a valid DNS name",
      });
    if (form.description !== undefined && Buffer.byteLength(form.description) > 8192)
      throw new ApiError(400, "Parameter verification failed.", {
        description: "value may only be 8192 characters long",
      });
    const storageId = form.storage ?? "local-lvm";
    const storage = this.storages.get(storageId);
    if (storage === undefined) throw new ApiError(500, `storage '${storageId}' does not exist`);
    this.require(caller, `/vms/${source}`, "VM.Clone");
    this.require(caller, `/vms/${newid}`, "VM.Allocate");
    this.require(caller, `/storage/${storageId}`, "Datastore.AllocateSpace");
    const bridge = /bridge=([^,]+)/.exec(template.config.net0 ?? "")?.[1];
    if (bridge !== undefined) this.require(caller, `/sdn/zones/localnetwork/${bridge}`, "SDN.Use");
    // F15: rejected up front, nothing left behind.
    if (!storage.content.has("images"))
      throw new ApiError(400, "Parameter verification failed.", {
        storage: `storage '${storageId}' does not support vm images`,
      });
    // F4: synchronous.
    if (this.vms.has(newid))
      throw new ApiError(500, `unable to create VM ${newid}: config file already exists`);
    // F8: from now on the entry exists, nameless and clone-locked.
    const vm: SimVm = { vmid: newid, status: "stopped", paused: false, config: { lock: "clone" } };
    this.vms.set(newid, vm);
    // The UPID carries the source vmid.
    // PVE removes the half-made VM when the clone task fails.
    const removeHalfMade = () => {
      if (this.vms.get(newid) === vm) this.vms.delete(newid);
    };
    return this.startTask(
      caller,
      "qmclone",
      String(source),
      async (log) => {
        log(`create full clone of drive scsi0 (${template.config.scsi0?.split(",")[0]})`);
        await this.withStorageLock(storageId, log);
        await sleep(this.taskMs("qmclone"));
        const config: Record<string, string> = { ...template.config };
        delete config.template;
        const size = /size=([^,]+)/.exec(template.config.scsi0 ?? "")?.[1] ?? "3G";
        config.scsi0 = `${storageId}:vm-${newid}-disk-0,size=${size}`;
        storage.files.set(`${storageId}:vm-${newid}-disk-0`, Buffer.alloc(0));
        // The clone regenerates every NIC's MAC; meta and tags are copied (F11).
        for (const [key, value] of Object.entries(config))
          if (/^net\d+$/.test(key))
            config[key] = value.replace(/=([0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5})/, `=${newMac()}`);
        if (form.name !== undefined) config.name = form.name;
        else config.name = `Copy-of-VM-${template.config.name ?? source}`;
        if (form.description !== undefined) config.description = form.description;
        log("transferred 3.0 GiB of 3.0 GiB (100.00%)");
        if (this.vms.get(newid) === vm) vm.config = config;
      },
      removeHalfMade,
    );
  }

  /**
   * Parallel clones on one storage queue for its lock; one that waits too
   * long fails the way PVE does ("got timeout", transient).
   */
  private async withStorageLock(storageId: string, log: (line: string) => void): Promise<void> {
    const previous = this.storageLocks.get(storageId) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((resolve) => (release = resolve));
    const chained = previous.then(() => mine);
    this.storageLocks.set(storageId, chained);
    const timedOut = await timesOut(previous, this.options.storageLockTimeoutMs);
    if (timedOut) {
      // Give up our place without blocking those behind us.
      void previous.then(release);
      throw new Error(
        `can't lock file '/var/lock/pve-manager/pve-storage-${storageId}' - got timeout`,
      );
    }
    try {
      log(`  allocated volume on ${storageId}`);
      await sleep(this.options.storageLockHoldMs);
    } finally {
      release();
      if (this.storageLocks.get(storageId) === chained) this.storageLocks.delete(storageId);
    }
  }

  /** The per-VM flock every config-changing task takes. */
  private async withFlock<T>(vmid: number, work: () => Promise<T>): Promise<T> {
    const previous = this.flocks.get(vmid) ?? Promise.resolve();
    let release!: () => void;
    const mine = new Promise<void>((resolve) => (release = resolve));
    const chained = previous.then(() => mine);
    this.flocks.set(vmid, chained);
    const timedOut = await timesOut(previous, this.options.flockTimeoutMs);
    if (timedOut) {
      void previous.then(release);
      throw new Error(`can't lock file '/var/lock/qemu-server/lock-${vmid}.conf' - got timeout`);
    }
    try {
      return await work();
    } finally {
      release();
      if (this.flocks.get(vmid) === chained) this.flocks.delete(vmid);
    }
  }

  private readConfig(caller: Caller, vmid: number): Record<string, unknown> {
    const vm = this.requireVm(vmid);
    this.require(caller, `/vms/${vmid}`, "VM.Audit");
    return { ...vm.config, digest: digestOf(vm.config) };
  }

  /** Flow step 4 (F7, F9, F19). */
  private writeConfig(caller: Caller, vmid: number, form: Record<string, string>): string | null {
    const vm = this.requireVm(vmid);
    const vmPath = `/vms/${vmid}`;
    const changes: Record<string, string> = {};
    for (const [key, value] of Object.entries(form)) {
      if (key === "digest" || key === "skiplock") continue;
      changes[key] = value;
    }
    if (form.skiplock !== undefined) throw new ApiError(403, "Only root may use this option.");
    for (const key of Object.keys(changes)) {
      if (key === "cores" || key === "sockets") this.require(caller, vmPath, "VM.Config.CPU");
      else if (key === "memory") this.require(caller, vmPath, "VM.Config.Memory");
      else if (/^net\d+$/.test(key)) {
        this.require(caller, vmPath, "VM.Config.Network");
        const bridge = /bridge=([^,]+)/.exec(changes[key])?.[1] ?? "vmbr0";
        const tag = /tag=(\d+)/.exec(changes[key])?.[1];
        this.require(
          caller,
          `/sdn/zones/localnetwork/${bridge}${tag === undefined ? "" : `/${tag}`}`,
          "SDN.Use",
        );
      } else if (key === "ide2") {
        this.require(caller, vmPath, "VM.Config.CDROM");
        const volume = changes[key].split(",")[0];
        const storageId = volume.split(":")[0];
        if (volume !== "none" && volume !== "cdrom") {
          this.require(caller, `/storage/${storageId}`, "Datastore.Audit");
          if (!this.storages.get(storageId)?.files.has(volume))
            throw new ApiError(500, `volume '${volume}' does not exist`);
        }
      } else if (/^(scsi|virtio|sata)\d+$/.test(key))
        this.require(caller, vmPath, "VM.Config.Disk");
      else this.require(caller, vmPath, "VM.Config.Options");
    }
    if (changes.tags !== undefined) changes.tags = normalizeTags(changes.tags);
    if (changes.name !== undefined && !DNS_NAME.test(changes.name))
      throw new ApiError(400, "Parameter verification failed.", {
        name: "invalid format - value does not look like a valid DNS name",
      });
    // F7
    this.checkLock(vm);
    const apply = (current: SimVm) => {
      Object.assign(current.config, changes);
      // F19: attaching ide2 appends it to the boot order.
      if (changes.ide2 !== undefined && /^order=/.test(current.config.boot ?? "")) {
        const order = current.config.boot.slice("order=".length).split(";");
        if (!order.includes("ide2")) current.config.boot = `order=${[...order, "ide2"].join(";")}`;
      }
    };
    if (this.options.configWritesAnswerNull) {
      apply(vm);
      return null;
    }
    return this.startTask(caller, "qmconfig", String(vmid), async () => {
      await this.withFlock(vmid, async () => {
        await sleep(this.taskMs("qmconfig"));
        const current = this.requireVm(vmid);
        this.checkLock(current);
        apply(current);
      });
    });
  }

  /** Flow step 5 (F20): asynchronous; same size is OK; shrinking fails in the task. */
  private resize(caller: Caller, vmid: number, form: Record<string, string>): string {
    const vm = this.requireVm(vmid);
    this.require(caller, `/vms/${vmid}`, "VM.Config.Disk");
    const disk = form.disk;
    if (disk === undefined || vm.config[disk] === undefined)
      throw new ApiError(400, "Parameter verification failed.", {
        disk:
          disk === undefined
            ? "property is missing and it is not optional"
            : `no such disk '${disk}'`,
      });
    const storageId = vm.config[disk].split(":")[0];
    this.require(caller, `/storage/${storageId}`, "Datastore.AllocateSpace");
    const match = /^(\+)?(\d+(?:\.\d+)?)([KMGT])?$/.exec(form.size ?? "");
    if (match === null)
      throw new ApiError(400, "Parameter verification failed.", {
        size: "value does not match the regex pattern",
      });
    this.checkLock(vm);
    return this.startTask(caller, "resize", String(vmid), async () => {
      await this.withFlock(vmid, async () => {
        await sleep(this.taskMs("resize"));
        const current = this.requireVm(vmid);
        const currentBytes = diskBytes(current.config[disk]);
        const amount = Number(match[2]) * unitBytes(match[3] ?? "");
        const wanted = match[1] === "+" ? currentBytes + amount : amount;
        if (wanted < currentBytes) throw new Error("shrinking disks is not supported");
        if (wanted === currentBytes) return;
        current.config[disk] = current.config[disk].replace(
          /size=[^,]+/,
          `size=${formatSize(wanted)}`,
        );
      });
    });
  }

  private statusCurrent(caller: Caller, vmid: number): Record<string, unknown> {
    const vm = this.requireVm(vmid);
    this.require(caller, `/vms/${vmid}`, "VM.Audit");
    // qemu-server answers it with the index's entry for the one VM, asked in full (F25).
    return { ...this.vmStatusOf(vm, true), agent: vm.config.agent === "1" ? 1 : 0 };
  }

  /**
   * F25: the node's VM index, as qemu-server's `vmlist` answers it: every VM
   * whose config is on this node, those without VM.Audit left out without a
   * word; with `full`, what QMP says too.
   */
  private vmIndex(caller: Caller, full: string | undefined): unknown[] {
    const askQmp = /^(1|true|yes|on)$/i.test(full ?? "");
    return [...this.vms.values()]
      .filter((vm) => this.can(caller, `/vms/${vm.vmid}`, "VM.Audit"))
      .map((vm) => this.vmStatusOf(vm, askQmp));
  }

  /**
   * One VM as PVE::QemuServer::vmstatus reports it (F25): a name always (`VM
   * <vmid>` when the config has none, as mid-clone), `lock` and `tags` only
   * when set. `qmpstatus` only when QMP is asked (`full`): a paused VM's
   * `status` is still running (F14); one not running has its `status` there.
   * The simulator runs no QEMU: usage counters are 0, and no `pid`.
   */
  private vmStatusOf(vm: SimVm, askQmp: boolean): Record<string, unknown> {
    const running = vm.status === "running";
    const cores = Number(vm.config.cores ?? 1) * Number(vm.config.sockets ?? 1);
    return {
      vmid: vm.vmid,
      name: vm.config.name ?? `VM ${vm.vmid}`,
      status: vm.status,
      cpus: cores,
      maxmem: Number(/^(?:current=)?(\d+)/.exec(vm.config.memory ?? "")?.[1] ?? 512) * 1024 * 1024,
      maxdisk: diskBytes(vm.config.scsi0),
      disk: 0,
      cpu: 0,
      mem: 0,
      memhost: 0,
      netin: 0,
      netout: 0,
      uptime: running && vm.startedAt ? Math.floor((Date.now() - vm.startedAt) / 1000) : 0,
      ...(vm.config.template === "1" ? { template: 1 } : {}),
      ...(vm.config.lock === undefined ? {} : { lock: vm.config.lock }),
      ...(vm.config.tags === undefined ? {} : { tags: vm.config.tags }),
      ...(askQmp
        ? {
            qmpstatus: running ? (vm.paused ? "paused" : "running") : vm.status,
            ...(running ? { "running-qemu": "11.0.0", "running-machine": "pc-q35-11.0+pve0" } : {}),
          }
        : {}),
    };
  }

  /** Flow step 6; F3: accepted while clone-locked, starts when the clone is done. */
  private start(caller: Caller, vmid: number): string {
    const vm = this.requireVm(vmid);
    this.require(caller, `/vms/${vmid}`, "VM.PowerMgmt");
    if (vm.config.template === "1")
      throw new ApiError(500, "you can't start a vm if it's a template");
    return this.startTask(caller, "qmstart", String(vmid), async (log) => {
      let current = this.requireVm(vmid);
      if (current.config.lock === "clone") {
        log("trying to acquire lock...");
        const waitUntil = Date.now() + Math.max(this.options.flockTimeoutMs, 60_000);
        while (this.vms.get(vmid)?.config.lock === "clone") {
          if (Date.now() > waitUntil)
            throw new Error(
              `can't lock file '/var/lock/qemu-server/lock-${vmid}.conf' - got timeout`,
            );
          await sleep(5);
        }
        log(" OK");
        current = this.requireVm(vmid);
      }
      await this.withFlock(vmid, async () => {
        this.checkLock(current);
        if (current.status === "running") throw new Error(`VM ${vmid} already running`);
        await sleep(this.taskMs("qmstart"));
        current.status = "running";
        current.paused = false;
        current.startedAt = Date.now();
      });
    });
  }

  /** A stop on a stopped VM just finishes OK. */
  private stop(caller: Caller, vmid: number): string {
    const vm = this.requireVm(vmid);
    this.require(caller, `/vms/${vmid}`, "VM.PowerMgmt");
    this.checkLock(vm);
    return this.startTask(caller, "qmstop", String(vmid), async () => {
      await this.withFlock(vmid, async () => {
        await sleep(this.taskMs("qmstop"));
        const current = this.vms.get(vmid);
        if (current === undefined) return;
        current.status = "stopped";
        current.paused = false;
        current.ignoresShutdown = false;
        current.startedAt = undefined;
      });
    });
  }

  /**
   * F24: a clean power-off within `timeout` seconds (ACPI, or the guest agent when configured). A paused
   * VM is refused before any task; a stopped one finishes OK; a guest that ignores it fails the task
   * with "got timeout" after `timeout`, unless `forceStop` stops it then.
   */
  private shutdown(caller: Caller, vmid: number, params: Record<string, string>): string {
    const vm = this.requireVm(vmid);
    this.require(caller, `/vms/${vmid}`, "VM.PowerMgmt");
    this.checkLock(vm);
    const force = params.forceStop === "1";
    if (vm.status === "running" && vm.paused && !force)
      throw new ApiError(500, "VM is paused - cannot shutdown");
    const timeoutSeconds = Number(params.timeout ?? 600);
    return this.startTask(caller, "qmshutdown", String(vmid), async () => {
      await this.withFlock(vmid, async () => {
        const current = this.vms.get(vmid);
        if (current === undefined || current.status !== "running") return;
        if (current.ignoresShutdown || current.paused) {
          await sleep(timeoutSeconds * this.options.shutdownSecondMs);
          if (!force) throw new Error("VM quit/powerdown failed - got timeout");
        } else await sleep(this.taskMs("qmshutdown"));
        current.status = "stopped";
        current.paused = false;
        current.ignoresShutdown = false;
        current.startedAt = undefined;
      });
    });
  }

  private powerTask(
    caller: Caller,
    vmid: number,
    type: TaskType,
    change: (vm: SimVm) => void,
  ): string {
    const vm = this.requireVm(vmid);
    this.require(caller, `/vms/${vmid}`, "VM.PowerMgmt");
    if (vm.status !== "running") throw new ApiError(500, `VM ${vmid} not running`);
    return this.startTask(caller, type, String(vmid), async () => {
      await sleep(this.taskMs(type));
      change(this.requireVm(vmid));
    });
  }

  /** The F5 errors by state of an agent command, once the privilege is checked. */
  private agentReady(caller: Caller, vmid: number, privilege: string, command: string): SimVm {
    const vm = this.requireVm(vmid);
    this.require(caller, `/vms/${vmid}`, privilege);
    if (vm.status !== "running") throw new ApiError(500, `VM ${vmid} is not running`);
    if (vm.config.agent === undefined || /^(0|enabled=0)/.test(vm.config.agent))
      throw new ApiError(500, "No QEMU guest agent configured");
    const channel = this.options.pveMajor === 9 ? "qga" : "qmp";
    if (vm.paused)
      throw new ApiError(500, `VM ${vmid} ${channel} command '${command}' failed - got timeout`);
    if (this.options.agentNeverUp || Date.now() < (vm.startedAt ?? 0) + this.options.agentDelayMs)
      throw new ApiError(500, "QEMU guest agent is not running");
    return vm;
  }

  /**
   * `agent/file-read` (qemu-server's API2/Qemu/Agent.pm): VM.GuestAgent.FileRead
   * on PVE 9 (VM.Monitor on 8), the agent's F5 errors, the file's text as
   * `content` with `bytes-read`. Only the socket tables are modelled: the
   * guest's listening ports (`guestListens`).
   */
  private agentFileRead(caller: Caller, vmid: number, file: string | undefined): unknown {
    this.agentReady(
      caller,
      vmid,
      this.options.pveMajor === 9 ? "VM.GuestAgent.FileRead" : "VM.Monitor",
      "guest-file-open",
    );
    if (file === undefined)
      throw new ApiError(
        400,
        "Parameter verification failed.\nfile: property is missing and it is not optional",
      );
    const ports = this.guestListens(vmid);
    const row = (index: number, local: string) =>
      `  ${index}: ${local} ${"0".repeat(local.length - 5)}:0000 0A 00000000:00000000 00:00000000 00000000     0        0 ${1000 + index} 1 0000000000000000 100 0 0 10 0`;
    const hexPort = (port: number) => port.toString(16).toUpperCase().padStart(4, "0");
    const tables: Record<string, string> = {
      "/proc/net/tcp": [
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
        ...ports.map((port, index) => row(index, `00000000:${hexPort(port)}`)),
      ].join("\n"),
      "/proc/net/tcp6": [
        "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
        ...ports.map((port, index) => row(index, `${"0".repeat(32)}:${hexPort(port)}`)),
      ].join("\n"),
    };
    const written = this.guestFiles.get(vmid)?.get(file);
    // Decoded by PVE, carried by its JSON one character per byte.
    if (written !== undefined)
      return { content: written.toString("latin1"), "bytes-read": written.length };
    const content = tables[file];
    if (content === undefined)
      throw new ApiError(
        500,
        `can't open file - failed to open file '${file}': No such file or directory`,
      );
    return { content: `${content}\n`, "bytes-read": Buffer.byteLength(`${content}\n`) };
  }

  /**
   * `agent/file-write` (API2/Qemu/Agent.pm): VM.GuestAgent.FileWrite or
   * Unrestricted on PVE 9 (VM.Monitor on 8); `content` at most 60 KiB, base64
   * already when `encode` is 0, else encoded by PVE; the file replaced.
   */
  private agentFileWrite(caller: Caller, vmid: number, fields: Record<string, string>): unknown {
    this.agentReady(
      caller,
      vmid,
      this.options.pveMajor === 9 ? "VM.GuestAgent.FileWrite" : "VM.Monitor",
      "guest-file-open",
    );
    const { file, content, encode } = fields;
    if (file === undefined || content === undefined)
      throw new ApiError(
        400,
        "Parameter verification failed.\nfile: property is missing and it is not optional",
      );
    if (content.length > 60 * 1024)
      throw new ApiError(
        400,
        "Parameter verification failed.\ncontent: value may only be 61440 characters long",
      );
    const bytes = encode === "0" ? Buffer.from(content, "base64") : Buffer.from(content, "utf8");
    const files = this.guestFiles.get(vmid) ?? new Map<string, Buffer>();
    files.set(file, bytes);
    this.guestFiles.set(vmid, files);
    return null;
  }

  /** `agent/exec`: VM.GuestAgent.Unrestricted on PVE 9 (VM.Monitor on 8); the command as an array; a pid. */
  private agentExec(caller: Caller, vmid: number, command: string[]): unknown {
    this.agentReady(
      caller,
      vmid,
      this.options.pveMajor === 9 ? "VM.GuestAgent.Unrestricted" : "VM.Monitor",
      "guest-exec",
    );
    if (command.length === 0) throw new ApiError(500, "command or input-data (or both) required");
    this.guestCommands.push({ vmid, argv: command });
    const pid = 4000 + this.guestCommands.length;
    this.execResults.set(pid, this.guestExec(vmid, command));
    return { pid };
  }

  /** `agent/exec-status`: the command has exited by the first ask; out/err decoded, as PVE does. */
  private agentExecStatus(caller: Caller, vmid: number, pid: string | undefined): unknown {
    this.agentReady(
      caller,
      vmid,
      this.options.pveMajor === 9 ? "VM.GuestAgent.Unrestricted" : "VM.Monitor",
      "guest-exec-status",
    );
    const result = this.execResults.get(Number(pid));
    if (result === undefined) throw new ApiError(500, `Agent error: Invalid parameter 'pid'`);
    return {
      exited: 1,
      exitcode: result.exitCode,
      ...(result.stderr ? { "err-data": result.stderr } : {}),
    };
  }

  /** Flow step 7 (F5 errors by state, F21 reply shape). */
  private agentInterfaces(caller: Caller, vmid: number): unknown {
    this.agentReady(
      caller,
      vmid,
      this.options.pveMajor === 9 ? "VM.GuestAgent.Audit" : "VM.Monitor",
      "guest-network-get-interfaces",
    );
    const vm = this.requireVm(vmid);
    const mac = (
      /=([0-9A-Fa-f:]{17})/.exec(vm.config.net0 ?? "")?.[1] ?? "bc:24:11:00:00:00"
    ).toLowerCase();
    const address =
      this.options.guestAddress?.(vmid) ??
      `192.168.${Math.floor(vmid / 250) % 250}.${(vmid % 250) + 2}`;
    const interfaces: unknown[] = [
      {
        name: "lo",
        "hardware-address": "00:00:00:00:00:00",
        "ip-addresses": [
          { "ip-address": "127.0.0.1", "ip-address-type": "ipv4", prefix: 8 },
          { "ip-address": "::1", "ip-address-type": "ipv6", prefix: 128 },
        ],
      },
      {
        name: "ens18",
        "hardware-address": mac,
        "ip-addresses": [
          { "ip-address": address, "ip-address-type": "ipv4", prefix: 24 },
          { "ip-address": "fe80::be24:11ff:fe00:1", "ip-address-type": "ipv6", prefix: 64 },
          ...this.guestIpv6(vm, mac).map((entry) => ({
            "ip-address": entry,
            "ip-address-type": "ipv6",
            prefix: 64,
          })),
        ],
      },
    ];
    if (this.options.agentReportsDockerFirst)
      interfaces.splice(1, 0, {
        name: "docker0",
        "hardware-address": "02:42:ac:11:00:01",
        "ip-addresses": [{ "ip-address": "172.17.0.1", "ip-address-type": "ipv4", prefix: 16 }],
      });
    return { result: interfaces };
  }

  /**
   * The global IPv6 address a guest has when its seed's network-config asks
   * for one (as cloud-init would configure it): the static address written
   * there, or for SLAAC the address a router on its bridge would hand out,
   * one /64 per bridge (2001:db8:<n>::/64) and the interface id from the MAC.
   */
  private guestIpv6(vm: SimVm, mac: string): string[] {
    const seed = /^([^:,]+):iso\/([^,]+)/.exec(vm.config.ide2 ?? "");
    const image = seed === null ? undefined : this.isoFile(seed[1], seed[2]);
    const text = image?.toString("latin1") ?? "";
    if (!text.includes("type: ipv6_slaac") && !text.includes("type: static6")) return [];
    if (this.options.guestIpv6 !== undefined) {
      const reported = this.options.guestIpv6(vm.vmid);
      return reported === null ? [] : [reported];
    }
    const fixed = /type: static6\n\s+address: "([0-9a-f:]+)\/\d+"/.exec(text);
    if (fixed !== null) return [fixed[1]];
    if (!text.includes("type: ipv6_slaac")) return [];
    const bridge = /bridge=([^,]+)/.exec(vm.config.net0 ?? "")?.[1] ?? "vmbr0";
    const net = [...bridge].reduce((sum, char) => (sum * 31 + char.charCodeAt(0)) % 0xffff, 7);
    const octets = mac.split(":").map((part) => parseInt(part, 16));
    const id = [
      octets[0] ^ 0x02,
      octets[1],
      octets[2],
      0xff,
      0xfe,
      octets[3],
      octets[4],
      octets[5],
    ];
    const groups = [0, 2, 4, 6].map((i) => ((id[i] << 8) | id[i + 1]).toString(16));
    return [`2001:db8:${net.toString(16)}:0:${groups.join(":")}`];
  }

  /** "VM is running - destroy failed" unless stopped first; purge + unreferenced disks. */
  private destroy(caller: Caller, vmid: number): string {
    const vm = this.requireVm(vmid);
    this.require(caller, `/vms/${vmid}`, "VM.Allocate");
    this.checkLock(vm);
    if (vm.status === "running") throw new ApiError(500, `VM ${vmid} is running - destroy failed`);
    return this.startTask(caller, "qmdestroy", String(vmid), async () => {
      await this.withFlock(vmid, async () => {
        const current = this.vms.get(vmid);
        if (current === undefined) return;
        current.config.lock = "destroyed";
        await sleep(this.taskMs("qmdestroy"));
        for (const storage of this.storages.values())
          for (const volid of [...storage.files.keys()])
            if (volid.includes(`vm-${vmid}-disk-`)) storage.files.delete(volid);
        this.vms.delete(vmid);
      });
    });
  }

  // ---------------------------------------------------------------- storage

  /** Flow step 3 (F12, F23): multipart, content first, a Content-Length, silent overwrite. */
  private upload(caller: Caller, storageId: string, body: Buffer, req: IncomingMessage): string {
    this.uploadHeaders.push({ ...req.headers });
    const storage = this.storages.get(storageId);
    if (storage === undefined) throw new ApiError(500, `storage '${storageId}' does not exist`);
    if (req.headers["content-length"] === undefined) throw new ApiError(411, "Length Required");
    this.require(caller, `/storage/${storageId}`, "Datastore.AllocateTemplate");
    const contentType = req.headers["content-type"] ?? "";
    if (!contentType.startsWith("multipart/form-data"))
      throw new ApiError(400, "Parameter verification failed.", {
        filename: "property is missing and it is not optional",
      });
    let parts;
    try {
      parts = parseMultipart(body, contentType);
    } catch (error) {
      throw new ApiError(400, `malformed multipart body: ${(error as Error).message}`);
    }
    const fileIndex = parts.findIndex((part) => part.fileName !== undefined);
    const contentIndex = parts.findIndex((part) => part.name === "content");
    // pveproxy streams the file to /var/tmp/pveupload-* and only knows the
    // parameters read before it: a `content` after the file is not seen.
    if (contentIndex < 0 || (fileIndex >= 0 && contentIndex > fileIndex))
      throw new ApiError(400, "Parameter verification failed.", {
        content: "property is missing and it is not optional",
      });
    const file = parts[fileIndex];
    if (file === undefined || file.name !== "filename")
      throw new ApiError(400, "Parameter verification failed.", {
        filename: "property is missing and it is not optional",
      });
    const content = parts[contentIndex].data.toString("utf8");
    if (content !== "iso" && content !== "vztmpl" && content !== "import")
      throw new ApiError(400, "Parameter verification failed.", {
        content: "value 'x' does not have a value in the enumeration 'iso, vztmpl, import'".replace(
          "'x'",
          `'${content}'`,
        ),
      });
    if (!storage.content.has(content))
      throw new ApiError(500, `storage '${storageId}' does not support '${content}' content`);
    const fileName = file.fileName ?? "";
    if (content === "iso" && !/\.(iso|img)$/i.test(fileName))
      throw new ApiError(400, "Parameter verification failed.", {
        filename: "wrong file extension",
      });
    const data = Buffer.from(file.data);
    const staging = `/var/tmp/pveupload-${randomBytes(16).toString("hex")}`;
    return this.startTask(caller, "imgcopy", "", async (log) => {
      log(`starting file import from: ${staging}`);
      log(`target node: ${this.node}`);
      log(`target file: /var/lib/vz/template/${content}/${fileName}`);
      log(`file size is: ${data.length}`);
      await sleep(this.taskMs("imgcopy"));
      // F12: an existing file of that name is overwritten without a word.
      storage.files.set(`${storageId}:${content}/${fileName}`, data);
      (storage.fileTimes ??= new Map()).set(
        `${storageId}:${content}/${fileName}`,
        Math.floor(Date.now() / 1000),
      );
      log("finished file import successfully");
    });
  }

  /** F13: Datastore.Allocate; an imgdel task; a missing volume still ends OK. */
  private deleteVolume(caller: Caller, storageId: string, volume: string): string {
    const storage = this.storages.get(storageId);
    if (storage === undefined) throw new ApiError(500, `storage '${storageId}' does not exist`);
    this.require(caller, `/storage/${storageId}`, "Datastore.Allocate");
    const volid = volume.includes(":") ? volume : `${storageId}:${volume}`;
    return this.startTask(caller, "imgdel", storageId, async () => {
      await sleep(this.taskMs("imgdel"));
      storage.files.delete(volid);
      storage.fileTimes?.delete(volid);
    });
  }

  private listContent(caller: Caller, storageId: string): unknown[] {
    const storage = this.storages.get(storageId);
    if (storage === undefined) throw new ApiError(500, `storage '${storageId}' does not exist`);
    this.require(caller, `/storage/${storageId}`, "Datastore.Audit");
    // Directory storages report each file's ctime (seconds), as pve-storage's list does.
    return [...storage.files.entries()].map(([volid, data]) => {
      const ctime = storage.fileTimes?.get(volid);
      return {
        volid,
        size: data.length,
        content: volid.includes(":iso/") ? "iso" : "images",
        format: volid.endsWith(".iso") ? "iso" : "raw",
        ...(ctime === undefined ? {} : { ctime }),
      };
    });
  }

  // ---------------------------------------------------------------- tasks (F16)

  private taskMs(type: TaskType): number {
    return this.options.taskMs?.[type] ?? this.options.defaultTaskMs;
  }

  private startTask(
    caller: Caller,
    type: TaskType,
    id: string,
    body: (log: (line: string) => void) => Promise<void>,
    /** What PVE undoes when the task fails, injected failures included (a failed clone's VM). */
    onFailure?: () => void,
  ): string {
    const pid = this.nextPid++;
    const starttime = Math.floor(Date.now() / 1000);
    const upid = `UPID:${this.node}:${hex(pid, 8)}:${hex(this.pstart + pid, 8)}:${hex(starttime, 8)}:${type}:${id}:${caller.tokenId}:`;
    const task: SimTask = {
      upid,
      node: this.node,
      type,
      id,
      user: caller.user,
      tokenid: caller.tokenName,
      starttime,
      pid,
      pstart: this.pstart + pid,
      status: "running",
      log: [],
      done: Promise.resolve(),
    };
    const log = (line: string) => task.log.push(line);
    const run = (async () => {
      await sleep(0);
      try {
        const injected = this.options.failTask?.(type, id);
        if (injected !== undefined) {
          await sleep(this.taskMs(type));
          throw new Error(injected);
        }
        await body(log);
        task.exitstatus = "OK";
        log("TASK OK");
      } catch (error) {
        onFailure?.();
        const message = error instanceof Error ? error.message : String(error);
        task.exitstatus = message;
        log(`TASK ERROR: ${message}`);
      } finally {
        task.status = "stopped";
      }
    })();
    task.done = run;
    this.inFlight.add(run);
    void run.finally(() => this.inFlight.delete(run));
    this.tasks.set(upid, task);
    return upid;
  }

  private taskStatus(upid: string): Record<string, unknown> {
    const task = this.tasks.get(upid);
    if (task === undefined)
      throw new ApiError(400, "Parameter verification failed.", {
        upid: "unable to parse worker upid",
      });
    return {
      upid: task.upid,
      node: task.node,
      pid: task.pid,
      pstart: task.pstart,
      starttime: task.starttime,
      type: task.type,
      id: task.id,
      user: task.user,
      ...(task.tokenid === undefined ? {} : { tokenid: task.tokenid }),
      status: task.status,
      ...(task.status === "stopped" ? { exitstatus: task.exitstatus } : {}),
    };
  }

  /** `[{n,t}]`, default limit 50 lines. */
  private taskLog(upid: string, query: Record<string, string>): unknown[] {
    const task = this.tasks.get(upid);
    if (task === undefined)
      throw new ApiError(400, "Parameter verification failed.", {
        upid: "unable to parse worker upid",
      });
    const start = Number(query.start ?? 0);
    const limit = Number(query.limit ?? 50);
    return task.log.slice(start, start + limit).map((t, index) => ({ n: start + index + 1, t }));
  }
}

// ------------------------------------------------------------------ helpers

export function defaultToken(): TokenSpec {
  return {
    id: "automation@pve!egress",
    secret: "5e1c7a52-1d7c-4f0e-9f43-6a5b2c4d8e90",
    privileges: "all",
  };
}

/** The least-privilege set docs/proxmox.md recommends (PVE 9), granted everywhere. */
export const PVE9_PROXY_PRIVILEGES = [
  "VM.Clone",
  "VM.Allocate",
  "VM.Audit",
  "VM.PowerMgmt",
  "VM.Config.CPU",
  "VM.Config.Memory",
  "VM.Config.Network",
  "VM.Config.Options",
  "VM.Config.CDROM",
  "VM.Config.Disk",
  "VM.GuestAgent.Audit",
  "Datastore.AllocateSpace",
  "Datastore.AllocateTemplate",
  "Datastore.Allocate",
  "Datastore.Audit",
  "SDN.Use",
];

/** F9: lowercase, `;`-separated, pattern-checked; returned sorted. */
function normalizeTags(value: string): string {
  const tags = value
    .split(";")
    .filter((tag) => tag !== "")
    .map((tag) => tag.toLowerCase());
  for (const tag of tags)
    if (!TAG_PATTERN.test(tag))
      throw new ApiError(400, "Parameter verification failed.", {
        tags: "invalid format - invalid characters in tag",
      });
  return [...new Set(tags)].sort().join(";");
}

function newMac(): string {
  const bytes = randomBytes(3);
  return `BC:24:11:${[...bytes].map((b) => b.toString(16).padStart(2, "0").toUpperCase()).join(":")}`;
}

function unitBytes(unit: string): number {
  return { "": 1, K: 1024, M: 1024 ** 2, G: 1024 ** 3, T: 1024 ** 4 }[unit] ?? 1;
}

function diskBytes(spec: string | undefined): number {
  const match = /size=(\d+(?:\.\d+)?)([KMGT])?/.exec(spec ?? "");
  return match === null ? 0 : Number(match[1]) * unitBytes(match[2] ?? "");
}

function formatSize(bytes: number): string {
  for (const unit of ["T", "G", "M", "K"] as const)
    if (bytes % unitBytes(unit) === 0) return `${bytes / unitBytes(unit)}${unit}`;
  return String(bytes);
}

function digestOf(config: Record<string, string>): string {
  return createHash("sha1").update(JSON.stringify(config)).digest("hex");
}

function hex(value: number, width: number): string {
  return value.toString(16).toUpperCase().padStart(width, "0");
}

function pick<T>(items: T[]): T {
  return items[Math.floor(Math.random() * items.length)];
}

/** True when `promise` did not settle within `ms`; the timer never outlives the wait. */
function timesOut(promise: Promise<unknown>, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(true), ms);
    void promise.then(() => {
      clearTimeout(timer);
      resolve(false);
    });
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

function send(res: ServerResponse, status: number, reason: string, body: unknown): void {
  const text = body === undefined ? "" : JSON.stringify(body);
  // Reason phrases must be a single line of visible characters.
  res.statusMessage = reason.replace(/[\r\n]+/g, " ").replace(/[^\x20-\x7e]/g, "?");
  res.writeHead(status, {
    "content-type": "application/json;charset=UTF-8",
    "content-length": Buffer.byteLength(text),
  });
  res.end(text);
}
