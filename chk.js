const { poolArgsFromStackConfig } = require("./dist/components/stack-config");
const r = poolArgsFromStackConfig({
  pool: {
    count: 3,
    colour: "blue",
    backends: [
      { name: "kvm1", kvm: { netwrok: { bridge: "br0" }, connection: { host: "kvm1.lan", prot: 22 }, userData: "#cloud-config", memoryMib: 512, vcpus: "2" } },
      { name: "kvm1", wieght: 2, proxmox: { node: "pve1", templateVmid: 9000, diskStorage: "local-lvm", seedStorage: "local", cores: 0, tgas: ["a"] } },
      { name: "pve2", proxmox: { node: "pve1", templateVmid: 9000, diskStorage: "local-lvm", seedStorage: "local", vmidRange: {first: 300, lats: 400} } },
    ],
    squid: { basicAuthUser: "crawler", allowedClientCidrs: ["10.0.0.0/33"] },
    kvmImage: { url: "http://example.com/x.qcow2" },
  },
  basicAuthPassword: "short",
  kvmPrivateKey: "~/.ssh/id_ed25519",
});
console.log(r.ok ? r : r.problems.join("\n"));
console.log(poolArgsFromStackConfig({}).ok);
