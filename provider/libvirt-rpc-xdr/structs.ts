/**
 * The structs procedures share (remote_nonnull_domain, _storage_vol, …, and
 * remote_error), declared as XDR type values (`xdr-types.ts`) so the codec runs
 * from them and a test can compare their layouts with `remote_protocol.x`.
 */
import { Limits } from "./constants";
import { LibvirtError, LibvirtTransportError, type RemoteErrorFields } from "./errors";
import { XdrReader, type XdrWriter } from "./xdr";
import * as t from "./xdr-types";

const UUID_LENGTH = 16;
/** remote_nonnull_string */
export const remoteString = t.string(Limits.stringMax);
/** remote_string: a string that may be NULL. */
export const optionalString = t.optional(remoteString);
/** remote_uuid */
export const uuid = t.fixedOpaque(UUID_LENGTH);

/** remote_nonnull_domain. The qemu driver resolves it by UUID. */
export const domain = t.struct("remote_nonnull_domain", { name: remoteString, uuid, id: t.int });
/** remote_nonnull_network */
export const network = t.struct("remote_nonnull_network", { name: remoteString, uuid });
/** remote_nonnull_storage_pool */
export const storagePool = t.struct("remote_nonnull_storage_pool", { name: remoteString, uuid });
/** remote_nonnull_storage_vol, resolved by pool + name. */
export const storageVol = t.struct("remote_nonnull_storage_vol", {
  pool: remoteString,
  name: remoteString,
  key: remoteString,
});

export type DomainHandle = t.StructOut<typeof domain.members>;
export type StoragePoolHandle = t.StructOut<typeof storagePool.members>;
export type StorageVolHandle = t.StructOut<typeof storageVol.members>;
export type NetworkHandle = t.StructOut<typeof network.members>;

/** remote_nonnull_interface: a host interface (bridge, NIC) as libvirt's interface driver lists it. */
export const hostInterface = t.struct("remote_nonnull_interface", {
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
export const domainInterface = t.struct("remote_domain_interface", {
  name: remoteString,
  hwaddr: optionalString,
  addrs: t.array(domainIpAddr, Limits.addressesMax),
});
export type DomainInterface = t.StructOut<typeof domainInterface.members>;

/** remote_network_dhcp_lease */
export const dhcpLease = t.struct("remote_network_dhcp_lease", {
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

/** virTypedParameterType: the discriminant of remote_typed_param_value. */
export const TypedParamType = {
  INT: 1,
  UINT: 2,
  LLONG: 3,
  ULLONG: 4,
  DOUBLE: 5,
  BOOLEAN: 6,
  STRING: 7,
} as const;

/** remote_typed_param_value: one typed parameter's value, by its type. */
const typedParamValue = t.union<number | bigint | string>("remote_typed_param_value", [
  { value: TypedParamType.INT, name: "i", type: t.int as t.XdrType<number | bigint | string> },
  { value: TypedParamType.UINT, name: "ui", type: t.uint as t.XdrType<number | bigint | string> },
  { value: TypedParamType.LLONG, name: "l", type: t.hyper as t.XdrType<number | bigint | string> },
  {
    value: TypedParamType.ULLONG,
    name: "ul",
    type: t.uhyper as t.XdrType<number | bigint | string>,
  },
  {
    value: TypedParamType.DOUBLE,
    name: "d",
    type: t.double as t.XdrType<number | bigint | string>,
  },
  { value: TypedParamType.BOOLEAN, name: "b", type: t.int as t.XdrType<number | bigint | string> },
  {
    value: TypedParamType.STRING,
    name: "s",
    type: remoteString as t.XdrType<number | bigint | string>,
  },
]);

/** remote_typed_param: `field` names the statistic ("state.state"), `value` carries it. */
export const typedParam = t.struct("remote_typed_param", {
  field: remoteString,
  value: typedParamValue,
});
export type TypedParam = t.StructOut<typeof typedParam.members>;

/** remote_domain_stats_record: one domain's statistics from CONNECT_GET_ALL_DOMAIN_STATS. */
export const domainStatsRecord = t.struct("remote_domain_stats_record", {
  dom: domain,
  params: t.array(typedParam, Limits.connectGetAllDomainStatsMax),
});
export type DomainStatsRecord = t.StructOut<typeof domainStatsRecord.members>;

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
  typedParamValue,
  typedParam,
  domainStatsRecord,
  remoteError,
} as const;

export function readRemoteError(r: XdrReader): RemoteErrorFields {
  return remoteError.read(r);
}

export function writeRemoteError(w: XdrWriter, e: RemoteErrorFields): void {
  remoteError.write(w, e);
}

/** Decodes the remote_error of a REPLY/STREAM with status ERROR into a LibvirtError. */
export function decodeLibvirtError(
  procedure: string,
  body: Buffer,
): LibvirtError | LibvirtTransportError {
  try {
    return new LibvirtError(procedure, readRemoteError(new XdrReader(body)));
  } catch (cause) {
    return new LibvirtTransportError("protocol", `undecodable error from libvirt ${procedure}`, {
      cause,
    });
  }
}
