/**
 * The shared lifecycle (provider/common/lifecycle.ts) on its own: the step
 * runner's retry rule, the ownership check's verdicts and wording, update's
 * carried outputs, continued creates and the partial-create record.
 */
import assert from "node:assert/strict";
import { Deadline } from "../../provider/common/deadline";
import { errorClassOf, PermanentError, TransientError } from "../../provider/common/errors";
import {
  carriedOutputs,
  continueCreate,
  deadlineFor,
  inputsOnly,
  recordingPartialCreate,
  requireOurs,
  stepsWithin,
} from "../../provider/common/lifecycle";
import { createMark } from "../../provider/common/mark";
import { PartialCreateError } from "../../provider/common/partial-create";

const owner = { project: "web", stack: "prod", resource: "edge" };
const question = {
  resource: "KvmProxy",
  subject: "domain web-1 on kvm1",
  owner,
  markPlace: "metadata",
  fixForeign: "choose another vmName",
  fixUnmarked: "choose another vmName",
  inspect: "inspect it with virsh metadata",
};

describe("shared lifecycle", () => {
  it("retries a Transient step until it succeeds, saying so, and ends a Permanent one at once", async () => {
    const said: string[] = [];
    const step = stepsWithin(new Deadline(10_000, "timeouts.createSeconds"), (m) => said.push(m));
    let calls = 0;
    const value = await step("start", async () => {
      calls++;
      if (calls < 3) throw new TransientError("link dropped");
      return "up";
    });
    assert.deepEqual([value, calls, said.length], ["up", 3, 2]);
    assert.match(said[0]!, /^start: link dropped; retrying$/);
    let permanentCalls = 0;
    await assert.rejects(
      step("define", async () => {
        permanentCalls++;
        throw new PermanentError("bad XML");
      }),
      /bad XML/,
    );
    assert.equal(permanentCalls, 1);
  });

  it("gives up on a Transient step at the deadline with an error naming the setting", async () => {
    const step = stepsWithin(new Deadline(300, "timeouts.deleteSeconds"));
    const error = await step("delete", async () => {
      throw new TransientError("host busy");
    }).then(
      () => assert.fail("succeeded"),
      (caught: Error) => caught,
    );
    assert.equal(errorClassOf(error), "Transient");
    assert.match(error.message, /delete did not finish .*raise timeouts\.deleteSeconds/);
  });

  it("takes each operation's deadline from timeouts; read is capped at two minutes", () => {
    const timeouts = { createSeconds: 900, readySeconds: 600, deleteSeconds: 300 };
    assert.equal(deadlineFor(timeouts, "create").budgetMs, 900_000);
    assert.equal(deadlineFor(timeouts, "delete").setting, "timeouts.deleteSeconds");
    assert.equal(deadlineFor(timeouts, "read").budgetMs, 120_000);
    assert.equal(deadlineFor({ ...timeouts, readySeconds: 30 }, "read").budgetMs, 30_000);
  });

  it("requireOurs: ours passes; another stack's, an unmarked and an unreadable mark are refused with the fix", () => {
    const mark = createMark(owner);
    assert.equal(requireOurs({ kind: "marked", mark }, question), mark);
    const theirs = createMark({ ...owner, stack: "dev" });
    assert.throws(
      () => requireOurs({ kind: "marked", mark: theirs }, question),
      (error: Error) =>
        errorClassOf(error) === "Permanent" &&
        /belongs to web\/dev .*not to web\/prod; choose another vmName/.test(error.message),
    );
    assert.throws(
      () => requireOurs({ kind: "marked", mark: theirs }, { ...question, adopting: true }),
      /only the stack that owns it can adopt it with KvmProxy\.get/,
    );
    assert.throws(
      () => requireOurs({ kind: "unmarked" }, { ...question, adopting: true }),
      /no egress-proxies mark in its metadata \(no ownership mark\).*KvmProxy\.get cannot adopt it/,
    );
    assert.throws(
      () => requireOurs({ kind: "corrupt", reason: "createdAt is missing" }, question),
      /unreadable ownership mark \(createdAt is missing\); inspect it with virsh metadata/,
    );
  });

  it("update carries what only the backend knows, endpoint following the readiness port", () => {
    const olds = { host: "kvm1", ip: "198.51.100.7", endpoint: "http://198.51.100.7:3128", x: 1 };
    const outs = carriedOutputs(olds, { readiness: { port: 8080 }, y: 2 }, [
      "host",
      "ip",
      "endpoint",
      "egressIp",
    ]);
    assert.deepEqual(outs, {
      readiness: { port: 8080 },
      y: 2,
      host: "kvm1",
      ip: "198.51.100.7",
      endpoint: "http://198.51.100.7:8080",
      egressIp: null,
    });
    assert.deepEqual(
      inputsOnly({ a: 1, ip: "x", createIncomplete: true, __provider: "p" }, ["ip"]),
      {
        a: 1,
      },
    );
  });

  it("a partial create's record carries the request's serialized provider; a continued create must keep its id", async () => {
    const error = await recordingPartialCreate({ __provider: "serialized" }, async () => {
      throw new PartialCreateError(
        "hosts/kvm1/domains/a",
        { ip: null },
        new TransientError("late"),
      );
    }).then(
      () => assert.fail("succeeded"),
      (caught: PartialCreateError) => caught,
    );
    assert.deepEqual(error.properties, {
      ip: null,
      createIncomplete: true,
      __provider: "serialized",
    });
    await assert.rejects(
      continueCreate("hosts/kvm1/domains/a", {}, async () => ({
        id: "hosts/kvm2/domains/a",
        outs: {},
      })),
      /continuing the create of hosts\/kvm1\/domains\/a reached hosts\/kvm2\/domains\/a/,
    );
    assert.deepEqual(await continueCreate("i", {}, async () => ({ id: "i", outs: { ok: true } })), {
      outs: { ok: true },
    });
  });
});
