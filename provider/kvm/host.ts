/**
 * The libvirt operations KvmProxy needs, as one host sees them: each call
 * bounded by the operation's deadline, each failure classified in
 * classify.ts, and the answers that mean "nothing there" turned into
 * `undefined` so callers read as plain stories.
 */
import type { Readable } from "node:stream";
import type { Deadline } from "../common/deadline";
import { isNotFound, isTransient, PermanentError } from "../common/errors";
import type { MarkReading } from "../common/mark";
import { MARK_XML_NAMESPACE } from "../common/mark";
import {
  DomainState,
  ErrorCode,
  InterfaceAddressSource,
  IpAddressType,
  LibvirtError,
  MetadataType,
  Procedures,
  UndefineFlags,
  type DomainHandle,
  type NetworkHandle,
  type LibvirtConnection,
  type Procedure,
  type StoragePoolHandle,
  type StorageVolHandle,
  type StorageVolInfo,
} from "../libvirt-rpc-xdr";
import type { AddressSource, ReportedInterface } from "./addresses";
import { classifyLibvirtError } from "./classify";
import { parseMarkElementXml } from "./domain-xml";
import { parseVolumeXml, type VolumeDescription } from "./volume-xml";

/** virDomainXMLFlags: the persistent configuration rather than the live one. */
const DOMAIN_XML_INACTIVE = 2;

/** Longest any single call may take inside an operation's deadline. */
const PER_CALL_CAP_MS = 120_000;

export type VmState =
  "running" | "paused" | "suspended" | "stopped" | "shutting-down" | "crashed" | "unknown";

/** libvirt's states as people read them. Paused and suspended are never "stopped". */
export function describeState(state: number): VmState {
  switch (state) {
    case DomainState.RUNNING:
    case DomainState.BLOCKED:
      return "running";
    case DomainState.PAUSED:
      return "paused";
    case DomainState.PMSUSPENDED:
      return "suspended";
    case DomainState.SHUTDOWN:
      return "shutting-down";
    case DomainState.SHUTOFF:
      return "stopped";
    case DomainState.CRASHED:
      return "crashed";
    default:
      return "unknown";
  }
}

const SOURCE_NUMBER: Record<AddressSource, number> = {
  agent: InterfaceAddressSource.AGENT,
  lease: InterfaceAddressSource.LEASE,
  arp: InterfaceAddressSource.ARP,
};

const isLibvirtCode = (error: unknown, ...codes: number[]): boolean =>
  error instanceof LibvirtError && codes.includes(error.code);

export class LibvirtHost {
  constructor(
    /**
     * The host's shared link, asked for on every call: a create lasts minutes,
     * and the pool may close an idle link or replace a dead one meanwhile.
     */
    private readonly link: () => Promise<LibvirtConnection>,
    /** How the host appears in messages, e.g. "kvm1.lan". */
    readonly label: string,
    private readonly deadline: Deadline,
  ) {}

  /**
   * Stays the same object while the current link lasts (one daemon process,
   * one login): what is learnt about the host can be remembered against it.
   */
  linkIdentity(): Promise<object> {
    return this.link();
  }

  /** One call on the current link, bounded by the operation's deadline. */
  private async call<Args, Ret>(procedure: Procedure<Args, Ret>, args: Args): Promise<Ret> {
    const connection = await this.link();
    return connection.call(procedure, args, { timeoutMs: this.deadline.capped(PER_CALL_CAP_MS) });
  }

  private async rpc<Args, Ret>(
    procedure: Procedure<Args, Ret>,
    args: Args,
    resource: string,
  ): Promise<Ret> {
    this.deadline.check(`libvirt ${procedure.name} on ${this.label}`);
    try {
      return await this.call(procedure, args);
    } catch (error) {
      throw this.classify(error, procedure.name, resource);
    }
  }

  private classify(error: unknown, operation: string, resource: string) {
    return classifyLibvirtError(error, { operation, resource: `${resource} on ${this.label}` });
  }

  /** Runs `call`, mapping NotFound to undefined. */
  private async orUndefined<T>(call: () => Promise<T>): Promise<T | undefined> {
    try {
      return await call();
    } catch (error) {
      if (isNotFound(error)) return undefined;
      throw error;
    }
  }

  // ---- storage ------------------------------------------------------------------------------------

  /** The pool, or undefined when the host has no pool of that name. */
  async findPool(name: string): Promise<StoragePoolHandle | undefined> {
    try {
      return await this.call(Procedures.storagePoolLookupByName, { name });
    } catch (error) {
      if (isLibvirtCode(error, ErrorCode.NO_STORAGE_POOL)) return undefined;
      throw this.classify(error, "storagePoolLookupByName", `pool ${name}`);
    }
  }

  async pool(name: string): Promise<StoragePoolHandle> {
    const pool = await this.findPool(name);
    if (pool === undefined)
      throw new PermanentError(
        `storage pool ${JSON.stringify(name)} does not exist on ${this.label}; create it (virsh pool-define-as ${name} dir --target /var/lib/libvirt/images; virsh pool-build ${name}; virsh pool-start ${name}; virsh pool-autostart ${name}, or egress-proxies doctor --fix for the pool default) or set pool`,
      );
    return pool;
  }

  /** The pool's size and free space as libvirt last measured them (`virsh pool-info`). */
  async poolSpace(pool: StoragePoolHandle): Promise<{ capacity: bigint; available: bigint }> {
    const info = await this.rpc(Procedures.storagePoolGetInfo, { pool }, `pool ${pool.name}`);
    return { capacity: BigInt(info.capacity), available: BigInt(info.available) };
  }

  findVolume(pool: StoragePoolHandle, name: string): Promise<StorageVolHandle | undefined> {
    return this.orUndefined(() =>
      this.rpc(Procedures.storageVolLookupByName, { pool, name }, `volume ${name}`),
    );
  }

  volumeInfo(vol: StorageVolHandle): Promise<StorageVolInfo> {
    return this.rpc(Procedures.storageVolGetInfo, { vol }, `volume ${vol.name}`);
  }

  volumePath(vol: StorageVolHandle): Promise<string> {
    return this.rpc(Procedures.storageVolGetPath, { vol }, `volume ${vol.name}`);
  }

  /** Capacity and path in one call (the volume's XML). */
  async volumeDescription(vol: StorageVolHandle): Promise<VolumeDescription> {
    const xml = await this.rpc(
      Procedures.storageVolGetXmlDesc,
      { vol, flags: 0 },
      `volume ${vol.name}`,
    );
    try {
      return parseVolumeXml(xml);
    } catch (error) {
      throw new PermanentError(`volume ${vol.name} on ${this.label}: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }

  /**
   * A volume's handle and description by pool and name, in one call instead
   * of a look-up and then GET_XML_DESC: libvirt finds a volume by its pool's
   * and its own name (the handle's key is not consulted), and answers
   * NO_STORAGE_VOL when there is none: undefined here.
   */
  async describeVolumeNamed(
    pool: StoragePoolHandle,
    name: string,
  ): Promise<{ volume: StorageVolHandle; description: VolumeDescription } | undefined> {
    const description = await this.orUndefined(() =>
      this.volumeDescription({ pool: pool.name, name, key: "" }),
    );
    if (description === undefined) return undefined;
    return { volume: { pool: pool.name, name, key: description.key }, description };
  }

  createVolume(pool: StoragePoolHandle, name: string, xml: string): Promise<StorageVolHandle> {
    return this.rpc(Procedures.storageVolCreateXml, { pool, xml, flags: 0 }, `volume ${name}`);
  }

  /**
   * Creates the volume, or returns undefined when one of that name exists:
   * one call where a look-up and a create were two.
   */
  async createVolumeIfAbsent(
    pool: StoragePoolHandle,
    name: string,
    xml: string,
  ): Promise<StorageVolHandle | undefined> {
    this.deadline.check(`libvirt storageVolCreateXml on ${this.label}`);
    try {
      return await this.call(Procedures.storageVolCreateXml, { pool, xml, flags: 0 });
    } catch (error) {
      if (isLibvirtCode(error, ErrorCode.STORAGE_VOL_EXIST)) return undefined;
      throw this.classify(error, "storageVolCreateXml", `volume ${name}`);
    }
  }

  /** Deleting what is already gone is fine: delete is idempotent. */
  async deleteVolume(vol: StorageVolHandle): Promise<void> {
    await this.orUndefined(() =>
      this.rpc(Procedures.storageVolDelete, { vol, flags: 0 }, `volume ${vol.name}`),
    );
  }

  async deleteVolumeNamed(pool: StoragePoolHandle, name: string): Promise<boolean> {
    const vol = await this.findVolume(pool, name);
    if (vol === undefined) return false;
    await this.deleteVolume(vol);
    return true;
  }

  async upload(vol: StorageVolHandle, source: Readable, length?: number): Promise<number> {
    this.deadline.check(`upload to ${vol.name} on ${this.label}`);
    try {
      const connection = await this.link();
      const { bytes } = await connection.upload({ vol, offset: 0, length: length ?? 0 }, source, {
        timeoutMs: this.deadline.remainingMs(),
      });
      return bytes;
    } catch (error) {
      throw this.classify(error, "storageVolUpload", `volume ${vol.name}`);
    }
  }

  /**
   * Makes libvirt re-read the pool (after an upload: the qcow2 virtual size).
   * libvirt refreshes in the background after an upload and refuses a second
   * refresh meanwhile ("asynchronous jobs running"), so that one is retried
   * (unless `once`: then that failure is thrown at once).
   */
  async refreshPool(pool: StoragePoolHandle, { once = false } = {}): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        await this.rpc(Procedures.storagePoolRefresh, { pool, flags: 0 }, `pool ${pool.name}`);
        return;
      } catch (error) {
        if (once || !isTransient(error) || this.deadline.remainingMs() < 1000) throw error;
        await new Promise((resolve) => setTimeout(resolve, Math.min(250 * attempt, 2000)));
      }
    }
  }

  /** Defines, builds (makes the directory), starts and autostarts a pool. */
  async definePool(name: string, xml: string): Promise<StoragePoolHandle> {
    const resource = `pool ${name}`;
    const pool = await this.rpc(Procedures.storagePoolDefineXml, { xml, flags: 0 }, resource);
    await this.rpc(Procedures.storagePoolBuild, { pool, flags: 0 }, resource);
    await this.startPool(pool);
    return pool;
  }

  /** Starts (unless it runs) and autostarts a pool. */
  async startPool(pool: StoragePoolHandle): Promise<void> {
    const resource = `pool ${pool.name}`;
    if (!(await this.rpc(Procedures.storagePoolIsActive, { pool }, resource)))
      await this.rpc(Procedures.storagePoolCreate, { pool, flags: 0 }, resource);
    await this.rpc(Procedures.storagePoolSetAutostart, { pool, autostart: 1 }, resource);
  }

  // ---- networks and host facts --------------------------------------------------------------------

  findNetwork(name: string): Promise<NetworkHandle | undefined> {
    return this.lookupOrUndefined(
      () => this.call(Procedures.networkLookupByName, { name }),
      ErrorCode.NO_NETWORK,
      "networkLookupByName",
      `network ${name}`,
    );
  }

  /** Starts (unless it runs) and autostarts a libvirt network. */
  async startNetwork(net: NetworkHandle): Promise<void> {
    const resource = `network ${net.name}`;
    if (!(await this.rpc(Procedures.networkIsActive, { net }, resource)))
      await this.rpc(Procedures.networkCreate, { net }, resource);
    await this.rpc(Procedures.networkSetAutostart, { net, autostart: 1 }, resource);
  }

  /** major·10⁶ + minor·10³ + micro */
  async libVersion(): Promise<number> {
    return Number(await this.rpc(Procedures.connectGetLibVersion, undefined, "libvirt version"));
  }

  /** `virsh domcapabilities --virttype <type> --arch <arch> --machine <machine>`. */
  domainCapabilities(virttype: string, arch: string, machine: string): Promise<string> {
    return this.rpc(
      Procedures.connectGetDomainCapabilities,
      { emulatorbin: null, arch, machine, virttype, flags: 0 },
      `${virttype} domain capabilities`,
    );
  }

  /** The pools `flags` selects, as handles: a pool found here needs no look-up. */
  pools(flags: number): Promise<StoragePoolHandle[]> {
    return this.listAll(Procedures.connectListAllStoragePools, flags, "pools", (r) => r.pools);
  }

  networks(flags: number): Promise<NetworkHandle[]> {
    return this.listAll(Procedures.connectListAllNetworks, flags, "networks", (r) => r.nets);
  }

  /** The host's network interfaces (bridges among them) as libvirt's interface driver sees them. */
  hostInterfaces(flags: number): Promise<Array<{ name: string }>> {
    return this.listAll(Procedures.connectListAllInterfaces, flags, "interfaces", (r) => r.ifaces);
  }

  /** What a `connectListAll*` call returns (`needResults` 1: the objects, not only a count). */
  private async listAll<Ret, T>(
    procedure: Procedure<{ needResults: number; flags: number }, Ret>,
    flags: number,
    resource: string,
    objects: (reply: Ret) => T[],
  ): Promise<T[]> {
    return objects(await this.rpc(procedure, { needResults: 1, flags }, resource));
  }

  private async lookupOrUndefined<T>(
    call: () => Promise<T>,
    goneCode: number,
    operation: string,
    resource: string,
  ): Promise<T | undefined> {
    this.deadline.check(`libvirt ${operation} on ${this.label}`);
    try {
      return await call();
    } catch (error) {
      if (isLibvirtCode(error, goneCode)) return undefined;
      throw this.classify(error, operation, resource);
    }
  }

  // ---- domains ------------------------------------------------------------------------------------

  findDomain(name: string): Promise<DomainHandle | undefined> {
    return this.orUndefined(() =>
      this.rpc(Procedures.domainLookupByName, { name }, `domain ${name}`),
    );
  }

  /** By libvirt UUID: a domain renamed by hand is still found. */
  findDomainByUuid(uuid: string): Promise<DomainHandle | undefined> {
    const bytes = Buffer.from(uuid.replace(/-/g, ""), "hex");
    if (bytes.length !== 16)
      throw new PermanentError(
        `libvirtUuid ${JSON.stringify(uuid)} is not a UUID; this state was not written by KvmProxy`,
      );
    return this.orUndefined(() =>
      this.rpc(Procedures.domainLookupByUuid, { uuid: bytes }, `domain ${uuid}`),
    );
  }

  defineDomain(name: string, xml: string): Promise<DomainHandle> {
    return this.rpc(Procedures.domainDefineXml, { xml }, `domain ${name}`);
  }

  /** Starting a running domain is fine (a retried create). */
  async startDomain(dom: DomainHandle): Promise<void> {
    try {
      await this.call(Procedures.domainCreate, { dom });
    } catch (error) {
      if (
        isLibvirtCode(error, ErrorCode.OPERATION_INVALID) &&
        /already (running|active)/i.test((error as Error).message)
      )
        return;
      throw this.classify(error, "domainCreate", `domain ${dom.name}`);
    }
  }

  async state(dom: DomainHandle): Promise<{ state: VmState; reason: number }> {
    const { state, reason } = await this.rpc(
      Procedures.domainGetState,
      { dom, flags: 0 },
      `domain ${dom.name}`,
    );
    return { state: describeState(state), reason };
  }

  /** Whether libvirtd starts the domain when it starts (host boot). */
  autostart(dom: DomainHandle): Promise<boolean> {
    return this.rpc(Procedures.domainGetAutostart, { dom }, `domain ${dom.name}`);
  }

  async setAutostart(dom: DomainHandle, on: boolean): Promise<void> {
    await this.rpc(
      Procedures.domainSetAutostart,
      { dom, autostart: on ? 1 : 0 },
      `domain ${dom.name}`,
    );
  }

  domainXml(dom: DomainHandle): Promise<string> {
    return this.rpc(Procedures.domainGetXmlDesc, { dom, flags: 0 }, `domain ${dom.name}`);
  }

  /**
   * The persistent definition (VIR_DOMAIN_XML_INACTIVE): what the domain boots
   * with, including changes made with `virsh ... --config` while it runs.
   */
  definedXml(dom: DomainHandle): Promise<string> {
    return this.rpc(
      Procedures.domainGetXmlDesc,
      { dom, flags: DOMAIN_XML_INACTIVE },
      `domain ${dom.name}`,
    );
  }

  /** Our mark on the domain; a domain without the element is "unmarked", not an error. */
  async mark(dom: DomainHandle): Promise<MarkReading> {
    try {
      const xml = await this.call(Procedures.domainGetMetadata, {
        dom,
        type: MetadataType.ELEMENT,
        uri: MARK_XML_NAMESPACE,
        flags: 0,
      });
      return parseMarkElementXml(xml);
    } catch (error) {
      if (isLibvirtCode(error, ErrorCode.NO_DOMAIN_METADATA)) return { kind: "unmarked" };
      throw this.classify(error, "domainGetMetadata", `domain ${dom.name}`);
    }
  }

  /** Asks the guest to power off (ACPI); it may take a while, or never happen. A stopped domain is fine. */
  async shutdownDomain(dom: DomainHandle): Promise<void> {
    try {
      await this.call(Procedures.domainShutdown, { dom });
    } catch (error) {
      if (isLibvirtCode(error, ErrorCode.OPERATION_INVALID)) return;
      throw this.classify(error, "domainShutdown", `domain ${dom.name}`);
    }
  }

  /** Stops the domain hard. A domain that is not running, or gone, is fine. */
  async destroyDomain(dom: DomainHandle): Promise<void> {
    try {
      await this.call(Procedures.domainDestroy, { dom });
    } catch (error) {
      if (isLibvirtCode(error, ErrorCode.OPERATION_INVALID, ErrorCode.NO_DOMAIN)) return;
      throw this.classify(error, "domainDestroy", `domain ${dom.name}`);
    }
  }

  /**
   * Undefines with every flag that removes what a VM leaves behind (managed
   * save, snapshot and checkpoint metadata, UEFI NVRAM); an older host that
   * does not know a flag gets the call again without it.
   */
  async undefineDomain(dom: DomainHandle): Promise<void> {
    const full =
      UndefineFlags.MANAGED_SAVE |
      UndefineFlags.SNAPSHOTS_METADATA |
      UndefineFlags.NVRAM |
      UndefineFlags.CHECKPOINTS_METADATA;
    const fallbacks = [
      full,
      full & ~UndefineFlags.CHECKPOINTS_METADATA,
      UndefineFlags.MANAGED_SAVE | UndefineFlags.SNAPSHOTS_METADATA | UndefineFlags.NVRAM,
    ];
    let lastError: unknown;
    for (const flags of fallbacks) {
      try {
        await this.call(Procedures.domainUndefineFlags, { dom, flags });
        return;
      } catch (error) {
        if (isLibvirtCode(error, ErrorCode.NO_DOMAIN)) return;
        lastError = error;
        if (
          !isLibvirtCode(
            error,
            ErrorCode.INVALID_ARG,
            ErrorCode.ARGUMENT_UNSUPPORTED,
            ErrorCode.NO_SUPPORT,
          )
        )
          break;
      }
    }
    throw this.classify(lastError, "domainUndefineFlags", `domain ${dom.name}`);
  }

  async interfaces(dom: DomainHandle, source: AddressSource): Promise<ReportedInterface[]> {
    const reported = await this.rpc(
      Procedures.domainInterfaceAddresses,
      { dom, source: SOURCE_NUMBER[source], flags: 0 },
      `domain ${dom.name}`,
    );
    return reported.map((iface) => ({
      name: iface.name,
      hwaddr: iface.hwaddr,
      addrs: iface.addrs.map((entry) => ({
        type: entry.type === IpAddressType.IPV6 ? ("ipv6" as const) : ("ipv4" as const),
        addr: entry.addr,
        prefix: entry.prefix,
      })),
    }));
  }

  async listDomains(): Promise<DomainHandle[]> {
    const { domains } = await this.rpc(
      Procedures.connectListAllDomains,
      { needResults: 1, flags: 0 },
      "domains",
    );
    return domains;
  }
}
