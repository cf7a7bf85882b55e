/**
 * KvmProxy's decision table. Anything about the VM itself (host, image,
 * machine, disk, firmware, network, cloud-init) replaces; how we reach the
 * host (credentials), readiness and timeouts update in place.
 */
import type { ChangeTableOf } from "../common/diff";
import type { KvmProxyInputs } from "./schema";

export const KVM_CHANGE_TABLE: ChangeTableOf<KvmProxyInputs, "connection"> = {
  "connection.host": "replace",
  "connection.port": "replace",
  "connection.user": "update",
  "connection.privateKey": "update",
  "connection.passphrase": "update",
  "connection.knownHosts": "update",
  "connection.insecureIgnoreHostKey": "update",
  "connection.agentSocket": "update",
  "connection.dialTimeoutSeconds": "update",
  "connection.proxyJump": "update",
  socketPath: "update",
  pool: "replace",
  network: "replace",
  vmName: "replace",
  vcpus: "replace",
  memoryMiB: "replace",
  diskGiB: "replace",
  firmware: "replace",
  domainType: "replace",
  cpuMode: "replace",
  image: "replace",
  userData: "replace",
  userDataBase64: "replace",
  vendorData: "replace",
  installGuestAgent: "replace",
  networkConfig: "replace",
  rotation: "replace",
  startOnBoot: "update",
  running: "update",
  readiness: "update",
  egressCheck: "update",
  timeouts: "update",
  owner: "update",
};
