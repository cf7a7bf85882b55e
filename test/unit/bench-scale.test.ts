import assert from "node:assert/strict";
import type { DynamicProviderServer } from "../engine/harness";
import { callsByEndpoint, endpointOf, jsonBytes } from "../bench/scale-measure";
import {
  engineDefaultParallelism,
  refreshAsEngine,
  UNBOUNDED,
  type StoredMember,
} from "../engine/refresh-as-engine";

describe("scale bench: the engine's refresh and its bookkeeping", () => {
  it("takes the CLI's --parallel default: PULUMI_PARALLEL when positive, else 4 × CPUs", () => {
    assert.equal(engineDefaultParallelism({}, 2), 8);
    assert.equal(engineDefaultParallelism({}, 4), 16);
    assert.equal(engineDefaultParallelism({ PULUMI_PARALLEL: "3" }, 4), 3);
    assert.equal(engineDefaultParallelism({ PULUMI_PARALLEL: "0" }, 4), 16);
    assert.equal(engineDefaultParallelism({ PULUMI_PARALLEL: "many" }, 4), 16);
    assert.equal(engineDefaultParallelism({ PULUMI_PARALLEL: "99999999999" }, 4), UNBOUNDED);
  });

  it("folds node, VMID, storage and task into one endpoint per kind of call", () => {
    assert.equal(
      endpointOf("GET /api2/json/nodes/pve1/qemu/21003/status/current"),
      "GET nodes/{node}/qemu/{vmid}/status/current",
    );
    assert.equal(
      endpointOf("GET /api2/json/nodes/pve2/storage/seeds/content"),
      "GET nodes/{node}/storage/{storage}/content",
    );
    assert.equal(
      endpointOf("GET /api2/json/nodes/pve/tasks/UPID:pve:00003000:1/status"),
      "GET nodes/{node}/tasks/{upid}/status",
    );
    assert.equal(endpointOf("GET /api2/json/cluster/resources"), "GET cluster/resources");
  });

  it("counts calls by endpoint, most asked first", () => {
    assert.deepEqual(
      callsByEndpoint([
        "GET /api2/json/nodes/pve1/qemu/1/config",
        "GET /api2/json/cluster/resources",
        "GET /api2/json/nodes/pve2/qemu/2/config",
      ]),
      [
        ["GET nodes/{node}/qemu/{vmid}/config", 2],
        ["GET cluster/resources", 1],
      ],
    );
  });

  it("counts state in UTF-8 bytes of its JSON", () => {
    assert.equal(jsonBytes({ a: "é" }), 10);
  });

  it("reads every member with at most `parallel` Reads in flight, replies in the members' order", async () => {
    let inFlight = 0;
    let most = 0;
    const server = {
      async read(urn: string, id: string) {
        inFlight++;
        most = Math.max(most, inFlight);
        await new Promise((resolve) => setTimeout(resolve, 1 + (Number(id) % 3)));
        inFlight--;
        return { id, properties: { urn }, inputs: {} };
      },
    } as unknown as DynamicProviderServer;
    const members: StoredMember[] = Array.from({ length: 20 }, (_, index) => ({
      urn: `urn-${index}`,
      id: String(index),
      outputs: {},
      inputs: {},
    }));
    const { replies } = await refreshAsEngine(server, members, 3);
    assert.equal(most, 3);
    assert.deepEqual(
      replies.map((reply) => reply.id),
      members.map((member) => member.id),
    );
    most = 0;
    await refreshAsEngine(server, members, UNBOUNDED);
    assert.equal(most, 20);
  });
});
