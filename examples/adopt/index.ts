// Adopting proxy VMs this stack already made (say, its state was lost or the
// VM was created by another program of the same project and stack) without
// recreating them. `.get` reads the VM by id, refuses one that lacks this
// stack's ownership mark, and keeps it in state as a read-only resource:
// Pulumi reads it again on every `up` and never changes or deletes it.
// Needs @pulumi/pulumi >= 3.268 (the dynamic-provider server that finds the
// provider code in a `.get`'s inputs).
//
// To manage one again, replace its `.get` by `new KvmProxy("edge-kvm", {...})`
// with the arguments that made it and `vmName` set to its name: create finds
// it by name and our mark and adopts it in place (docs/kvm.md, "Adopt, then
// declare"; docs/proxmox.md, 6a).
import * as pulumi from "@pulumi/pulumi";
import { KvmProxy, ProxmoxProxy } from "egress-proxies";

const config = new pulumi.Config();

// KVM: the id is hosts/<host>/domains/<vmName> (host:port when SSH is not on 22).
// The SSH key comes from config egress-proxies:kvmPrivateKey, SSH_AUTH_SOCK or ~/.ssh.
const kvm = KvmProxy.get("edge-kvm", "hosts/kvm1.lan/domains/edge-kvm-k3x9q2m7ab", {
  connection: { host: "kvm1.lan", user: "egress" },
});

// Proxmox: the id is nodes/<node>/qemu/<vmid>. Endpoint and token come from
// PROXMOX_VE_ENDPOINT / PROXMOX_VE_API_TOKEN or config, as for ProxmoxProxy.
const pve = ProxmoxProxy.get("edge-pve", config.get("pveProxyId") ?? "nodes/pve1/qemu/24924", {
  node: "pve1",
});

// What the hypervisor reports, read on every `up`: compare with what you expect.
export const kvmEndpoint = kvm.endpoint;
export const kvmShape = pulumi.all([kvm.vmName, kvm.state, kvm.libvirtUuid]);
export const pveEndpoint = pve.endpoint;
export const pveShape = pulumi.all([pve.vmName, pve.vmid, pve.state]);
