/**
 * Issue 32, part 2, through the engine: a pool of 200 ProxmoxProxy members
 * on four simulated nodes, refreshed by a provider process of its own (as
 * `pulumi refresh` starts one) with the Reads at the CLI's default
 * parallelism. Every Read must find its member as recorded except three
 * changed out of band, each showing exactly its own change; and the nodes
 * must have been asked for their VM index and their seed listing once per
 * node, not once per member (provider/proxmox/node-listings.ts). The fleet is
 * the scale bench's (proxmox-fleet.ts: one real Create per node, the other
 * VMs copies of it in the simulators' state).
 */
import assert from "node:assert/strict";
import { availableParallelism } from "node:os";
import { REPLACE_BECAUSE_KEY } from "../../provider/common/replacement";
import type { PveSimulator } from "../pve-sim/simulator";
import { useEngineFixture } from "./engine-fixture";
import { captureResourceInputs, type Props } from "./harness";
import { startProxmoxFleet, type ProxmoxFleet } from "./proxmox-fleet";
import { engineDefaultParallelism, refreshAsEngine, type StoredMember } from "./refresh-as-engine";

const MEMBERS = 200;
const NODES = 4;

/**
 * The keys whose values a Read changed: what `pulumi refresh` would show as
 * drift. A null value counts as absent, as in the engine's property diff
 * (a null PropertyValue has no value): Read says `egressProblem: null` (none)
 * where Create left the key out.
 */
function changedKeys(before: Props, after: Props): string[] {
  const keys = new Set([...Object.keys(before), ...Object.keys(after)]);
  const text = (value: unknown) => JSON.stringify(value ?? null);
  return [...keys].filter((key) => text(before[key]) !== text(after[key])).sort();
}

describe("engine: 200 ProxmoxProxy members refreshed at the CLI's parallelism (issue 32)", function () {
  this.timeout(300_000);
  const fixture = useEngineFixture();
  let fleet: ProxmoxFleet | undefined;

  after(async () => {
    await fleet?.stop();
  });

  it("reads every member right, shows exactly the three changes made out of band, and asks each node for one VM index and one seed listing", async () => {
    const member = await captureResourceInputs(fixture.project, "ProxmoxProxy", "scale-member", {
      apiEndpoint: "https://127.0.0.1:8006",
      node: "pve1",
      templateVmid: 9000,
      diskStorage: "local-lvm",
      seedStorage: "seeds",
      userData: "#cloud-config\nruncmd: [echo scale]\n",
    });
    fleet = await startProxmoxFleet(fixture.project, member.inputs, NODES);
    const sims = fleet.sims;
    const members = await fleet.growTo(MEMBERS);
    const simOf = (stored: StoredMember): PveSimulator =>
      sims.find((sim) => stored.id.startsWith(`nodes/${sim.node}/`))!;
    const vmidOf = (stored: StoredMember): number => Number(stored.outputs.vmid);
    // Three members on three different nodes, changed behind the provider's back.
    const [cored, paused, seedless] = [members[5]!, members[10]!, members[15]!];
    const cores = Number(cored.outputs.cores) + 1;
    simOf(cored).vms.get(vmidOf(cored))!.config.cores = String(cores);
    simOf(paused).pauseVm(vmidOf(paused));
    simOf(seedless).storages.get("seeds")!.files.delete(String(seedless.outputs.seedVolume));

    const server = await fixture.startServer({ config: fleet.config });
    const logStart = sims.map((sim) => sim.requestLog.length);
    const parallel = engineDefaultParallelism(process.env, availableParallelism());
    const { replies, wallMs } = await refreshAsEngine(server, members, parallel);

    const drift = new Map<string, string[]>();
    replies.forEach((reply, index) => {
      const stored = members[index]!;
      assert.equal(reply.id, stored.id, `${stored.urn} keeps its id`);
      const changed = changedKeys(stored.outputs, reply.properties);
      if (changed.length > 0) drift.set(stored.urn, changed);
    });
    assert.deepEqual(
      drift,
      new Map([
        [cored.urn, ["cores"]],
        [paused.urn, ["state"]],
        [seedless.urn, [REPLACE_BECAUSE_KEY]],
      ]),
      "drift on the three changed out of band, and on nothing else",
    );
    const replyOf = (stored: StoredMember) => replies[members.indexOf(stored)]!;
    assert.equal(replyOf(cored).properties.cores, cores);
    assert.equal(replyOf(cored).inputs.cores, cores, "the next up proposes the change back");
    assert.equal(replyOf(paused).properties.state, "paused");
    assert.match(
      String(replyOf(seedless).properties[REPLACE_BECAUSE_KEY]),
      /seed .*-seed\.iso gone/,
    );

    const perNode = sims.map((sim, index) => {
      const requests = sim.requestLog.slice(logStart[index]);
      const count = (pattern: RegExp) => requests.filter((line) => pattern.test(line)).length;
      const onNode = members.filter((stored) => simOf(stored) === sim).length;
      return {
        node: sim.node,
        vmIndex: count(/^GET \/api2\/json\/nodes\/[^/]+\/qemu$/),
        seedListing: count(/^GET \/api2\/json\/nodes\/[^/]+\/storage\/seeds\/content$/),
        statusCurrent: count(/\/status\/current$/),
        configs: count(/\/qemu\/\d+\/config$/),
        perMember: (requests.length - 2) / onNode,
      };
    });
    for (const node of perNode) {
      const seen = `${node.node} in a refresh of ${Math.round(wallMs)} ms: ${JSON.stringify(node)}`;
      assert.equal(node.vmIndex, 1, `one VM index per node (${seen})`);
      assert.equal(node.seedListing, 1, `one seed listing per node (${seen})`);
      assert.equal(node.statusCurrent, 0, `no member asked on its own (${seen})`);
      assert.equal(node.configs, MEMBERS / NODES, `each member's own config (${seen})`);
      assert.ok(node.perMember <= 2, `at most 2 calls per member besides the listings (${seen})`);
    }
  });
});
