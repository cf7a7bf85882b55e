/**
 * The libvirt remote protocol's numbers and structs for the procedures this
 * project uses, written from libvirt's `remote_protocol.x`, `qemu_protocol.x`,
 * `virnetprotocol.x` and `virkeepaliveprotocol.x`. Structs are declared as XDR
 * type values (`xdr-types.ts`): the codec runs from them, and a unit test
 * parses copies of those `.x` files (test/data/libvirt/) and compares every
 * number and layout here with them. Each procedure is a value that knows how
 * to encode its arguments and decode its result, so
 * `client.call(Procedures.domainLookupByName, { name })` is fully typed and
 * nothing here touches a socket.
 */
import type { RemoteErrorFields } from "./errors";
import { XdrReader, XdrWriter } from "./xdr";
import * as t from "./xdr-types";

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

// ---- shared structs ------------------------------------------------------------------------------

const UUID_LENGTH = 16;
/** remote_nonnull_string */
const remoteString = t.string(Limits.stringMax);
/** remote_string: a string that may be NULL. */
const optionalString = t.optional(remoteString);
/** remote_uuid */
const uuid = t.fixedOpaque(UUID_LENGTH);

/** remote_nonnull_domain. The qemu driver resolves it by UUID. */
const domain = t.struct("remote_nonnull_domain", { name: remoteString, uuid, id: t.int });
/** remote_nonnull_network */
const network = t.struct("remote_nonnull_network", { name: remoteString, uuid });
/** remote_nonnull_storage_pool */
const storagePool = t.struct("remote_nonnull_storage_pool", { name: remoteString, uuid });
/** remote_nonnull_storage_vol, resolved by pool + name. */
const storageVol = t.struct("remote_nonnull_storage_vol", {
  pool: remoteString,
  name: remoteString,
  key: remoteString,
});

export type DomainHandle = t.StructOut<typeof domain.members>;
export type StoragePoolHandle = t.StructOut<typeof storagePool.members>;
export type StorageVolHandle = t.StructOut<typeof storageVol.members>;
export type NetworkHandle = t.StructOut<typeof network.members>;

/** remote_nonnull_interface: a host interface (bridge, NIC) as libvirt's interface driver lists it. */
const hostInterface = t.struct("remote_nonnull_interface", {
  name: remoteString,
  mac: remoteString,
});
export type InterfaceHandle = t.StructOut<typeof hostInterface.members>;

/** remote_domain_ip_addr */
const domainIpAddr = t.struct("remote_domain_ip_addr", {
  type: t.int,
  addr: remoteString,
  prefix: t.uint,
});
/** remote_domain_interface */
const domainInterface = t.struct("remote_domain_interface", {
  name: remoteString,
  hwaddr: optionalString,
  addrs: t.array(domainIpAddr, Limits.addressesMax),
});
export type DomainInterface = t.StructOut<typeof domainInterface.members>;

/** remote_network_dhcp_lease */
const dhcpLease = t.struct("remote_network_dhcp_lease", {
  iface: remoteString,
  expirytime: t.hyper,
  type: t.int,
  mac: optionalString,
  iaid: optionalString,
  ipaddr: remoteString,
  prefix: t.uint,
  hostname: optionalString,
  clientid: optionalString,
});
export type DhcpLease = t.StructOut<typeof dhcpLease.members>;

/** remote_error: all 11 fields in wire order. */
const remoteError = t.struct("remote_error", {
  code: t.int,
  domain: t.int,
  message: optionalString,
  level: t.int,
  dom: t.optional(domain),
  str1: optionalString,
  str2: optionalString,
  str3: optionalString,
  int1: t.int,
  int2: t.int,
  net: t.optional(network),
});

/** The structs above as values, for tests and for anyone extending the protocol. */
export const RemoteTypes = {
  remoteString,
  optionalString,
  uuid,
  domain,
  network,
  storagePool,
  storageVol,
  hostInterface,
  domainIpAddr,
  domainInterface,
  dhcpLease,
  remoteError,
} as const;

export function readRemoteError(r: XdrReader): RemoteErrorFields {
  return remoteError.read(r);
}

export function writeRemoteError(w: XdrWriter, e: RemoteErrorFields): void {
  remoteError.write(w, e);
}

// ---- procedures ----------------------------------------------------------------------------------

/** How a procedure's body is laid out; `stream` marks procedures followed by a data stream. */
export interface Procedure<Args, Ret> {
  readonly name: string;
  readonly program: number;
  readonly version: number;
  readonly number: number;
  readonly stream?: "upload" | "download";
  /** `remote_<name>_args` as a layout; null when libvirt declares none (no arguments). */
  readonly argsLayout: t.StructLayout | null;
  /** `remote_<name>_ret` as a layout; null when the procedure returns nothing. */
  readonly retLayout: t.StructLayout | null;
  encodeArgs(writer: XdrWriter, args: Args): void;
  decodeRet(reader: XdrReader): Ret;
}

function procedure<Args, Ret>(
  program: number,
  version: number,
  name: string,
  number: number,
  args: t.XdrBody<unknown, Args>,
  ret: t.XdrBody<Ret, never>,
  stream?: "upload" | "download",
): Procedure<Args, Ret> {
  return {
    name,
    program,
    version,
    number,
    argsLayout: args.layout,
    retLayout: ret.layout,
    encodeArgs: (w, a) => args.write(w, a),
    decodeRet: (r) => ret.read(r),
    ...(stream ? { stream } : {}),
  };
}

function remote<Args, Ret>(
  name: string,
  number: number,
  args: t.XdrBody<unknown, Args>,
  ret: t.XdrBody<Ret, never>,
  stream?: "upload" | "download",
): Procedure<Args, Ret> {
  return procedure(REMOTE_PROGRAM, REMOTE_PROTOCOL_VERSION, name, number, args, ret, stream);
}

/** A procedure's own args/ret struct (libvirt names it after the procedure). */
const body = <M extends Parameters<typeof t.struct>[1]>(members: M) => t.struct(null, members);

const domainArgs = body({ dom: domain });
const domainFlagsArgs = body({ dom: domain, flags: t.uint });
const domainRet = t.only("dom", domain);
const volArgs = body({ vol: storageVol });
const volStreamArgs = body({ vol: storageVol, offset: t.uhyper, length: t.uhyper, flags: t.uint });
const stringOf = (member: string) => t.only(member, remoteString);

export type DomainArgs = t.StructIn<(typeof domainArgs)["members"]>;
export type DomainFlagsArgs = t.StructIn<(typeof domainFlagsArgs)["members"]>;
export type VolArgs = t.StructIn<(typeof volArgs)["members"]>;
/** `length` 0 means "to the end". */
export type VolStreamArgs = t.StructIn<(typeof volStreamArgs)["members"]>;

const storagePoolInfo = body({
  /** virStoragePoolState (unsigned char on the wire, 4 bytes). */
  state: t.uint,
  capacity: t.uhyper,
  allocation: t.uhyper,
  available: t.uhyper,
});
export type StoragePoolInfo = t.StructOut<(typeof storagePoolInfo)["members"]>;
const storageVolInfo = body({
  /** virStorageVolType (char on the wire, 4 bytes). */
  type: t.int,
  capacity: t.uhyper,
  allocation: t.uhyper,
});
export type StorageVolInfo = t.StructOut<(typeof storageVolInfo)["members"]>;

export const Procedures = {
  connectOpen: remote("connectOpen", 1, body({ name: optionalString, flags: t.uint }), t.empty),
  connectClose: remote("connectClose", 2, t.empty, t.empty),
  connectGetCapabilities: remote("connectGetCapabilities", 7, t.empty, stringOf("capabilities")),
  domainCreate: remote("domainCreate", 9, domainArgs, t.empty),
  domainDefineXml: remote("domainDefineXml", 11, body({ xml: remoteString }), domainRet),
  domainDestroy: remote("domainDestroy", 12, domainArgs, t.empty),
  domainGetXmlDesc: remote("domainGetXmlDesc", 14, domainFlagsArgs, stringOf("xml")),
  domainGetAutostart: remote("domainGetAutostart", 15, domainArgs, t.only("autostart", t.intBool)),
  domainLookupByName: remote("domainLookupByName", 23, body({ name: remoteString }), domainRet),
  domainLookupByUuid: remote("domainLookupByUuid", 24, body({ uuid }), domainRet),
  domainSetAutostart: remote(
    "domainSetAutostart",
    29,
    body({ dom: domain, autostart: t.int }),
    t.empty,
  ),
  domainShutdown: remote("domainShutdown", 33, domainArgs, t.empty),
  domainUndefine: remote("domainUndefine", 35, domainArgs, t.empty),
  networkCreate: remote("networkCreate", 39, body({ net: network }), t.empty),
  networkLookupByName: remote(
    "networkLookupByName",
    46,
    body({ name: remoteString }),
    t.only("net", network),
  ),
  networkSetAutostart: remote(
    "networkSetAutostart",
    48,
    body({ net: network, autostart: t.int }),
    t.empty,
  ),
  connectGetHostname: remote("connectGetHostname", 59, t.empty, stringOf("hostname")),
  connectSupportsFeature: remote(
    "connectSupportsFeature",
    60,
    body({ feature: t.int }),
    t.only("supported", t.intBool),
  ),
  authList: remote(
    "authList",
    66,
    t.empty,
    // remote_auth_type is an enum: an int on the wire.
    t.only("types", t.array(t.int, Limits.authTypeListMax)),
  ),
  authPolkit: remote("authPolkit", 70, t.empty, t.only("complete", t.intBool)),
  storagePoolDefineXml: remote(
    "storagePoolDefineXml",
    77,
    body({ xml: remoteString, flags: t.uint }),
    t.only("pool", storagePool),
  ),
  storagePoolCreate: remote(
    "storagePoolCreate",
    78,
    body({ pool: storagePool, flags: t.uint }),
    t.empty,
  ),
  storagePoolBuild: remote(
    "storagePoolBuild",
    79,
    body({ pool: storagePool, flags: t.uint }),
    t.empty,
  ),
  storagePoolRefresh: remote(
    "storagePoolRefresh",
    83,
    body({ pool: storagePool, flags: t.uint }),
    t.empty,
  ),
  storagePoolLookupByName: remote(
    "storagePoolLookupByName",
    84,
    body({ name: remoteString }),
    t.only("pool", storagePool),
  ),
  storagePoolGetInfo: remote(
    "storagePoolGetInfo",
    87,
    body({ pool: storagePool }),
    storagePoolInfo,
  ),
  storagePoolSetAutostart: remote(
    "storagePoolSetAutostart",
    90,
    body({ pool: storagePool, autostart: t.int }),
    t.empty,
  ),
  storageVolCreateXml: remote(
    "storageVolCreateXml",
    93,
    body({ pool: storagePool, xml: remoteString, flags: t.uint }),
    t.only("vol", storageVol),
  ),
  storageVolDelete: remote(
    "storageVolDelete",
    94,
    body({ vol: storageVol, flags: t.uint }),
    t.empty,
  ),
  storageVolLookupByName: remote(
    "storageVolLookupByName",
    95,
    body({ pool: storagePool, name: remoteString }),
    t.only("vol", storageVol),
  ),
  storageVolGetInfo: remote("storageVolGetInfo", 98, volArgs, storageVolInfo),
  storageVolGetXmlDesc: remote(
    "storageVolGetXmlDesc",
    99,
    body({ vol: storageVol, flags: t.uint }),
    stringOf("xml"),
  ),
  storageVolGetPath: remote("storageVolGetPath", 100, volArgs, stringOf("name")),
  networkIsActive: remote(
    "networkIsActive",
    152,
    body({ net: network }),
    t.only("active", t.intBool),
  ),
  storagePoolIsActive: remote(
    "storagePoolIsActive",
    154,
    body({ pool: storagePool }),
    t.only("active", t.intBool),
  ),
  connectGetLibVersion: remote("connectGetLibVersion", 157, t.empty, t.only("libVer", t.uhyper)),
  domainCreateWithFlags: remote("domainCreateWithFlags", 196, domainFlagsArgs, domainRet),
  storageVolUpload: remote("storageVolUpload", 208, volStreamArgs, t.empty, "upload"),
  storageVolDownload: remote("storageVolDownload", 209, volStreamArgs, t.empty, "download"),
  domainGetState: remote(
    "domainGetState",
    212,
    domainFlagsArgs,
    body({ state: t.int, reason: t.int }),
  ),
  domainUndefineFlags: remote("domainUndefineFlags", 231, domainFlagsArgs, t.empty),
  domainDestroyFlags: remote("domainDestroyFlags", 234, domainFlagsArgs, t.empty),
  domainShutdownFlags: remote("domainShutdownFlags", 258, domainFlagsArgs, t.empty),
  storageVolResize: remote(
    "storageVolResize",
    260,
    body({ vol: storageVol, capacity: t.uhyper, flags: t.uint }),
    t.empty,
  ),
  domainSetMetadata: remote(
    "domainSetMetadata",
    264,
    body({
      dom: domain,
      type: t.int,
      metadata: optionalString,
      key: optionalString,
      uri: optionalString,
      flags: t.uint,
    }),
    t.empty,
  ),
  domainGetMetadata: remote(
    "domainGetMetadata",
    265,
    body({ dom: domain, type: t.int, uri: optionalString, flags: t.uint }),
    stringOf("metadata"),
  ),
  connectListAllDomains: remote(
    "connectListAllDomains",
    273,
    // needResults 0 asks only for the count.
    body({ needResults: t.int, flags: t.uint }),
    body({ domains: t.array(domain, Limits.domainListMax), ret: t.uint }),
  ),
  domainGetHostname: remote("domainGetHostname", 277, domainFlagsArgs, stringOf("hostname")),
  storagePoolListAllVolumes: remote(
    "storagePoolListAllVolumes",
    282,
    body({ pool: storagePool, needResults: t.int, flags: t.uint }),
    body({ vols: t.array(storageVol, Limits.storageVolListMax), ret: t.uint }),
  ),
  connectListAllStoragePools: remote(
    "connectListAllStoragePools",
    281,
    body({ needResults: t.int, flags: t.uint }),
    body({ pools: t.array(storagePool, Limits.storagePoolListMax), ret: t.uint }),
  ),
  connectListAllNetworks: remote(
    "connectListAllNetworks",
    283,
    body({ needResults: t.int, flags: t.uint }),
    body({ nets: t.array(network, Limits.networkListMax), ret: t.uint }),
  ),
  connectListAllInterfaces: remote(
    "connectListAllInterfaces",
    284,
    body({ needResults: t.int, flags: t.uint }),
    body({ ifaces: t.array(hostInterface, Limits.interfaceListMax), ret: t.uint }),
  ),
  networkGetDhcpLeases: remote(
    "networkGetDhcpLeases",
    341,
    body({ net: network, mac: optionalString, needResults: t.int, flags: t.uint }),
    body({ leases: t.array(dhcpLease, Limits.dhcpLeasesMax), ret: t.uint }),
  ),
  /** The domain capabilities XML (`virsh domcapabilities`): firmware, machine types, what the emulator can do. */
  connectGetDomainCapabilities: remote(
    "connectGetDomainCapabilities",
    342,
    body({
      emulatorbin: optionalString,
      arch: optionalString,
      machine: optionalString,
      virttype: optionalString,
      flags: t.uint,
    }),
    stringOf("capabilities"),
  ),
  domainDefineXmlFlags: remote(
    "domainDefineXmlFlags",
    350,
    body({ xml: remoteString, flags: t.uint }),
    domainRet,
  ),
  domainInterfaceAddresses: remote(
    "domainInterfaceAddresses",
    353,
    body({ dom: domain, source: t.uint, flags: t.uint }),
    t.only("ifaces", t.array(domainInterface, Limits.interfacesMax)),
  ),
  /** QEMU program, proc 3: qemu-guest-agent passthrough (virDomainQemuAgentCommand). */
  qemuDomainAgentCommand: procedure(
    QEMU_PROGRAM,
    QEMU_PROTOCOL_VERSION,
    "qemuDomainAgentCommand",
    3,
    body({ dom: domain, cmd: remoteString, timeout: t.int, flags: t.uint }),
    t.only("result", optionalString),
  ),
};

export type ProcedureName = keyof typeof Procedures;
