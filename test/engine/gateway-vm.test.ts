/**
 * The gateway VM through the real dynamic-provider gRPC server, as a
 * ProxmoxProxy on the simulator, with the software the pool gives it
 * (workloads/gateway/vm.ts): created with its members in its configuration;
 * then a member rotated (one key gone, another new): the `up` updates the
 * gateway VM in place (same VMID), its guest gets the new squid.conf through
 * agent/file-write and its commands through agent/exec (squid's parse before
 * its reload); a configuration squid refuses stops at the parse, the previous
 * files go back, and the error shows squid's complaint with the members'
 * credentials hidden (the guest's own shell does the hiding: the refusal
 * command runs here in sh, against a squid that refuses).
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { GatewayMember } from "../../workloads/gateway/squid-gateway";
import { gatewayVmSoftware } from "../../workloads/gateway/vm";
import type { PveSimulator } from "../pve-sim/simulator";
import { simulatorProxyArgs, useEngineFixture } from "./engine-fixture";
import { captureResourceInputs, type Props } from "./harness";
import { planSummary, type StoredResource } from "./resync";

const MEMBER_LOGIN = { user: "member", password: "member secret:1" };
const member = (index: number): GatewayMember => ({
  name: `pve-${index}`,
  address: `10.9.0.${10 + index}`,
  port: 3128,
  labels: ["pve"],
  login: MEMBER_LOGIN,
});
const software = (members: GatewayMember[]) =>
  gatewayVmSoftware({
    port: 3128,
    allowedClientCidrs: ["10.0.0.0/8"],
    users: [{ name: "crawler", password: "crawler-password-1" }],
    members,
  });

describe("engine: the gateway VM follows its members in place (ProxmoxProxy, simulator, guest agent)", function () {
  this.timeout(180_000);
  const fixture = useEngineFixture();
  let sim: PveSimulator;
  let config: Record<string, string>;
  let scratch: string;

  before(async () => {
    sim = await fixture.startSimulator({ guestListens: () => [22, 3128] });
    config = { "egress-proxies:proxmoxApiToken": sim.tokenFor() };
    scratch = mkdtempSync(join(tmpdir(), "gateway-vm-"));
  });
  after(() => rmSync(scratch, { recursive: true, force: true }));

  const capture = async (members: GatewayMember[]) =>
    captureResourceInputs(fixture.project, "ProxmoxProxy", "crawl-gateway", {
      ...simulatorProxyArgs(sim),
      ...software(members),
    } as Props);
  const squidConfOf = (vmid: unknown) =>
    sim.guestFiles.get(Number(vmid))?.get("/etc/squid/squid.conf")?.toString() ?? "";
  const peersIn = (text: string) =>
    [...text.matchAll(/^cache_peer \S+ parent 3128 0 round-robin name=(\S+)/gm)].map((m) => m[1]);

  /** One `up` of the gateway alone: check, diff, and the update it plans. */
  async function up(stored: StoredResource, members: GatewayMember[]) {
    const program = await capture(members);
    const provider = await fixture.startServer({ config, engine: await fixture.startEngine() });
    const checked = await provider.check(program.urn, stored.inputs, program.inputs);
    assert.deepEqual(checked.failures, []);
    const diff = await provider.diff(program.urn, stored.id, stored.outputs, checked.inputs);
    const summary = planSummary([{ diff, stored: undefined as never }])[0];
    const update = () =>
      provider
        .update(program.urn, stored.id, stored.outputs, checked.inputs)
        .then((outputs): StoredResource => ({ id: stored.id, outputs, inputs: checked.inputs }));
    return { summary, update };
  }

  it("a member rotated: the gateway VM is updated in place, its squid.conf names the new member and not the old", async () => {
    const first = await capture([member(0), member(1)]);
    const provider = await fixture.startServer({ config, engine: await fixture.startEngine() });
    const checked = await provider.check(first.urn, {}, first.inputs);
    assert.deepEqual(checked.failures, []);
    const created = await provider.create(first.urn, checked.inputs);
    let stored: StoredResource = {
      id: created.id,
      outputs: created.properties,
      inputs: checked.inputs,
    };
    const vmid = stored.outputs.vmid;

    // pve-1 rotated out, pve-2 in: what the engine asks of the gateway before it deletes pve-1.
    const rotated = await up(stored, [member(0), member(2)]);
    assert.equal(rotated.summary, "some (replaces: )", "updated, not replaced");
    stored = await rotated.update();
    assert.equal(stored.outputs.vmid, vmid, "the same VM");
    assert.deepEqual(peersIn(squidConfOf(vmid)), ["pve-0", "pve-2"]);
    const commands = sim.guestCommands
      .filter((run) => run.vmid === Number(vmid))
      .map((run) => run.argv.join(" "));
    assert.match(commands.at(-2)!, /squid -k parse -f \/etc\/squid\/squid\.conf/);
    assert.equal(commands.at(-1), "systemctl reload-or-restart squid");
    // Nothing more to do.
    assert.equal((await up(stored, [member(0), member(2)])).summary, "none");

    // squid refuses the next file: the parse fails in the guest, the previous files go back.
    const fakeBin = join(scratch, "bin");
    spawnSync("mkdir", ["-p", fakeBin]);
    writeFileSync(
      join(fakeBin, "squid"),
      `#!/bin/sh\necho "2026/12/05 12:00:00| Processing: cache_peer 10.9.0.13 parent 3128 0 login=member:member%20secret%3A1" >&2\n` +
        `echo "2026/12/05 12:00:00| FATAL: Bungled /etc/squid/squid.conf line 40: cache_peer 10.9.0.13 parent 3128 0 login=member:member%20secret%3A1" >&2\nexit 1\n`,
    );
    chmodSync(join(fakeBin, "squid"), 0o755);
    sim.guestExec = (_vmid, argv) => {
      if (!argv.join(" ").includes("squid -k parse")) return { exitCode: 0 };
      const ran = spawnSync(argv[0]!, argv.slice(1), {
        encoding: "utf8",
        env: { PATH: `${fakeBin}:/usr/bin:/bin` },
      });
      return { exitCode: ran.status ?? 1, stderr: ran.stderr };
    };
    try {
      const refused = await up(stored, [member(0), member(2), member(3)]);
      await assert.rejects(refused.update(), (error: Error) => {
        assert.match(error.message, /FATAL: Bungled \/etc\/squid\/squid\.conf line 40/);
        assert.match(error.message, /login=\(hidden\)/);
        assert.doesNotMatch(error.message, /member%20secret|Processing:/);
        return true;
      });
      assert.deepEqual(
        peersIn(squidConfOf(vmid)),
        ["pve-0", "pve-2"],
        "the previous files are back",
      );
    } finally {
      sim.guestExec = () => ({ exitCode: 0 });
    }
  });
});
