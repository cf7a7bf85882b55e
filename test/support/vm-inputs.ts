/**
 * The fewest inputs each VM resource's check accepts, for unit tests that
 * drive the real check and diff offline (no host is ever dialled).
 */
export const KVM_MINIMAL_INPUTS = {
  connection: { host: "kvm1.lan", privateKey: "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n" },
  image: { url: "https://i.example/a.qcow2" },
};

export const PROXMOX_MINIMAL_INPUTS = {
  apiEndpoint: "https://pve.invalid:8006",
  apiToken: "root@pam!edge=5ecret",
  node: "pve",
  templateVmid: 9000,
  diskStorage: "local-lvm",
  seedStorage: "local",
};
