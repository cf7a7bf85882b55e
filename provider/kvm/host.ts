/**
 * The libvirt operations KvmProxy needs, as one host sees them: each call
 * bounded by the operation's deadline, each failure classified in
 * classify.ts, and the answers that mean "nothing there" turned into
 * `undefined` so callers read as plain stories. How a call is made:
 * host-rpc.ts; pools and volumes: host-storage.ts; domains, networks and
 * host facts: here.
 */
import { PermanentError } from "../common/errors";
import type { MarkReading } from "../common/mark";
import { MARK_XML_NAMESPACE } from "../common/mark";
import {
  DomainState,
  DomainStatsTypes,
  ErrorCode,
  InterfaceAddressSource,
  IpAddressType,
  ListAllDomainsFlags,
  MetadataType,
  Procedures,
  UndefineFlags,
  type DomainHandle,
  type NetworkHandle,
  type StoragePoolHandle,
} from "../libvirt-rpc-xdr";
import type { AddressSource, ReportedInterface } from "./addresses";
import { parseMarkElementXml } from "./domain-xml";
import {
  sharedDomainListing,
  uuidKey,
  type DomainListing,
  type ListedDomain,
} from "./host-listings";
import { isLibvirtCode } from "./host-rpc";
import { HostStorage } from "./host-storage";

/** virDomainXMLFlags: the persistent configuration rather than the live one. */
const DOMAIN_XML_INACTIVE = 2;

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

/** A libvirtUuid from state as its 16 bytes; one that is not a UUID was not written by us. */
export function uuidBytesOf(uuid: string): Buffer {
  const bytes = Buffer.from(uuid.replace(/-/g, ""), "hex");
  if (bytes.length !== 16)
    throw new PermanentError(
      `libvirtUuid ${JSON.stringify(uuid)} is not a UUID; this state was not written by KvmProxy`,
    );
  return bytes;
}

const SOURCE_NUMBER: Record<AddressSource, number> = {
  agent: InterfaceAddressSource.AGENT,
  lease: InterfaceAddressSource.LEASE,
  arp: InterfaceAddressSource.ARP,
};

export class LibvirtHost extends HostStorage {
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

  // ---- domains ------------------------------------------------------------------------------------

  findDomain(name: string): Promise<DomainHandle | undefined> {
    return this.orUndefined(() =>
      this.rpc(Procedures.domainLookupByName, { name }, `domain ${name}`),
    );
  }

  /** By libvirt UUID: a domain renamed by hand is still found. */
  findDomainByUuid(uuid: string): Promise<DomainHandle | undefined> {
    const bytes = uuidBytesOf(uuid);
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

  /**
   * The persistent definition, or undefined when the domain is gone: a domain
   * a shared listing still names may have been undefined since it was asked.
   */
  definedXmlIfAny(dom: DomainHandle): Promise<string | undefined> {
    return this.orUndefined(() => this.definedXml(dom));
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

  /**
   * One qemu-guest-agent command through libvirt's passthrough, its `return`
   * value. The agent gets at most `timeoutSeconds` to answer (libvirt waits
   * that long, then fails the call); an error the agent itself answers is
   * permanent for this command.
   */
  async agentCommand(
    dom: DomainHandle,
    execute: string,
    args: Record<string, unknown>,
    timeoutSeconds: number,
  ): Promise<unknown> {
    const result = await this.rpc(
      Procedures.qemuDomainAgentCommand,
      { dom, cmd: JSON.stringify({ execute, arguments: args }), timeout: timeoutSeconds, flags: 0 },
      `domain ${dom.name}`,
    );
    const answer = JSON.parse(result ?? "{}") as { return?: unknown; error?: { desc?: unknown } };
    if (answer.error !== undefined || !("return" in answer))
      throw new PermanentError(
        `guest agent ${execute} in domain ${dom.name} on ${this.label}: ${String(answer.error?.desc ?? "no answer")}`,
      );
    return answer.return;
  }

  /**
   * Every domain of the host with its state and autostart, from the shared
   * listing (host-listings.ts) when this host shares them: one answer for
   * all the Reads of a refresh instead of a look-up, a state and an
   * autostart per member.
   */
  domainListing(): Promise<DomainListing> {
    return this.sharedOrOwn(sharedDomainListing, () => this.listDomainsWithState());
  }

  /**
   * Two calls for every domain: the STATE statistics (name, UUID, id, state)
   * and the autostarted ones. Asked together; a domain defined between the
   * two answers is simply not autostarted yet.
   */
  private async listDomainsWithState(): Promise<DomainListing> {
    const [records, autostarted] = await Promise.all([
      this.rpc(
        Procedures.connectGetAllDomainStats,
        { doms: [], stats: DomainStatsTypes.STATE, flags: 0 },
        "domains",
      ),
      this.rpc(
        Procedures.connectListAllDomains,
        { needResults: 1, flags: ListAllDomainsFlags.AUTOSTART },
        "autostarted domains",
      ),
    ]);
    const autostarting = new Set(autostarted.domains.map((dom) => uuidKey(dom.uuid)));
    const byUuid = new Map<string, ListedDomain>();
    const byName = new Map<string, ListedDomain>();
    for (const { dom, params } of records) {
      const state = params.find((param) => param.field === "state.state")?.value.value;
      const listed: ListedDomain = {
        handle: dom,
        state: typeof state === "number" ? state : undefined,
        autostart: autostarting.has(uuidKey(dom.uuid)),
      };
      byUuid.set(uuidKey(dom.uuid), listed);
      byName.set(dom.name, listed);
    }
    return { byUuid, byName };
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
