/**
 * The egress check of a prefix spread over a proxy (provider/common/egress-samples.ts):
 * it counts distinct exit addresses, and fails when the dialer does not spread
 * (all from one address in random/pool mode) or does not send from the prefix
 * at all (its fallback to the VM's own address).
 */
import assert from "node:assert/strict";
import { PermanentError } from "../../provider/common/errors";
import { egressCheckSchema } from "../../provider/common/egress";
import {
  DEFAULT_IPV6_SAMPLES,
  inIpv6Prefix,
  sampleIpv6Exits,
} from "../../provider/common/egress-samples";

const proxy = { host: "fd00:1::10", port: 3128 };
const url = "http://[fd00:1::fe]:8080/";

/** A fetch that answers from `answers` in turn, counting its calls. */
function answering(answers: (index: number) => string) {
  let calls = 0;
  return {
    fetch: async () => answers(++calls),
    calls: () => calls,
  };
}

describe("egress check samples of a prefix", () => {
  it("knows which addresses lie in a prefix", () => {
    assert.ok(inIpv6Prefix("fd00:2:3:4::1", "fd00:2:3:4::/64"));
    assert.ok(inIpv6Prefix("fd00:2:3:4:ffff:ffff:ffff:ffff", "fd00:2:3:4::/64"));
    assert.ok(!inIpv6Prefix("fd00:2:3:5::1", "fd00:2:3:4::/64"));
    assert.ok(inIpv6Prefix("fd00:2:3:7f::1", "fd00:2:3::/57"));
    assert.ok(!inIpv6Prefix("fd00:2:3:80::1", "fd00:2:3::/57"));
    assert.ok(!inIpv6Prefix("192.0.2.1", "fd00:2:3:4::/64"));
  });

  it("sends ipv6Samples requests (default 20) and counts the distinct exit addresses", async () => {
    const spread = answering((i) => `fd00:2:3:4::${(i % 7) + 1}`);
    const distinct = await sampleIpv6Exits("fd00:2:3:4::1", spread.fetch, proxy, {
      ipv6Url: url,
      ipv6Prefix: { prefix: "fd00:2:3:4::/64", mode: "random" },
    });
    assert.equal(spread.calls(), DEFAULT_IPV6_SAMPLES - 1, "the first answer counts as a sample");
    assert.equal(distinct, 7);
    const few = answering(() => "fd00:2:3:4::9");
    await sampleIpv6Exits("fd00:2:3:4::1", few.fetch, proxy, {
      ipv6Url: url,
      ipv6Samples: 5,
      ipv6Prefix: { prefix: "fd00:2:3:4::/64", mode: "random" },
    });
    assert.equal(few.calls(), 4);
  });

  it("fails when a random or multi-address pool prefix answered from one address", async () => {
    for (const prefix of [
      { prefix: "fd00:2:3:4::/64", mode: "random" as const },
      { prefix: "fd00:2:3:4::/64", mode: "pool" as const, count: 4 },
    ])
      await assert.rejects(
        sampleIpv6Exits("fd00:2:3:4::5", answering(() => "fd00:2:3:4::5").fetch, proxy, {
          ipv6Url: url,
          ipv6Prefix: prefix,
        }),
        (error: Error) =>
          error instanceof PermanentError &&
          /all 20 requests left from one address, fd00:2:3:4::5, though ipv6Prefix.mode is/.test(
            error.message,
          ),
      );
  });

  it("passes one address in sticky mode, or a pool of one, as long as it is in the prefix", async () => {
    for (const prefix of [
      { prefix: "fd00:2:3:4::/64", mode: "sticky" as const },
      { prefix: "fd00:2:3:4::/64", mode: "pool" as const, count: 1 },
    ])
      assert.equal(
        await sampleIpv6Exits("fd00:2:3:4::5", answering(() => "fd00:2:3:4::5").fetch, proxy, {
          ipv6Url: url,
          ipv6Prefix: prefix,
        }),
        1,
      );
  });

  it("fails when no sample left from the prefix (the dialer's fallback to the VM's own address)", async () => {
    await assert.rejects(
      sampleIpv6Exits("fd00:1::10", answering(() => "fd00:1::10").fetch, proxy, {
        ipv6Url: url,
        ipv6Prefix: { prefix: "fd00:2:3:4::/64", mode: "sticky" },
      }),
      (error: Error) =>
        error instanceof PermanentError &&
        /none of 20 requests left from fd00:2:3:4::\/64 \(seen: fd00:1::10\).*ip -6 route add fd00:2:3:4::\/64 via/.test(
          error.message,
        ),
    );
  });

  it("the schema bounds ipv6Samples and names the field", () => {
    const base = { url: "http://192.0.2.7/", ipv6Url: url };
    assert.ok(egressCheckSchema.safeParse({ ...base, ipv6Samples: 1000 }).success);
    for (const bad of [1, 1001, 2.5]) {
      const parsed = egressCheckSchema.safeParse({ ...base, ipv6Samples: bad });
      assert.ok(!parsed.success);
      assert.match(
        parsed.error.issues[0]!.message,
        /egressCheck.ipv6Samples must be a whole number from 2 to 1000/,
      );
    }
  });
});
