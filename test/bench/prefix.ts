/**
 * A routed IPv6 prefix spread over one proxy, on the lab (two TCG guests,
 * test/lab/prefix-support.ts): one squid VM with the prefix dialer (mode
 * random) and its /64 routed to it, one plain squid VM beside it. Prints
 * `bench prefix_exit_addresses_per_1000=<n>` (distinct source addresses the
 * echo service on the lab leg saw in 1000 requests through the prefix proxy,
 * 16 at a time) and `bench prefix_added_latency_ms=<ms>`: the median time of
 * one request through the prefix proxy minus that through the plain one (200
 * requests each, one at a time, so the figure is the dialer's extra hop and
 * bind, not queueing). Both guests are emulated (TCG): absolute times are far
 * above a KVM guest's; the difference is what the dialer adds there.
 */
import { stopWhatThisProcessStarted } from "../lab/lab";
import {
  createLabProxy,
  manyThroughProxy,
  startPrefixLab,
  stopPrefixLab,
} from "../lab/prefix-support";
import { median, printBench } from "./measure";

const LATENCY_ROUNDS = 200;

export async function runPrefixBenchmarks(): Promise<void> {
  const env = await startPrefixLab();
  try {
    const [spread, plain] = await Promise.all([
      createLabProxy(env, "bench-pfx", true),
      createLabProxy(env, "bench-one", false),
    ]);
    const url = `http://[${env.hostIpv6}]:${env.echo6.port}/`;
    const through = (proxy: typeof spread) => ({ host: String(proxy.outs.ip), port: 3128 });
    const many = await manyThroughProxy(through(spread), url, 1000, 16);
    printBench("prefix_exit_addresses_per_1000", new Set(many.answers).size);
    // Warm both (squid's first requests pay for its start), then alternate so load hits both alike.
    await manyThroughProxy(through(plain), url, 20, 1);
    const spreadMs: number[] = [];
    const plainMs: number[] = [];
    for (let round = 0; round < LATENCY_ROUNDS; round++) {
      spreadMs.push(...(await manyThroughProxy(through(spread), url, 1, 1)).ms);
      plainMs.push(...(await manyThroughProxy(through(plain), url, 1, 1)).ms);
    }
    printBench("prefix_request_ms", median(spreadMs));
    printBench("single_address_request_ms", median(plainMs));
    printBench("prefix_added_latency_ms", median(spreadMs) - median(plainMs));
  } finally {
    await stopPrefixLab(env);
    await stopWhatThisProcessStarted();
  }
}
