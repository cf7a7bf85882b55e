/**
 * Upgrades in place through the real dynamic-provider gRPC server: three
 * ProxmoxProxy members on the simulator, made as the previous release made
 * them (the squid document in user-data, no guestFiles), then the program
 * of this release (the pool's own builders: a new squid.conf in user-data,
 * the same files as guestFiles with the document's identity). The `up`
 * updates every member and replaces none; each guest gets the new files
 * through agent/file-write, its commands through agent/exec, and keeps its
 * VMID. A later squid-only change does the same; a change of what is not
 * the files (a package for the prefix dialer) replaces, within the budget.
 */
import assert from "node:assert/strict";
import type { SquidSettings } from "../../workloads/squid-cloud-init";
import {
  poolUserData,
  squidCloudConfig,
  squidGuestFiles,
  squidUserDataIdentity,
} from "../../workloads/squid-cloud-init";
import type { PveSimulator } from "../pve-sim/simulator";
import { simulatorProxyArgs, useEngineFixture } from "./engine-fixture";
import {
  captureResourceInputs,
  type CapturedResource,
  type DynamicProviderServer,
  type Props,
} from "./harness";
import { planSummary, type StoredResource } from "./resync";

const MEMBERS = ["crawl-pve-0", "crawl-pve-1", "crawl-pve-2"];
const SQUID_PORT = 3128;
const BASE: SquidSettings = {
  port: SQUID_PORT,
  allowedClientCidrs: ["10.0.0.0/8"],
  basicAuth: { user: "crawler", password: "engine guest files" },
  extraConfigLines: [],
};

/** What the pool passes for these settings: the document, and its files to deliver. */
const software = (settings: SquidSettings) => ({
  userData: poolUserData(squidCloudConfig(settings)),
  guestFiles: { ...squidGuestFiles(settings), userDataIdentity: squidUserDataIdentity(settings) },
});

describe("engine: upgrades in place (ProxmoxProxy, simulator, guest agent)", function () {
  this.timeout(180_000);
  const fixture = useEngineFixture();
  let sim: PveSimulator;
  let config: Record<string, string>;
  const common = (sim: PveSimulator) =>
    simulatorProxyArgs(sim, {
      disruptionBudget: { group: "crawl", maxUnavailable: 1, drainSeconds: 0 },
    });

  before(async () => {
    sim = await fixture.startSimulator({ guestListens: () => [22, SQUID_PORT] });
    config = { "egress-proxies:proxmoxApiToken": sim.tokenFor() };
  });

  async function capture(args: Props): Promise<CapturedResource[]> {
    const captured = [];
    for (const name of MEMBERS)
      captured.push(
        await captureResourceInputs(fixture.project, "ProxmoxProxy", name, {
          ...common(sim),
          ...args,
        }),
      );
    return captured;
  }

  async function server(): Promise<DynamicProviderServer> {
    return fixture.startServer({ config, engine: await fixture.startEngine() });
  }

  /** One `up`: every member checked and diffed in registration order, then the planned ones updated. */
  async function up(stored: StoredResource[], program: CapturedResource[]) {
    const provider = await server();
    const plans = [];
    for (const [index, member] of program.entries()) {
      const checked = await provider.check(member.urn, stored[index]!.inputs, member.inputs);
      assert.deepEqual(checked.failures, []);
      plans.push({
        checked,
        diff: await provider.diff(
          member.urn,
          stored[index]!.id,
          stored[index]!.outputs,
          checked.inputs,
        ),
      });
    }
    const summary = planSummary(plans.map(({ diff }) => ({ diff, stored: undefined as never })));
    const next = [...stored];
    for (const [index, plan] of plans.entries())
      if (plan.diff.changes !== "none" && plan.diff.replaces.length === 0) {
        const outputs = await provider.update(
          program[index]!.urn,
          stored[index]!.id,
          stored[index]!.outputs,
          plan.checked.inputs,
        );
        next[index] = { id: stored[index]!.id, outputs, inputs: plan.checked.inputs };
      }
    return { summary, stored: next };
  }

  const squidConfOf = (vmid: unknown) =>
    sim.guestFiles.get(Number(vmid))?.get("/etc/squid/squid.conf")?.toString();

  it("a pool of the previous release gets this release's squid document in place: no member replaced, every guest runs it", async () => {
    // The previous release: the squid document in user-data, nothing to deliver.
    const previous = await capture({
      userData: poolUserData(squidCloudConfig({ ...BASE, extraConfigLines: ["# before"] })),
    });
    const provider = await server();
    let stored: StoredResource[] = [];
    for (const member of previous) {
      const checked = await provider.check(member.urn, {}, member.inputs);
      assert.deepEqual(checked.failures, []);
      const created = await provider.create(member.urn, checked.inputs);
      stored.push({ id: created.id, outputs: created.properties, inputs: checked.inputs });
    }
    const vmids = stored.map((member) => member.outputs.vmid);

    const upgraded = software(BASE);
    const first = await up(stored, await capture(upgraded));
    assert.deepEqual(
      first.summary,
      MEMBERS.map(() => "some (replaces: )"),
      "every member updated, none replaced",
    );
    stored = first.stored;
    assert.deepEqual(
      stored.map((member) => member.outputs.vmid),
      vmids,
      "the same VMs",
    );
    const expected = upgraded.guestFiles.files[0]!.content;
    for (const vmid of vmids) {
      assert.equal(squidConfOf(vmid), expected);
      const commands = sim.guestCommands
        .filter((run) => run.vmid === Number(vmid))
        .map((run) => run.argv.join(" "));
      assert.deepEqual(commands.slice(0, 2), [
        "chmod 0644 /etc/squid/squid.conf",
        "chmod 0640 /etc/squid/egress-proxies.htpasswd",
      ]);
      assert.equal(commands.at(-1), "systemctl reload-or-restart squid");
    }
    // Nothing more to do: the next `up` plans nothing.
    const quiet = await up(stored, await capture(upgraded));
    assert.deepEqual(
      quiet.summary,
      MEMBERS.map(() => "none"),
    );

    // A squid-only change later (an ACL): delivered again, in place.
    const acl = software({
      ...BASE,
      extraConfigLines: ["acl blocked dstdomain .example.com", "http_access deny blocked"],
    });
    const second = await up(stored, await capture(acl));
    assert.deepEqual(
      second.summary,
      MEMBERS.map(() => "some (replaces: )"),
    );
    stored = second.stored;
    for (const vmid of vmids) assert.match(squidConfOf(vmid) ?? "", /http_access deny blocked/);

    // squid refuses the new file (its reload fails): that member keeps the old file, and the update fails saying so.
    sim.guestExec = (vmid, argv) =>
      argv.join(" ") === "systemctl reload-or-restart squid" &&
      (squidConfOf(vmid) ?? "").includes("bogus")
        ? { exitCode: 1, stderr: "Job for squid.service failed." }
        : { exitCode: 0 };
    const bogus = await capture(software({ ...BASE, extraConfigLines: ["bogus directive"] }));
    const provider2 = await server();
    const checked = await provider2.check(bogus[0]!.urn, stored[0]!.inputs, bogus[0]!.inputs);
    await assert.rejects(
      provider2.update(bogus[0]!.urn, stored[0]!.id, stored[0]!.outputs, checked.inputs),
      /delivering guest files in place failed \(`systemctl reload-or-restart squid` exited 1: Job for squid\.service failed\.\); the previous files are back in place/,
    );
    assert.match(squidConfOf(vmids[0]) ?? "", /http_access deny blocked/);
    assert.doesNotMatch(squidConfOf(vmids[0]) ?? "", /bogus/);
    sim.guestExec = () => ({ exitCode: 0 });

    // What is not the files changes (the prefix dialer adds a package): replaced, one per `up` (the budget).
    const prefixed = software({
      ...BASE,
      prefixEgress: { prefix: "2001:db8:7:100::/64", mode: "random" },
    });
    const third = await up(stored, await capture(prefixed));
    assert.match(third.summary[0]!, /^some \(replaces: .*guestFiles\.userDataIdentity/);
    assert.deepEqual(
      third.summary.slice(1),
      ["none", "none"],
      "the others wait their turn, unchanged",
    );

    const cleanup = await server();
    for (const [index, member] of stored.entries())
      await cleanup.delete(previous[index]!.urn, member.id, member.outputs);
  });
});
