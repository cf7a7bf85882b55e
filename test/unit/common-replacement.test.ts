/**
 * The pure rules of the day-2 heal (common/replacement.ts) and of the way out
 * of a stuck delete (common/gone-hosts.ts). The lab and simulator suites
 * engine/kvm-heal and engine/proxmox-heal prove them end to end.
 */
import assert from "node:assert/strict";
import {
  GONE_HOSTS_CONFIG_KEY,
  isGoneForGood,
  parseGoneHosts,
  rememberGoneHosts,
  withWayOut,
} from "../../provider/common/gone-hosts";
import { PermanentError, TransientError } from "../../provider/common/errors";
import {
  REPLACE_BECAUSE_KEY,
  ReplaceOnNextUpError,
  replacementReason,
  withRepairReplacement,
  withReplacementReason,
} from "../../provider/common/replacement";

describe("replacement of a VM an update cannot heal", () => {
  const inPlace = { changes: true, replaces: [], deleteBeforeReplace: false };

  it("leaves the decision alone when the old outputs carry no reason", () => {
    assert.deepEqual(withRepairReplacement(inPlace, {}), inPlace);
    assert.deepEqual(withRepairReplacement(inPlace, { [REPLACE_BECAUSE_KEY]: "" }), inPlace);
  });

  it("turns any decision into a delete-first replacement when they do", () => {
    const olds = { [REPLACE_BECAUSE_KEY]: "disk gone" };
    assert.deepEqual(withRepairReplacement({ ...inPlace, changes: false }, olds), {
      changes: true,
      replaces: [REPLACE_BECAUSE_KEY],
      deleteBeforeReplace: true,
    });
    assert.deepEqual(
      withRepairReplacement(
        { changes: true, replaces: ["vcpus"], deleteBeforeReplace: false },
        olds,
      ).replaces,
      ["vcpus", REPLACE_BECAUSE_KEY],
    );
  });

  it("sets and clears the reason without leaving a null key", () => {
    const marked = withReplacementReason({ a: 1 }, "why");
    assert.equal(replacementReason(marked), "why");
    assert.deepEqual(withReplacementReason(marked, undefined), { a: 1 });
  });

  it("records a restarted VM that was not ready as running, unaddressed, unchecked, marked, with its provider", () => {
    const error = new ReplaceOnNextUpError(
      "hosts/h/domains/v",
      { state: "running", ip: "10.0.0.5", endpoint: "http://10.0.0.5:3128", checkedAt: "then" },
      "it was not ready 60 s after `up` started it again",
      new TransientError("readiness timed out"),
      { __provider: "code" },
    );
    assert.equal(error.id, "hosts/h/domains/v");
    assert.match(
      error.message,
      /readiness timed out; it was not ready 60 s .*next `pulumi up` replaces it/,
    );
    assert.deepEqual(error.properties, {
      state: "running",
      ip: null,
      endpoint: null,
      egressIp: null,
      checkedAt: null,
      [REPLACE_BECAUSE_KEY]: "it was not ready 60 s after `up` started it again",
      __provider: "code",
    });
  });
});

describe("hosts gone for good (egress-proxies:goneHosts)", () => {
  afterEach(() => rememberGoneHosts(undefined));

  it("reads a comma- or space-separated list, or a JSON array, case-insensitively", () => {
    assert.deepEqual(parseGoneHosts(" kvm9.example.com, PVE2:8006  10.0.0.5 "), [
      "kvm9.example.com",
      "pve2:8006",
      "10.0.0.5",
    ]);
    assert.deepEqual(parseGoneHosts('["kvm9", "kvm10:2222"]'), ["kvm9", "kvm10:2222"]);
    assert.deepEqual(parseGoneHosts(undefined), []);
    assert.deepEqual(parseGoneHosts("  "), []);
  });

  it("matches any of the ways a host is written, and nothing when unset", () => {
    assert.equal(isGoneForGood(["kvm9"]), false);
    rememberGoneHosts({ get: (key) => (key === GONE_HOSTS_CONFIG_KEY ? "KVM9" : undefined) });
    assert.equal(isGoneForGood(["kvm9:2222", "kvm9"]), true);
    assert.equal(isGoneForGood(["kvm10"]), false);
  });

  it("names the way out on a delete that ran out of time, and only then", () => {
    const timedOut = withWayOut(new TransientError("delete v did not finish within 10 s"), "kvm9");
    assert.match(String(timedOut), /if kvm9 is gone for good, list it in egress-proxies:goneHosts/);
    const refused = new PermanentError("not ours");
    assert.equal(withWayOut(refused, "kvm9"), refused);
  });
});
