/**
 * The libvirt remote protocol's numbers and structs, hand-written from
 * libvirt's `remote_protocol.x`, `virnetprotocol.x` and
 * `virkeepaliveprotocol.x` for the procedures this project uses. Each
 * procedure is a value that knows how to encode its arguments and decode its
 * result, so `client.call(Procedures.domainLookupByName, { name })` is fully
 * typed and nothing here touches a socket.
 */
import type { RemoteErrorFields } from "./errors";
import { XdrReader, XdrWriter } from "./xdr";

export const REMOTE_PROGRAM = 0x20008086;
export const REMOTE_PROTOCOL_VERSION = 1;
export const QEMU_PROGRAM = 0x20008087;
export const QEMU_PROTOCOL_VERSION = 1;
export const KEEPALIVE_PROGRAM = 0x6b656570;
export const KEEPALIVE_PROTOCOL_VERSION = 1;
export const KeepaliveProcedure = { PING: 1, PONG: 2 } as const;

export const MessageType = {
  CALL: 0,
  REPLY: 1,
  MESSAGE: 2,
  STREAM: 3,
  CALL_WITH_FDS: 4,
  REPLY_WITH_FDS: 5,
  STREAM_HOLE: 6,
} as const;
export type MessageType = (typeof MessageType)[keyof typeof MessageType];

export const MessageStatus = { OK: 0, ERROR: 1, CONTINUE: 2 } as const;
export type MessageStatus = (typeof MessageStatus)[keyof typeof MessageStatus];

export const Limits = {
  /** VIR_NET_MESSAGE_MAX on current libvirt (older releases: 16 MiB). */
  messageMax: 32 * 1024 * 1024,
  /** VIR_NET_MESSAGE_LEGACY_PAYLOAD_MAX: the stream chunk libvirt's own client sends. */
  streamChunk: 262120,
  stringMax: 4 * 1024 * 1024,
  domainListMax: 16384,
  /** REMOTE_STORAGE_VOL_LIST_MAX */
  storageVolListMax: 16384,
  authTypeListMax: 20,
  interfacesMax: 2048,
  addressesMax: 2048,
  dhcpLeasesMax: 65536,
  /** REMOTE_STORAGE_POOL_LIST_MAX, REMOTE_NETWORK_LIST_MAX, REMOTE_INTERFACE_LIST_MAX (current libvirt). */
  storagePoolListMax: 16384,
  networkListMax: 16384,
  interfaceListMax: 16384,
} as const;

export const AuthType = { NONE: 0, SASL: 1, POLKIT: 2 } as const;
/** VIR_DRV_FEATURE_PROGRAM_KEEPALIVE: the daemon answers and sends keepalive pings. */
export const FEATURE_PROGRAM_KEEPALIVE = 10;

export const DomainState = {
  NOSTATE: 0,
  RUNNING: 1,
  BLOCKED: 2,
  PAUSED: 3,
  SHUTDOWN: 4,
  SHUTOFF: 5,
  CRASHED: 6,
  PMSUSPENDED: 7,
} as const;
export const MetadataType = { DESCRIPTION: 0, TITLE: 1, ELEMENT: 2 } as const;
export const DomainModificationImpact = { CURRENT: 0, LIVE: 1, CONFIG: 2 } as const;
export const InterfaceAddressSource = { LEASE: 0, AGENT: 1, ARP: 2 } as const;
export const IpAddressType = { IPV4: 0, IPV6: 1 } as const;
export const UndefineFlags = {
  MANAGED_SAVE: 1,
  SNAPSHOTS_METADATA: 2,
  NVRAM: 4,
  KEEP_NVRAM: 8,
  CHECKPOINTS_METADATA: 16,
  TPM: 32,
  KEEP_TPM: 64,
} as const;
export const ListAllDomainsFlags = { ACTIVE: 1, INACTIVE: 2, PERSISTENT: 4, TRANSIENT: 8 } as const;
export const StorageVolStreamFlags = { SPARSE_STREAM: 1 } as const;
/**
 * virConnectListAllStoragePoolsFlags / virConnectListAllNetworksFlags share
 * these low bits; virConnectListAllInterfacesFlags has only INACTIVE and ACTIVE.
 */
export const ListAllFlags = {
  INACTIVE: 1,
  ACTIVE: 2,
  PERSISTENT: 4,
  TRANSIENT: 8,
  AUTOSTART: 16,
  NO_AUTOSTART: 32,
} as const;

// ---- handles -------------------------------------------------------------------------------------

/** remote_nonnull_domain. The qemu driver resolves it by UUID. */
export interface DomainHandle {
  name: string;
  uuid: Buffer;
  id: number;
}
/** remote_nonnull_storage_pool */
export interface StoragePoolHandle {
  name: string;
  uuid: Buffer;
}
/** remote_nonnull_storage_vol, resolved by pool + name. */
export interface StorageVolHandle {
  pool: string;
  name: string;
  key: string;
}
/** remote_nonnull_network */
export interface NetworkHandle {
  name: string;
  uuid: Buffer;
}
/** remote_nonnull_interface: a host interface (bridge, NIC) as libvirt's interface driver lists it. */
export interface InterfaceHandle {
  name: string;
  mac: string;
}

const UUID_LENGTH = 16;

export const xdrTypes = {
  writeDomain(w: XdrWriter, dom: DomainHandle): void {
    w.string(dom.name, Limits.stringMax).fixedOpaque(dom.uuid, UUID_LENGTH).int(dom.id);
  },
  readDomain(r: XdrReader): DomainHandle {
    return { name: r.string(Limits.stringMax), uuid: r.fixedOpaque(UUID_LENGTH), id: r.int() };
  },
  writePool(w: XdrWriter, pool: StoragePoolHandle): void {
    w.string(pool.name, Limits.stringMax).fixedOpaque(pool.uuid, UUID_LENGTH);
  },
  readPool(r: XdrReader): StoragePoolHandle {
    return { name: r.string(Limits.stringMax), uuid: r.fixedOpaque(UUID_LENGTH) };
  },
  writeVol(w: XdrWriter, vol: StorageVolHandle): void {
    w.string(vol.pool, Limits.stringMax)
      .string(vol.name, Limits.stringMax)
      .string(vol.key, Limits.stringMax);
  },
  readVol(r: XdrReader): StorageVolHandle {
    return {
      pool: r.string(Limits.stringMax),
      name: r.string(Limits.stringMax),
      key: r.string(Limits.stringMax),
    };
  },
  writeNetwork(w: XdrWriter, net: NetworkHandle): void {
    w.string(net.name, Limits.stringMax).fixedOpaque(net.uuid, UUID_LENGTH);
  },
  readNetwork(r: XdrReader): NetworkHandle {
    return { name: r.string(Limits.stringMax), uuid: r.fixedOpaque(UUID_LENGTH) };
  },
  readInterface(r: XdrReader): InterfaceHandle {
    return { name: r.string(Limits.stringMax), mac: r.string(Limits.stringMax) };
  },
  writeOptionalString(w: XdrWriter, value: string | null | undefined): void {
    w.optional(value, (inner, s) => inner.string(s, Limits.stringMax));
  },
  readOptionalString(r: XdrReader): string | null {
    return r.optional((inner) => inner.string(Limits.stringMax));
  },
};

/** remote_error: all 11 fields in wire order. */
export function readRemoteError(r: XdrReader): RemoteErrorFields {
  return {
    code: r.int(),
    domain: r.int(),
    message: xdrTypes.readOptionalString(r),
    level: r.int(),
    dom: r.optional(xdrTypes.readDomain),
    str1: xdrTypes.readOptionalString(r),
    str2: xdrTypes.readOptionalString(r),
    str3: xdrTypes.readOptionalString(r),
    int1: r.int(),
    int2: r.int(),
    net: r.optional(xdrTypes.readNetwork),
  };
}

export function writeRemoteError(w: XdrWriter, e: RemoteErrorFields): void {
  w.int(e.code).int(e.domain);
  xdrTypes.writeOptionalString(w, e.message);
  w.int(e.level);
  w.optional(e.dom, xdrTypes.writeDomain);
  xdrTypes.writeOptionalString(w, e.str1);
  xdrTypes.writeOptionalString(w, e.str2);
  xdrTypes.writeOptionalString(w, e.str3);
  w.int(e.int1).int(e.int2);
  w.optional(e.net, xdrTypes.writeNetwork);
}

// ---- procedures ----------------------------------------------------------------------------------

/** How a procedure's body is laid out; `stream` marks procedures followed by a data stream. */
export interface Procedure<Args, Ret> {
  readonly name: string;
  readonly program: number;
  readonly version: number;
  readonly number: number;
  readonly stream?: "upload" | "download";
  encodeArgs(writer: XdrWriter, args: Args): void;
  decodeRet(reader: XdrReader): Ret;
}

type Encoder<Args> = (writer: XdrWriter, args: Args) => void;
type Decoder<Ret> = (reader: XdrReader) => Ret;
const noArgs: Encoder<void> = () => undefined;
const noRet: Decoder<void> = () => undefined;
const stringRet: Decoder<string> = (r) => r.string(Limits.stringMax);

function remote<Args, Ret>(
  name: string,
  number: number,
  encodeArgs: Encoder<Args>,
  decodeRet: Decoder<Ret>,
  stream?: "upload" | "download",
): Procedure<Args, Ret> {
  return {
    name,
    program: REMOTE_PROGRAM,
    version: REMOTE_PROTOCOL_VERSION,
    number,
    encodeArgs,
    decodeRet,
    ...(stream ? { stream } : {}),
  };
}

export interface DomainArgs {
  dom: DomainHandle;
}
export interface DomainFlagsArgs {
  dom: DomainHandle;
  flags: number;
}
export interface PoolFlagsArgs {
  pool: StoragePoolHandle;
  flags: number;
}
export interface VolArgs {
  vol: StorageVolHandle;
}
export interface VolStreamArgs {
  vol: StorageVolHandle;
  offset: bigint | number;
  /** 0 means "to the end". */
  length: bigint | number;
  flags: number;
}
export interface StoragePoolInfo {
  /** virStoragePoolState (unsigned char on the wire, 4 bytes). */
  state: number;
  capacity: bigint;
  allocation: bigint;
  available: bigint;
}
export interface StorageVolInfo {
  /** virStorageVolType (char on the wire, 4 bytes). */
  type: number;
  capacity: bigint;
  allocation: bigint;
}
export interface DomainInterface {
  name: string;
  hwaddr: string | null;
  addrs: { type: number; addr: string; prefix: number }[];
}
export interface DhcpLease {
  iface: string;
  expirytime: bigint;
  type: number;
  mac: string | null;
  iaid: string | null;
  ipaddr: string;
  prefix: number;
  hostname: string | null;
  clientid: string | null;
}

const writeDomainArgs: Encoder<DomainArgs> = (w, a) => xdrTypes.writeDomain(w, a.dom);
const writeDomainFlagsArgs: Encoder<DomainFlagsArgs> = (w, a) => {
  xdrTypes.writeDomain(w, a.dom);
  w.uint(a.flags);
};
const readDomainRet: Decoder<DomainHandle> = (r) => xdrTypes.readDomain(r);
const writePoolArgs: Encoder<{ pool: StoragePoolHandle }> = (w, a) => xdrTypes.writePool(w, a.pool);
const writePoolFlagsArgs: Encoder<PoolFlagsArgs> = (w, a) => {
  xdrTypes.writePool(w, a.pool);
  w.uint(a.flags);
};
const writeNetworkArgs: Encoder<{ net: NetworkHandle }> = (w, a) => xdrTypes.writeNetwork(w, a.net);
/** The `int active` / `int autostart` replies of the *_IS_ACTIVE and *_GET_AUTOSTART procedures. */
const flagRet: Decoder<boolean> = (r) => r.int() !== 0;
/** need_results + flags, as every CONNECT_LIST_ALL_* call takes them. */
const writeListAllArgs: Encoder<{ flags: number }> = (w, a) => w.int(1).uint(a.flags);
const writeVolStreamArgs: Encoder<VolStreamArgs> = (w, a) => {
  xdrTypes.writeVol(w, a.vol);
  w.uhyper(a.offset).uhyper(a.length).uint(a.flags);
};

export const Procedures = {
  connectOpen: remote<{ name: string | null; flags: number }, void>(
    "connectOpen",
    1,
    (w, a) => {
      xdrTypes.writeOptionalString(w, a.name);
      w.uint(a.flags);
    },
    noRet,
  ),
  connectClose: remote<void, void>("connectClose", 2, noArgs, noRet),
  connectGetCapabilities: remote<void, string>("connectGetCapabilities", 7, noArgs, stringRet),
  domainCreate: remote<DomainArgs, void>("domainCreate", 9, writeDomainArgs, noRet),
  domainDefineXml: remote<{ xml: string }, DomainHandle>(
    "domainDefineXml",
    11,
    (w, a) => w.string(a.xml, Limits.stringMax),
    readDomainRet,
  ),
  domainDestroy: remote<DomainArgs, void>("domainDestroy", 12, writeDomainArgs, noRet),
  domainGetXmlDesc: remote<DomainFlagsArgs, string>(
    "domainGetXmlDesc",
    14,
    writeDomainFlagsArgs,
    stringRet,
  ),
  domainLookupByName: remote<{ name: string }, DomainHandle>(
    "domainLookupByName",
    23,
    (w, a) => w.string(a.name, Limits.stringMax),
    readDomainRet,
  ),
  domainLookupByUuid: remote<{ uuid: Buffer }, DomainHandle>(
    "domainLookupByUuid",
    24,
    (w, a) => w.fixedOpaque(a.uuid, UUID_LENGTH),
    readDomainRet,
  ),
  domainShutdown: remote<DomainArgs, void>("domainShutdown", 33, writeDomainArgs, noRet),
  domainUndefine: remote<DomainArgs, void>("domainUndefine", 35, writeDomainArgs, noRet),
  networkCreate: remote<{ net: NetworkHandle }, void>("networkCreate", 39, writeNetworkArgs, noRet),
  networkGetXmlDesc: remote<{ net: NetworkHandle; flags: number }, string>(
    "networkGetXmlDesc",
    43,
    (w, a) => {
      xdrTypes.writeNetwork(w, a.net);
      w.uint(a.flags);
    },
    stringRet,
  ),
  networkGetAutostart: remote<{ net: NetworkHandle }, boolean>(
    "networkGetAutostart",
    44,
    writeNetworkArgs,
    flagRet,
  ),
  // 46 in remote_protocol.x (40 is NETWORK_CREATE_XML, 41 NETWORK_DEFINE_XML); checked against libvirtd 9.0.
  networkLookupByName: remote<{ name: string }, NetworkHandle>(
    "networkLookupByName",
    46,
    (w, a) => w.string(a.name, Limits.stringMax),
    (r) => xdrTypes.readNetwork(r),
  ),
  networkSetAutostart: remote<{ net: NetworkHandle; autostart: boolean }, void>(
    "networkSetAutostart",
    48,
    (w, a) => {
      xdrTypes.writeNetwork(w, a.net);
      w.int(a.autostart ? 1 : 0);
    },
    noRet,
  ),
  connectGetHostname: remote<void, string>("connectGetHostname", 59, noArgs, stringRet),
  connectSupportsFeature: remote<{ feature: number }, boolean>(
    "connectSupportsFeature",
    60,
    (w, a) => w.int(a.feature),
    (r) => r.int() !== 0,
  ),
  authList: remote<void, number[]>("authList", 66, noArgs, (r) =>
    r.array(Limits.authTypeListMax, (inner) => inner.int()),
  ),
  authPolkit: remote<void, boolean>("authPolkit", 70, noArgs, (r) => r.int() !== 0),
  storagePoolDefineXml: remote<{ xml: string; flags: number }, StoragePoolHandle>(
    "storagePoolDefineXml",
    77,
    (w, a) => w.string(a.xml, Limits.stringMax).uint(a.flags),
    (r) => xdrTypes.readPool(r),
  ),
  storagePoolCreate: remote<PoolFlagsArgs, void>(
    "storagePoolCreate",
    78,
    writePoolFlagsArgs,
    noRet,
  ),
  storagePoolBuild: remote<PoolFlagsArgs, void>("storagePoolBuild", 79, writePoolFlagsArgs, noRet),
  storagePoolRefresh: remote<PoolFlagsArgs, void>(
    "storagePoolRefresh",
    83,
    writePoolFlagsArgs,
    noRet,
  ),
  storagePoolLookupByName: remote<{ name: string }, StoragePoolHandle>(
    "storagePoolLookupByName",
    84,
    (w, a) => w.string(a.name, Limits.stringMax),
    (r) => xdrTypes.readPool(r),
  ),
  storagePoolGetInfo: remote<{ pool: StoragePoolHandle }, StoragePoolInfo>(
    "storagePoolGetInfo",
    87,
    (w, a) => xdrTypes.writePool(w, a.pool),
    (r) => ({
      state: r.uint(),
      capacity: r.uhyper(),
      allocation: r.uhyper(),
      available: r.uhyper(),
    }),
  ),
  storagePoolGetAutostart: remote<{ pool: StoragePoolHandle }, boolean>(
    "storagePoolGetAutostart",
    89,
    writePoolArgs,
    flagRet,
  ),
  storagePoolSetAutostart: remote<{ pool: StoragePoolHandle; autostart: boolean }, void>(
    "storagePoolSetAutostart",
    90,
    (w, a) => {
      xdrTypes.writePool(w, a.pool);
      w.int(a.autostart ? 1 : 0);
    },
    noRet,
  ),
  storageVolCreateXml: remote<
    { pool: StoragePoolHandle; xml: string; flags: number },
    StorageVolHandle
  >(
    "storageVolCreateXml",
    93,
    (w, a) => {
      xdrTypes.writePool(w, a.pool);
      w.string(a.xml, Limits.stringMax).uint(a.flags);
    },
    (r) => xdrTypes.readVol(r),
  ),
  storageVolDelete: remote<{ vol: StorageVolHandle; flags: number }, void>(
    "storageVolDelete",
    94,
    (w, a) => {
      xdrTypes.writeVol(w, a.vol);
      w.uint(a.flags);
    },
    noRet,
  ),
  storageVolLookupByName: remote<{ pool: StoragePoolHandle; name: string }, StorageVolHandle>(
    "storageVolLookupByName",
    95,
    (w, a) => {
      xdrTypes.writePool(w, a.pool);
      w.string(a.name, Limits.stringMax);
    },
    (r) => xdrTypes.readVol(r),
  ),
  storageVolGetInfo: remote<VolArgs, StorageVolInfo>(
    "storageVolGetInfo",
    98,
    (w, a) => xdrTypes.writeVol(w, a.vol),
    (r) => ({ type: r.int(), capacity: r.uhyper(), allocation: r.uhyper() }),
  ),
  storageVolGetXmlDesc: remote<{ vol: StorageVolHandle; flags: number }, string>(
    "storageVolGetXmlDesc",
    99,
    (w, a) => {
      xdrTypes.writeVol(w, a.vol);
      w.uint(a.flags);
    },
    stringRet,
  ),
  storageVolGetPath: remote<VolArgs, string>(
    "storageVolGetPath",
    100,
    (w, a) => xdrTypes.writeVol(w, a.vol),
    stringRet,
  ),
  networkIsActive: remote<{ net: NetworkHandle }, boolean>(
    "networkIsActive",
    152,
    writeNetworkArgs,
    flagRet,
  ),
  storagePoolIsActive: remote<{ pool: StoragePoolHandle }, boolean>(
    "storagePoolIsActive",
    154,
    writePoolArgs,
    flagRet,
  ),
  connectGetLibVersion: remote<void, bigint>("connectGetLibVersion", 157, noArgs, (r) =>
    r.uhyper(),
  ),
  domainCreateWithFlags: remote<DomainFlagsArgs, DomainHandle>(
    "domainCreateWithFlags",
    196,
    writeDomainFlagsArgs,
    readDomainRet,
  ),
  storageVolUpload: remote<VolStreamArgs, void>(
    "storageVolUpload",
    208,
    writeVolStreamArgs,
    noRet,
    "upload",
  ),
  storageVolDownload: remote<VolStreamArgs, void>(
    "storageVolDownload",
    209,
    writeVolStreamArgs,
    noRet,
    "download",
  ),
  domainGetState: remote<DomainFlagsArgs, { state: number; reason: number }>(
    "domainGetState",
    212,
    writeDomainFlagsArgs,
    (r) => ({ state: r.int(), reason: r.int() }),
  ),
  domainUndefineFlags: remote<DomainFlagsArgs, void>(
    "domainUndefineFlags",
    231,
    writeDomainFlagsArgs,
    noRet,
  ),
  domainDestroyFlags: remote<DomainFlagsArgs, void>(
    "domainDestroyFlags",
    234,
    writeDomainFlagsArgs,
    noRet,
  ),
  domainShutdownFlags: remote<DomainFlagsArgs, void>(
    "domainShutdownFlags",
    258,
    writeDomainFlagsArgs,
    noRet,
  ),
  storageVolResize: remote<
    { vol: StorageVolHandle; capacity: bigint | number; flags: number },
    void
  >(
    "storageVolResize",
    260,
    (w, a) => {
      xdrTypes.writeVol(w, a.vol);
      w.uhyper(a.capacity).uint(a.flags);
    },
    noRet,
  ),
  domainSetMetadata: remote<
    {
      dom: DomainHandle;
      type: number;
      metadata: string | null;
      key: string | null;
      uri: string | null;
      flags: number;
    },
    void
  >(
    "domainSetMetadata",
    264,
    (w, a) => {
      xdrTypes.writeDomain(w, a.dom);
      w.int(a.type);
      xdrTypes.writeOptionalString(w, a.metadata);
      xdrTypes.writeOptionalString(w, a.key);
      xdrTypes.writeOptionalString(w, a.uri);
      w.uint(a.flags);
    },
    noRet,
  ),
  domainGetMetadata: remote<
    { dom: DomainHandle; type: number; uri: string | null; flags: number },
    string
  >(
    "domainGetMetadata",
    265,
    (w, a) => {
      xdrTypes.writeDomain(w, a.dom);
      w.int(a.type);
      xdrTypes.writeOptionalString(w, a.uri);
      w.uint(a.flags);
    },
    stringRet,
  ),
  connectListAllDomains: remote<
    { needResults: number; flags: number },
    { domains: DomainHandle[]; ret: number }
  >(
    "connectListAllDomains",
    273,
    (w, a) => w.int(a.needResults).uint(a.flags),
    (r) => ({ domains: r.array(Limits.domainListMax, xdrTypes.readDomain), ret: r.uint() }),
  ),
  // 282, checked against libvirtd 9.0 (281 is CONNECT_LIST_ALL_STORAGE_POOLS).
  storagePoolListAllVolumes: remote<
    { pool: StoragePoolHandle; needResults: number; flags: number },
    { vols: StorageVolHandle[]; ret: number }
  >(
    "storagePoolListAllVolumes",
    282,
    (w, a) => {
      xdrTypes.writePool(w, a.pool);
      // Like connectListAllDomains: 0 asks only for the count.
      w.int(a.needResults).uint(a.flags);
    },
    (r) => ({ vols: r.array(Limits.storageVolListMax, xdrTypes.readVol), ret: r.uint() }),
  ),
  connectListAllStoragePools: remote<{ flags: number }, StoragePoolHandle[]>(
    "connectListAllStoragePools",
    281,
    writeListAllArgs,
    (r) => {
      const pools = r.array(Limits.storagePoolListMax, xdrTypes.readPool);
      r.uint();
      return pools;
    },
  ),
  connectListAllNetworks: remote<{ flags: number }, NetworkHandle[]>(
    "connectListAllNetworks",
    283,
    writeListAllArgs,
    (r) => {
      const nets = r.array(Limits.networkListMax, xdrTypes.readNetwork);
      r.uint();
      return nets;
    },
  ),
  connectListAllInterfaces: remote<{ flags: number }, InterfaceHandle[]>(
    "connectListAllInterfaces",
    284,
    writeListAllArgs,
    (r) => {
      const ifaces = r.array(Limits.interfaceListMax, xdrTypes.readInterface);
      r.uint();
      return ifaces;
    },
  ),
  domainGetHostname: remote<DomainFlagsArgs, string>(
    "domainGetHostname",
    277,
    writeDomainFlagsArgs,
    stringRet,
  ),
  networkGetDhcpLeases: remote<
    { net: NetworkHandle; mac: string | null; needResults: number; flags: number },
    { leases: DhcpLease[]; ret: number }
  >(
    "networkGetDhcpLeases",
    341,
    (w, a) => {
      xdrTypes.writeNetwork(w, a.net);
      xdrTypes.writeOptionalString(w, a.mac);
      // Like connectListAllDomains: 0 asks only for the count.
      w.int(a.needResults).uint(a.flags);
    },
    (r) => ({
      leases: r.array(Limits.dhcpLeasesMax, (l) => ({
        iface: l.string(Limits.stringMax),
        expirytime: l.hyper(),
        type: l.int(),
        mac: xdrTypes.readOptionalString(l),
        iaid: xdrTypes.readOptionalString(l),
        ipaddr: l.string(Limits.stringMax),
        prefix: l.uint(),
        hostname: xdrTypes.readOptionalString(l),
        clientid: xdrTypes.readOptionalString(l),
      })),
      ret: r.uint(),
    }),
  ),
  /** The domain capabilities XML (`virsh domcapabilities`): firmware, machine types, what the emulator can do. */
  connectGetDomainCapabilities: remote<
    {
      emulatorbin: string | null;
      arch: string | null;
      machine: string | null;
      virttype: string | null;
      flags: number;
    },
    string
  >(
    "connectGetDomainCapabilities",
    342,
    (w, a) => {
      xdrTypes.writeOptionalString(w, a.emulatorbin);
      xdrTypes.writeOptionalString(w, a.arch);
      xdrTypes.writeOptionalString(w, a.machine);
      xdrTypes.writeOptionalString(w, a.virttype);
      w.uint(a.flags);
    },
    stringRet,
  ),
  domainDefineXmlFlags: remote<{ xml: string; flags: number }, DomainHandle>(
    "domainDefineXmlFlags",
    350,
    (w, a) => w.string(a.xml, Limits.stringMax).uint(a.flags),
    readDomainRet,
  ),
  domainInterfaceAddresses: remote<
    { dom: DomainHandle; source: number; flags: number },
    DomainInterface[]
  >(
    "domainInterfaceAddresses",
    353,
    (w, a) => {
      xdrTypes.writeDomain(w, a.dom);
      w.uint(a.source).uint(a.flags);
    },
    (r) =>
      r.array(Limits.interfacesMax, (i) => ({
        name: i.string(Limits.stringMax),
        hwaddr: xdrTypes.readOptionalString(i),
        addrs: i.array(Limits.addressesMax, (a) => ({
          type: a.int(),
          addr: a.string(Limits.stringMax),
          prefix: a.uint(),
        })),
      })),
  ),
  /** QEMU program, proc 3: qemu-guest-agent passthrough (virDomainQemuAgentCommand). */
  qemuDomainAgentCommand: {
    name: "qemuDomainAgentCommand",
    program: QEMU_PROGRAM,
    version: QEMU_PROTOCOL_VERSION,
    number: 3,
    encodeArgs(
      w: XdrWriter,
      a: { dom: DomainHandle; cmd: string; timeout: number; flags: number },
    ): void {
      xdrTypes.writeDomain(w, a.dom);
      w.string(a.cmd, Limits.stringMax).int(a.timeout).uint(a.flags);
    },
    decodeRet(r: XdrReader): string | null {
      return xdrTypes.readOptionalString(r);
    },
  } satisfies Procedure<
    { dom: DomainHandle; cmd: string; timeout: number; flags: number },
    string | null
  >,
};

export type ProcedureName = keyof typeof Procedures;
