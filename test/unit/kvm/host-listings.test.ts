/**
 * Which libvirt calls forget a host's shared listings (host-listings.ts): a
 * write that did not would let a Read after it see the host as it was before.
 */
import assert from "node:assert/strict";
import { Procedures } from "../../../provider/libvirt-rpc-xdr";
import {
  forgetHostListings,
  forgetsHostListings,
  listingsAsked,
  sharedDomainListing,
  sharedVolumeListing,
  type DomainListing,
} from "../../../provider/kvm/host-listings";

const agent = (execute: string) => ({ cmd: JSON.stringify({ execute, arguments: {} }) });
const emptyListing = (): Promise<DomainListing> =>
  Promise.resolve({ byUuid: new Map(), byName: new Map() });

describe("kvm host listings", () => {
  it("forgets on every call that changes the host, and on none that only looks", () => {
    const writes = [
      "domainDefineXml",
      "domainDefineXmlFlags",
      "domainCreate",
      "domainCreateWithFlags",
      "domainDestroy",
      "domainDestroyFlags",
      "domainShutdown",
      "domainShutdownFlags",
      "domainUndefine",
      "domainUndefineFlags",
      "domainSetAutostart",
      "domainSetMetadata",
      "storageVolCreateXml",
      "storageVolDelete",
      "storageVolResize",
      "storageVolUpload",
      "storagePoolDefineXml",
      "storagePoolBuild",
      "storagePoolCreate",
      "storagePoolRefresh",
      "storagePoolSetAutostart",
      "networkCreate",
      "networkSetAutostart",
      // Not sent through a host (the handshake's), listed so the table stays complete.
      "connectOpen",
      "connectClose",
      "authList",
      "authPolkit",
    ];
    const forgetting = Object.keys(Procedures)
      .filter((name) => name !== "qemuDomainAgentCommand")
      .filter((name) => forgetsHostListings(name, {}));
    assert.deepEqual(forgetting.sort(), writes.sort());
  });

  it("forgets after guest-agent writes (files, exec) but not after the agent's read-only questions", () => {
    for (const execute of ["guest-file-open", "guest-file-write", "guest-file-close", "guest-exec"])
      assert.equal(forgetsHostListings("qemuDomainAgentCommand", agent(execute)), true, execute);
    for (const execute of ["guest-ping", "guest-network-get-interfaces", "guest-exec-status"])
      assert.equal(forgetsHostListings("qemuDomainAgentCommand", agent(execute)), false, execute);
    assert.equal(forgetsHostListings("qemuDomainAgentCommand", { cmd: "not json" }), true);
  });

  it("asks a host's domains once for many Reads, and again after that host is forgotten", async () => {
    const host = `test:${Math.random()}`;
    let asked = 0;
    const list = () => {
      asked++;
      return emptyListing();
    };
    await Promise.all([1, 2, 3].map(() => sharedDomainListing(host, list)));
    await sharedVolumeListing(host, "lab", () => Promise.resolve(new Set(["a"])));
    assert.equal(asked, 1);
    forgetHostListings(host);
    await sharedDomainListing(host, list);
    await sharedVolumeListing(host, "lab", () => Promise.resolve(new Set(["a"])));
    assert.equal(asked, 2);
    assert.deepEqual(listingsAsked(host), { domains: 2, pools: 0, volumes: 2 });
  });
});
