// Four proxies over two KVM hosts reached over SSH (key from config, host keys pinned).
import * as fs from "node:fs";
import * as pulumi from "@pulumi/pulumi";
import { EgressProxyPool } from "egress-proxies";

const config = new pulumi.Config();
const privateKey = config.requireSecret("sshPrivateKey");
const knownHosts = fs.readFileSync(`${process.env.HOME}/.ssh/known_hosts`, "utf8");

const pool = new EgressProxyPool("crawl", {
  count: 4,
  backends: [
    {
      name: "kvm1",
      kvm: {
        connection: { host: "kvm1.lan", user: "root", privateKey, knownHosts },
        network: { bridge: "br0" },
      },
    },
    {
      name: "kvm2",
      weight: 2, // the bigger host takes twice the share
      kvm: {
        connection: { host: "kvm2.lan", user: "root", privateKey, knownHosts },
        network: { bridge: "br0" },
        pool: "fast-nvme",
      },
    },
  ],
  machine: { cpus: 1, memoryMiB: 1024 },
  squid: { allowedClientCidrs: ["192.168.10.0/24"] },
});

export const endpoints = pool.endpoints;
export const proxies = pool.proxies;
