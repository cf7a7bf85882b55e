/**
 * The libvirt remote protocol's numbers: programs, message types and
 * statuses, size limits, and the enums and flag sets of the procedures this
 * project uses (from `remote_protocol.x`, `virnetprotocol.x`,
 * `virkeepaliveprotocol.x` and libvirt's public headers). Kept apart from the
 * structs and the procedure table, as go-libvirt keeps its constants apart
 * from its bindings; test/unit/libvirt-rpc-xdr/protocol-source.test.ts checks
 * them against copies of the `.x` files.
 */
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
  /** REMOTE_CONNECT_GET_ALL_DOMAIN_STATS_MAX: typed parameters per domain's record. */
  connectGetAllDomainStatsMax: 262144,
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
/** virConnectListAllDomainsFlags (also the filter of CONNECT_GET_ALL_DOMAIN_STATS). */
export const ListAllDomainsFlags = {
  ACTIVE: 1,
  INACTIVE: 2,
  PERSISTENT: 4,
  TRANSIENT: 8,
  RUNNING: 16,
  PAUSED: 32,
  SHUTOFF: 64,
  OTHER: 128,
  MANAGEDSAVE: 256,
  NO_MANAGEDSAVE: 512,
  AUTOSTART: 1024,
  NO_AUTOSTART: 2048,
} as const;
/** virDomainStatsTypes: the groups CONNECT_GET_ALL_DOMAIN_STATS reports. */
export const DomainStatsTypes = { STATE: 1 } as const;
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
