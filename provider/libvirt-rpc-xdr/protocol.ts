/**
 * The libvirt remote protocol's numbers and structs for the procedures this
 * project uses, written from libvirt's `remote_protocol.x`, `qemu_protocol.x`,
 * `virnetprotocol.x` and `virkeepaliveprotocol.x`, in three parts: the
 * numbers (`constants.ts`), the shared structs (`structs.ts`) and the
 * procedure table (`procedures.ts`). A unit test parses copies of those `.x`
 * files (test/data/libvirt/) and compares every number and layout with them.
 */
export * from "./constants";
// The struct values one by one are for procedures.ts; the public face is RemoteTypes.
export {
  RemoteTypes,
  decodeLibvirtError,
  readRemoteError,
  TypedParamType,
  writeRemoteError,
  type DhcpLease,
  type DomainHandle,
  type DomainInterface,
  type DomainStatsRecord,
  type TypedParam,
  type InterfaceHandle,
  type NetworkHandle,
  type StoragePoolHandle,
  type StorageVolHandle,
} from "./structs";
export * from "./procedures";
