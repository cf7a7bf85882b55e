/**
 * KvmProxy's decision table. Anything about the VM itself (host, image,
 * machine, disk, firmware, network, cloud-init) replaces; how we reach the
 * host (credentials), the image download's size cap, readiness and timeouts
 * update in place.
 */
import type { ChangeTableOf } from "../common/diff";
import type { KvmProxyInputs } from "./schema";

export const KVM_CHANGE_TABLE: ChangeTableOf<
  KvmProxyInputs,
  "connection" | "image" | "guestFiles"
> = {
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
  "image.url": "replace",
  "image.sha256": "replace",
  "image.format": "replace",
  // Only how large a download may be: the VM's image is the same.
  "image.maxMiB": "update",
  userData: "replace",
  userDataBase64: "replace",
  vendorData: "replace",
  installGuestAgent: "replace",
  networkConfig: "replace",
  // Delivered into the running guest (common/guest-files.ts, which also decides what userData does then).
  "guestFiles.files": "update",
  "guestFiles.commands": "update",
  "guestFiles.listensOn": "update",
  "guestFiles.userDataIdentity": "replace",
  // The seed's network-config follows them (common/ip-families.ts).
  ipFamilies: "replace",
  ipv6: "replace",
  rotation: "replace",
  startOnBoot: "update",
  running: "update",
  egressRecheck: "update",
  rotateAfterDays: "update",
  readiness: "update",
  egressCheck: "update",
  timeouts: "update",
  owner: "update",
  // Touches no VM; state must hold it, since a delete reads its drain from there.
  disruptionBudget: "update",
};
