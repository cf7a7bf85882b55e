/**
 * Day 2 of a dual-stack proxy through the real dynamic-provider gRPC server:
 * a ProxmoxProxy with ipFamilies ["ipv4", "ipv6"] on the simulator, whose
 * guest reports 127.0.0.2 and, on IPv6, this machine's own global address
 * (traffic to it stays on the host, as loopback's does; ::1 is no address a
 * proxy may have; test-needs: root, for a machine without such an address,
 * see localGlobalIpv6). A squid-like proxy listens on both at one port; an echo
 * service on each family tells the exit address. Refresh must look up the
 * IPv6 address again, re-check each family, and the next `up` must follow
 * the rules for IPv4.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { networkInterfaces } from "node:os";
import { join } from "node:path";
import { inIpv6Prefix } from "../../provider/common/egress-samples";
import { isRoutableIpv6 } from "../../provider/common/ip-families";
import { publishedReadiness } from "../../components/published-checks";
import type { PveSimulator } from "../pve-sim/simulator";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";
import { simulatorProxyArgs, useEngineFixture } from "./engine-fixture";
import {
  captureResourceInputs,
  type CapturedResource,
  type DynamicProviderServer,
} from "./harness";
import { planSummary, refreshThenPlan, type StoredResource } from "./resync";

const AUTH = { user: "crawler", password: "engine dual secret" };
const FREE_ULA = join(__dirname, "..", "..", "..", "test", "lab", "free-ula.py");

/**
 * IPv6 addresses put on `lo` for the test's length; returns the undo. Ctrl-C
 * or a crash before the undo: they go with the process (the test command
 * compares the machine's addresses before and after the run).
 */
function onLoopback(addresses: string[]): () => void {
  const added: string[] = [];
  let removed = false;
  const remove = () => {
    if (removed) return;
    removed = true;
    for (const address of added)
      execFileSync("ip", ["-6", "addr", "del", `${address}/128`, "dev", "lo"]);
  };
  process.once("exit", remove);
  try {
    for (const address of addresses) {
      execFileSync("ip", ["-6", "addr", "add", `${address}/128`, "dev", "lo", "nodad"]);
      added.push(address);
    }
  } catch (error) {
    remove();
    throw error;
  }
  return remove;
}

/**
 * A global IPv6 address of this machine: connections to it never leave the
 * host. A machine without one (IPv4-only networks) gets a unique-local /128
 * on `lo` for the test's length, picked where nothing of the machine's is
 * (test/lab/free-ula.py) and removed in `after`.
 */
function localGlobalIpv6(): { address: string; remove?: () => void } {
  const found = Object.values(networkInterfaces())
    .flat()
    .find((entry) => entry?.family === "IPv6" && isRoutableIpv6(entry.address));
  if (found !== undefined) return { address: found.address };
  const prefix = execFileSync("/usr/bin/python3", [FREE_ULA], { encoding: "utf8" }).trim();
  const address = `${prefix}::2`;
  return { address, remove: onLoopback([address]) };
}

describe("engine: a dual-stack proxy's IPv6 side on refresh and up (ProxmoxProxy, simulator)", function () {
  this.timeout(180_000);
  const fixture = useEngineFixture();
  let v6 = "";
  let removeTestAddress: (() => void) | undefined;
  let guestIpv6: string | null = null;
  let sim: PveSimulator;
  let echo4: RunningServer;
  let echo6: RunningServer;
  let proxy4: ForwardProxy;
  let proxy6: ForwardProxy | undefined;
  let server: DynamicProviderServer;
  let captured: CapturedResource;

  before(async () => {
    ({ address: v6, remove: removeTestAddress } = localGlobalIpv6());
    guestIpv6 = v6;
    sim = await fixture.startSimulator({
      guestAddress: () => "127.0.0.2",
      guestIpv6: () => guestIpv6,
    });
    echo4 = await startEchoServer("127.0.0.1");
    echo6 = await startEchoServer(v6);
    proxy4 = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress: "127.0.0.3" });
    proxy6 = await startForwardProxy({ host: v6, auth: AUTH, port: proxy4.port });
    captured = await captureDualStack("edge-dual");
    server = await fixture.startServer({
      config: { "egress-proxies:proxmoxApiToken": sim.tokenFor() },
    });
  });

  after(async () => {
    await proxy6?.close();
    await proxy4?.close();
    await echo6?.close();
    await echo4?.close();
    removeTestAddress?.();
  });

  /** A dual-stack ProxmoxProxy checking egress on both families, re-checked on refresh. */
  async function captureDualStack(
    name: string,
    egressCheck: Props = {},
  ): Promise<CapturedResource> {
    return await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      name,
      simulatorProxyArgs(sim, {
        ipFamilies: ["ipv4", "ipv6"],
        readiness: { mode: "port", port: proxy4.port },
        egressCheck: {
          url: `http://127.0.0.1:${echo4.port}/`,
          ipv6Url: `http://[${v6}]:${echo6.port}/`,
          proxyAuth: AUTH,
          ...egressCheck,
        },
        egressRecheck: true,
        timeouts: { createSeconds: 60, readySeconds: 8, deleteSeconds: 60 },
      }),
    );
  }

  async function createProxy(): Promise<StoredResource> {
    const checked = await server.check(captured.urn, {}, captured.inputs);
    assert.deepEqual(checked.failures, []);
    const created = await server.create(captured.urn, checked.inputs);
    assert.equal(created.properties.ipv6Address, v6);
    assert.equal(created.properties.egressIpv6, v6);
    return { id: created.id, outputs: created.properties, inputs: checked.inputs };
  }

  async function planAfter(
    stored: StoredResource,
    refreshed: { properties: Props; inputs: Props },
  ) {
    const checked = await server.check(captured.urn, refreshed.inputs, captured.inputs);
    const diff = await server.diff(captured.urn, stored.id, refreshed.properties, checked.inputs);
    return { checked, diff };
  }

  const problemOf = (props: Props) =>
    props.egressProblem as { kind: string; reason: string; families?: string[] } | null;
  const readyOn = (props: Props, family: "ipv4" | "ipv6") =>
    publishedReadiness(
      String(props.state),
      props.checkedAt as string,
      true,
      props.egressProblem,
      family,
    );

  it("healthy on both families: refresh + plan is quiet three times; only checkedAt moves", async () => {
    const stored = await createProxy();
    const rounds = await refreshThenPlan(server, captured.urn, stored, captured.inputs);
    assert.deepEqual(planSummary(rounds), ["none", "none", "none"]);
    for (const { stored: round } of rounds) {
      assert.equal(round.outputs.ipv6Address, v6);
      assert.equal(round.outputs.egressIpv6, v6);
      assert.ok(String(round.outputs.checkedAt) > String(stored.outputs.checkedAt));
      assert.equal(round.outputs.egressProblem, null);
    }
    await server.delete(captured.urn, stored.id, rounds.at(-1)!.stored.outputs);
  });

  it("a changed IPv6 address (and exit address) shows on refresh and is accepted, as for IPv4", async () => {
    const created = await createProxy();
    // State holds what an earlier refresh found; the guest's address has changed since.
    const stored = {
      ...created,
      outputs: { ...created.outputs, ipv6Address: "2001:db8:5::5", egressIpv6: "2001:db8:5::5" },
    };
    const refreshed = await server.read(captured.urn, stored.id, stored.outputs, stored.inputs);
    assert.equal(refreshed.properties.ipv6Address, v6, "looked up again, not kept from state");
    assert.equal(refreshed.properties.egressIpv6, v6, "re-checked through the new address");
    assert.notEqual(refreshed.properties.checkedAt, created.outputs.checkedAt);
    assert.equal(refreshed.properties.egressProblem, null);
    const { diff } = await planAfter(stored, refreshed);
    assert.equal(diff.changes, "none", "accepted: the pool republishes it, nothing is replaced");
    await server.delete(captured.urn, stored.id, refreshed.properties);
  });

  it("a silent IPv6 side is drift of that family: IPv4 stays published, up restarts the VM", async () => {
    const stored = await createProxy();
    const vmid = Number(stored.outputs.vmid);
    await proxy6!.close();
    proxy6 = undefined;
    const refreshed = await server.read(captured.urn, stored.id, stored.outputs, stored.inputs);
    const problem = problemOf(refreshed.properties)!;
    assert.equal(problem.kind, "unanswered");
    assert.deepEqual(problem.families, ["ipv6"]);
    assert.match(problem.reason, /^IPv6: /);
    assert.equal(refreshed.properties.egressIp, "127.0.0.3");
    assert.equal(readyOn(refreshed.properties, "ipv4"), true);
    assert.equal(readyOn(refreshed.properties, "ipv6"), false);
    const { checked, diff } = await planAfter(stored, refreshed);
    assert.deepEqual([diff.changes, diff.replaces], ["some", []]);

    // The restart stops the VM; squid comes back on IPv6 with it.
    const back = (async () => {
      while (sim.vms.get(vmid)!.status !== "stopped") await new Promise((r) => setTimeout(r, 10));
      proxy6 = await startForwardProxy({ host: v6, auth: AUTH, port: proxy4.port });
    })();
    const healed = await server.update(
      captured.urn,
      stored.id,
      refreshed.properties,
      checked.inputs,
    );
    await back;
    assert.equal(healed.egressProblem, null);
    assert.equal(healed.egressIpv6, v6);
    assert.equal(healed.vmid, vmid, "the same VM");
    const rounds = await refreshThenPlan(
      server,
      captured.urn,
      { id: stored.id, outputs: healed, inputs: checked.inputs },
      captured.inputs,
      2,
    );
    assert.deepEqual(planSummary(rounds), ["none", "none"]);
    await server.delete(captured.urn, stored.id, healed);
  });

  it("a prefix spread (egressCheck.ipv6Prefix): create samples the IPv6 side and counts its exit addresses; refresh takes another address of the prefix quietly", async () => {
    // The "VM's" routed prefix: a free ULA /64, some of its addresses on this host.
    const routed = execFileSync("/usr/bin/python3", [FREE_ULA, "--exclude", `${v6}/64`], {
      encoding: "utf8",
    }).trim();
    // A prefix dialer binds any address of a routed prefix (IP_FREEBIND, which Node's sockets cannot
    // ask for): here 24 of its addresses on `lo`, each upstream connection from the next one.
    const sources = Array.from(
      { length: 24 },
      (_, index) => `${routed}::${(index + 16).toString(16)}`,
    );
    const removeSources = onLoopback(sources);
    let spreading: ForwardProxy | undefined;
    try {
      await proxy6?.close();
      proxy6 = undefined;
      let turn = 0;
      spreading = await startForwardProxy({
        host: v6,
        auth: AUTH,
        port: proxy4.port,
        egressAddress: () => sources[turn++ % sources.length]!,
      });
      const prefixed = await captureDualStack("edge-prefix", {
        ipv6Samples: 20,
        ipv6Prefix: { prefix: `${routed}::/64`, mode: "random" },
      });
      const checked = await server.check(prefixed.urn, {}, prefixed.inputs);
      assert.deepEqual(checked.failures, []);
      const created = await server.create(prefixed.urn, checked.inputs);
      const outs = created.properties;
      assert.equal(outs.ipv6Address, v6);
      assert.ok(inIpv6Prefix(String(outs.egressIpv6), `${routed}::/64`), String(outs.egressIpv6));
      assert.ok(Number(outs.egressIpv6Distinct) >= 15, `${String(outs.egressIpv6Distinct)} of 20`);
      assert.equal(outs.egressProblem ?? null, null, "no problem recorded at create");
      // Each refresh sees yet another address of the prefix: that is the spread, not drift.
      const rounds = await refreshThenPlan(
        server,
        prefixed.urn,
        { id: created.id, outputs: outs, inputs: checked.inputs },
        prefixed.inputs,
        2,
      );
      assert.deepEqual(planSummary(rounds), ["none", "none"]);
      for (const { stored: round } of rounds) {
        assert.equal(round.outputs.egressProblem, null);
        assert.equal(round.outputs.egressIpv6, outs.egressIpv6, "the address state holds stays");
      }
      await server.delete(prefixed.urn, created.id, rounds.at(-1)!.stored.outputs);
    } finally {
      await spreading?.close();
      proxy6 = await startForwardProxy({ host: v6, auth: AUTH, port: proxy4.port });
      removeSources();
    }
  });

  it("an IPv6 address the guest lost: refresh reports null and a silent IPv6 side", async () => {
    const stored = await createProxy();
    guestIpv6 = null;
    try {
      const refreshed = await server.read(captured.urn, stored.id, stored.outputs, stored.inputs);
      assert.equal(refreshed.properties.ipv6Address, null);
      assert.equal(refreshed.properties.ip, "127.0.0.2");
      const problem = problemOf(refreshed.properties)!;
      assert.deepEqual([problem.kind, problem.families], ["unanswered", ["ipv6"]]);
      assert.match(problem.reason, /no IPv6 address/);
      assert.equal(readyOn(refreshed.properties, "ipv4"), true);
      const { diff } = await planAfter(stored, refreshed);
      assert.deepEqual([diff.changes, diff.replaces], ["some", []], "the same heal: a restart");
    } finally {
      guestIpv6 = v6;
    }
    await server.delete(captured.urn, stored.id, stored.outputs);
  });
});

type Props = Record<string, unknown>;
