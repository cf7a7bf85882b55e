/**
 * onCollision "rotate" through the real dynamic-provider gRPC server: two
 * ProxmoxProxy members of one pool on the simulator, whose egress check
 * sees one address (the simulator's guests all leave through one forward
 * proxy, as VMs behind one NAT do). An `up --refresh` (reads, then check
 * and diff, one server process) replaces the younger, old VM first; the new
 * VM lands on the same address, and the next `up --refresh` replaces nothing
 * more: the loop guard. Without a refresh nothing is decided.
 */
import assert from "node:assert/strict";
import type { PveSimulator } from "../pve-sim/simulator";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";
import { captureSimulatorMembers, useEngineFixture } from "./engine-fixture";
import type { CapturedResource } from "./harness";
import { upAll, upWithRefresh, stepSummary, type Member } from "./up-refresh";

const AUTH = { user: "crawler", password: "engine collision secret" };
const EXIT = "127.0.0.3";

describe("engine: onCollision rotate (ProxmoxProxy, simulator, one server per deployment)", function () {
  this.timeout(180_000);
  const fixture = useEngineFixture();
  let sim: PveSimulator;
  let echo: RunningServer;
  let proxy: ForwardProxy;
  let config: Record<string, string>;
  const captured: CapturedResource[] = [];

  before(async () => {
    sim = await fixture.startSimulator({ guestAddress: () => "127.0.0.2" });
    echo = await startEchoServer("127.0.0.1");
    proxy = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress: EXIT });
    captured.push(
      ...(await captureSimulatorMembers(
        fixture.project,
        sim,
        ["crawl-pve-0", "crawl-pve-1"],
        { proxyPort: proxy.port, echoPort: echo.port, auth: AUTH },
        {
          rotateEgress: {},
          disruptionBudget: {
            group: "crawl",
            maxUnavailable: 1,
            drainSeconds: 0,
            onCollision: "rotate",
          },
        },
      )),
    );
    config = { "egress-proxies:proxmoxApiToken": sim.tokenFor() };
  });
  after(async () => {
    await proxy?.close();
    await echo?.close();
  });

  const server = async () => fixture.startServer({ config, engine: await fixture.startEngine() });

  it("the younger of two on one exit address is replaced at `up --refresh`, once; not without a refresh", async () => {
    const members: Member[] = captured.map((member) => ({
      name: member.name,
      urn: member.urn,
      program: member.inputs,
    }));
    // Made one after the other: crawl-pve-0 is the older.
    for (const member of members) {
      assert.deepEqual(stepSummary(await upAll(await server(), [member])), [
        `${member.name}:create`,
      ]);
      await new Promise((resolve) => setTimeout(resolve, 1100));
    }
    for (const member of members) assert.equal(member.stored!.outputs.egressIp, EXIT);
    const [olderVmid] = members.map((member) => member.stored!.outputs.vmid);
    const youngerMadeAt = members[1]!.stored!.outputs.createdAt;

    // Without a refresh, no member knows where the other leaves from.
    assert.deepEqual(
      stepSummary(await upAll(await server(), members)),
      members.map((m) => `${m.name}:same`),
    );

    const healed = await upWithRefresh(await server(), members);
    assert.deepEqual(stepSummary(healed), [
      "crawl-pve-0:same",
      "crawl-pve-1:replace(delete first)",
    ]);
    assert.equal(members[0]!.stored!.outputs.vmid, olderVmid);
    // Made anew (old VM first, so PVE may hand out the freed VMID again).
    assert.notEqual(members[1]!.stored!.outputs.createdAt, youngerMadeAt);
    assert.equal(
      [...sim.vms.keys()].filter((vmid) => vmid !== 9000).length,
      2,
      "the old VM is gone",
    );
    assert.deepEqual(members[1]!.stored!.outputs.rotateEgress, {
      [EXIT]: "shared with crawl-pve-0",
    });

    // One NAT for every VM: the new one leaves from the same address, and is left alone from now on.
    assert.equal(members[1]!.stored!.outputs.egressIp, EXIT);
    for (let round = 0; round < 2; round++)
      assert.deepEqual(
        stepSummary(await upWithRefresh(await server(), members)),
        members.map((m) => `${m.name}:same`),
      );

    const cleanup = await server();
    for (const member of members)
      await cleanup.delete(member.urn, member.stored!.id, member.stored!.outputs);
  });
});
