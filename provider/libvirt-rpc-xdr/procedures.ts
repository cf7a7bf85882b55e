/**
 * The procedures this project calls, each a value that knows its program,
 * number and how to encode its arguments and decode its result, so
 * `client.call(Procedures.domainLookupByName, { name })` is fully typed and
 * nothing here touches a socket. Numbers and layouts are checked against
 * `remote_protocol.x` and `qemu_protocol.x` by
 * test/unit/libvirt-rpc-xdr/protocol-source.test.ts.
 */
import {
  Limits,
  QEMU_PROGRAM,
  QEMU_PROTOCOL_VERSION,
  REMOTE_PROGRAM,
  REMOTE_PROTOCOL_VERSION,
} from "./constants";
import {
  dhcpLease,
  domain,
  domainInterface,
  domainStatsRecord,
  hostInterface,
  network,
  optionalString,
  remoteString,
  storagePool,
  storageVol,
  uuid,
} from "./structs";
import type { XdrReader, XdrWriter } from "./xdr";
import * as t from "./xdr-types";

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
  /**
   * Statistics of many domains in one call: `doms` empty asks for every
   * domain `flags` selects (ListAllDomainsFlags; 0 = all), `stats` the groups
   * (DomainStatsTypes). With STATE alone the daemon needs no monitor or job,
   * so a busy domain does not hold the answer back.
   */
  connectGetAllDomainStats: remote(
    "connectGetAllDomainStats",
    344,
    body({ doms: t.array(domain, Limits.domainListMax), stats: t.uint, flags: t.uint }),
    t.only("retStats", t.array(domainStatsRecord, Limits.domainListMax), "retStats"),
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
