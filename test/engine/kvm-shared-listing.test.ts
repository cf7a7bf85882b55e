/**
 * Issue 32 on KVM: 200 KvmProxy members on the lab host (defined, never
 * started) refreshed through the real dynamic-provider gRPC server with the
 * engine's concurrency. Every read must be right: the three changed behind
 * the provider's back (vCPUs, autostart, undefined) show exactly their drift,
 * the others nothing. And the host must have been asked for its domains once
 * for the whole refresh, not once per member: a tap on the libvirt socket
 * counts what the host saw.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { availableParallelism } from "node:os";
import { openLocalLibvirt } from "../../provider/ssh/local";
import type { LibvirtConnection } from "../../provider/libvirt-rpc-xdr";
import { engineDefaultParallelism, refreshAsEngine, type ReadReply } from "./refresh-as-engine";
import { useLab, type LabEnv } from "../lab/fixture";
import { defineFleet, removeFleet, startLibvirtTap, type LibvirtTap } from "../lab/kvm-fleet";
import {
  captureFleetTemplate,
  fleetMembers,
  fleetOwner,
  refreshedMembers,
} from "../lab/kvm-fleet-members";
import {
  DynamicProviderServer,
  packIntoConsumerProject,
  type ConsumerProject,
  type Props,
} from "./harness";

const MEMBERS = 200;

/** The keys whose values differ between two property maps (`__provider` aside). */
function changedKeys(before: Props, after: Props): string[] {
  const keys = new Set([...Object.keys(before), ...Object.keys(after)]);
  keys.delete("__provider");
  return [...keys]
    .filter((key) => JSON.stringify(before[key]) !== JSON.stringify(after[key]))
    .sort();
}

describe("engine: KvmProxy refresh of 200 members shares one domain listing per host", function () {
  this.timeout(900_000);
  let lab: LabEnv;
  let project: ConsumerProject;
  let inspector: LibvirtConnection;
  let tap: LibvirtTap;
  const prefix = `kshare${process.pid % 10000}-`;

  before(async () => {
    lab = await useLab();
    inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
    tap = await startLibvirtTap(lab.libvirtSocket);
    project = packIntoConsumerProject();
  });

  after(async () => {
    if (inspector) await removeFleet(inspector, lab, prefix).catch(() => undefined);
    await inspector?.close();
    await tap?.close();
    project?.remove();
  });

  const virsh = (...args: string[]): string =>
    execFileSync("virsh", ["-q", "-c", lab.uri, ...args], { encoding: "utf8" });

  /** One refresh by a fresh server, as every `pulumi refresh` starts one. */
  async function refresh(members: Parameters<typeof refreshAsEngine>[1]) {
    const server = await DynamicProviderServer.start(project);
    try {
      await server.configure({});
      tap.reset();
      const parallel = engineDefaultParallelism(process.env, availableParallelism());
      const { replies, wallMs } = await refreshAsEngine(server, members, parallel);
      return { replies, wallMs, calls: tap.calls(), links: tap.connections() };
    } finally {
      await server.stop();
    }
  }

  it("reads every member right, shows only the three out-of-band changes, and lists the host's domains once", async () => {
    const names = Array.from({ length: MEMBERS }, (_, index) => `${prefix}${index}`);
    const domains = await defineFleet(inspector, lab, names, fleetOwner);
    const template = await captureFleetTemplate(project, lab, tap.socketPath);
    const setup = await DynamicProviderServer.start(project);
    let stored;
    try {
      await setup.configure({});
      stored = await fleetMembers(setup, template, domains);
    } finally {
      await setup.stop();
    }

    // The refresh after `up`: every member found as defined, none replaced.
    const first = await refresh(stored);
    first.replies.forEach((reply: ReadReply, index) => {
      const name = names[index]!;
      assert.equal(reply.id, stored[index]!.id, name);
      assert.equal(reply.properties.libvirtUuid, domains[index]!.uuid, name);
      assert.equal(reply.properties.vmName, name);
      assert.equal(reply.properties.state, "stopped", name);
      assert.equal(reply.inputs.vcpus, 1, name);
      assert.equal(reply.inputs.startOnBoot, false, name);
      assert.equal(reply.properties.replaceBecause, undefined, name);
    });
    const recorded = refreshedMembers(stored, first.replies);

    // Behind the provider's back: vCPUs, autostart, and one domain undefined (its volumes stay).
    const [resized, autostarted, undefined_] = [names[17]!, names[101]!, names[188]!];
    virsh("setvcpus", resized, "2", "--config", "--maximum");
    virsh("setvcpus", resized, "2", "--config");
    virsh("autostart", autostarted);
    virsh("undefine", undefined_);

    const second = await refresh(recorded);
    const calls = Object.fromEntries(second.calls);
    console.log(
      `      ${MEMBERS} members in ${(second.wallMs / 1000).toFixed(2)} s over ${second.links} link(s): ${JSON.stringify(calls)}`,
    );
    const drift = new Map<string, string[]>();
    second.replies.forEach((reply, index) => {
      const changed = changedKeys(recorded[index]!.outputs, reply.properties);
      const changedInputs = changedKeys(recorded[index]!.inputs, reply.inputs);
      if (changed.length > 0 || changedInputs.length > 0)
        drift.set(names[index]!, [...changed, ...changedInputs.map((key) => `inputs.${key}`)]);
      assert.equal(reply.id, recorded[index]!.id, names[index]);
    });
    assert.deepEqual(
      [...drift.keys()].sort(),
      [resized, autostarted, undefined_].sort(),
      JSON.stringify(Object.fromEntries(drift)),
    );
    assert.deepEqual(drift.get(resized), ["vcpus", "inputs.vcpus"]);
    assert.deepEqual(drift.get(autostarted), ["startOnBoot", "inputs.startOnBoot"]);
    // Gone with its overlay and seed left: kept in state, marked for replacement.
    assert.deepEqual(drift.get(undefined_), ["replaceBecause", "inputs.replaceBecause"]);
    assert.match(String(second.replies[188]!.properties.replaceBecause), /gone .* left behind/);
    assert.equal(second.replies[101]!.properties.startOnBoot, true);
    assert.equal(second.replies[17]!.properties.vcpus, 2);

    // What the host saw: its domains listed once for the whole refresh, not once per member.
    assert.equal(second.links, 1, "one SSH link for the refresh");
    assert.equal(calls.connectGetAllDomainStats, 1, "one domain listing (with state)");
    assert.equal(calls.connectListAllDomains, 1, "one autostart listing");
    assert.equal(calls.connectListAllStoragePools, 1, "one pool listing");
    assert.equal(calls.storagePoolListAllVolumes, 1, "one volume listing of the pool");
    assert.equal(calls.domainLookupByUuid, undefined, "no per-member look-up");
    assert.equal(calls.domainGetState, undefined, "no per-member state");
    assert.equal(calls.domainGetAutostart, undefined, "no per-member autostart");
    assert.equal(calls.domainGetXmlDesc, MEMBERS - 1, "each domain's own XML, the gone one's not");
  });
});
