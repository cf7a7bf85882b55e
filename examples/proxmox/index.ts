// Two proxies cloned from a cloud-init template on one Proxmox VE node. The API
// endpoint and token come from PROXMOX_VE_ENDPOINT / PROXMOX_VE_API_TOKEN (or
// config egress-proxies:proxmoxEndpoint / proxmoxApiToken).
import * as pulumi from "@pulumi/pulumi";
import { EgressProxyPool } from "egress-proxies";

const config = new pulumi.Config();

const pool = new EgressProxyPool("office", {
  count: 2,
  backends: [
    {
      name: "pve1",
      proxmox: {
        node: "pve1",
        templateVmid: 9000,
        diskStorage: "local-lvm",
        seedStorage: "local",
        bridge: "vmbr0",
        vlanTag: 30,
      },
    },
  ],
  tags: ["egress", "crawler"],
  squid: {
    basicAuth: { user: "crawler", password: config.requireSecret("proxyPassword") },
  },
});

export const endpoints = pool.endpoints;
// Carries the password: stays a secret in state and in `pulumi stack output`.
export const endpointsWithCredentials = pool.endpointsWithCredentials;
