/**
 * A routed IPv6 prefix spread over one squid VM, in the lab (one TCG guest,
 * test/lab/prefix-support.ts): a free unique-local /64 routed from this
 * machine's lab leg to the VM's static IPv6 address; the VM runs squid with
 * the prefix dialer (mode random). 1000 requests through it to the echo
 * service on this machine's lab leg must show at least 900 distinct source
 * addresses, all in the prefix, and the egress check at create must have
 * counted more than one. The guest has no package mirror: squid and python3
 * are in the lab image, and cloud-init's `packages` must not fail on them
 * offline. The guest, the route, the echo servers and the cached base image
 * are removed in `after`, also when a test fails.
 */
import assert from "node:assert/strict";
import { inIpv6Prefix } from "../../provider/common/egress-samples";
// The lab fixture's root hook: what this run brought up, it takes down.
import "./fixture";
import { inGuest } from "./kvm-support";
import {
  createLabProxy,
  manyThroughProxy,
  startPrefixLab,
  stopPrefixLab,
  type LabProxy,
  type PrefixLab,
} from "./prefix-support";

const REQUESTS = 1000;
const CONCURRENCY = 16;

describe("a routed IPv6 prefix spread over one proxy, in the lab", function () {
  this.timeout(900_000);
  let env: PrefixLab | undefined;
  let proxy: LabProxy;

  before(async () => {
    env = await startPrefixLab();
    proxy = await createLabProxy(env, "pfx", true);
  });

  after(async function () {
    this.timeout(300_000);
    if (env !== undefined) await stopPrefixLab(env);
  });

  it("the VM took its static IPv6 address, and the egress check saw the prefix spread", () => {
    const outs = proxy.outs;
    assert.equal(outs.ipv6Address, proxy.ipv6);
    assert.ok(
      inIpv6Prefix(String(outs.egressIpv6), env!.routed),
      `${outs.egressIpv6} in ${env!.routed}`,
    );
    assert.equal(typeof outs.egressIpv6Distinct, "number");
    assert.ok(Number(outs.egressIpv6Distinct) > 1, `distinct: ${outs.egressIpv6Distinct}`);
  });

  it("cloud-init finished without an error offline (squid and python3 are in the image)", async () => {
    const status = await inGuest(env!.lab, String(proxy.outs.vmName), "/usr/bin/cloud-init", [
      "status",
      "--long",
    ]);
    assert.match(status.out, /status: done/, status.out);
    assert.equal(status.exitcode, 0, status.out);
  });

  it(`${REQUESTS} requests through the proxy leave from at least 900 addresses of the prefix`, async () => {
    const { answers } = await manyThroughProxy(
      { host: String(proxy.outs.ip), port: 3128 },
      `http://[${env!.hostIpv6}]:${env!.echo6.port}/`,
      REQUESTS,
      CONCURRENCY,
    );
    const outside = answers.filter((address) => !inIpv6Prefix(address, env!.routed));
    const distinct = new Set(answers).size;
    process.stdout.write(`      ${distinct} distinct of ${REQUESTS}, ${outside.length} outside\n`);
    assert.equal(answers.length, REQUESTS);
    assert.deepEqual(outside.slice(0, 5), [], "every request left from the prefix");
    assert.ok(distinct >= 900, `${distinct} distinct source addresses of ${REQUESTS}`);
  });
});
