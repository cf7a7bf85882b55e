/**
 * Readiness of an existing proxy, as for a VM proxy: its port accepts TCP,
 * then (with probeUrl) a request through it, with the URL's credentials,
 * answers 2xx-3xx. A 407 is Permanent: the credentials are wrong, and
 * waiting cannot fix them.
 */
import { sleepWithin, type Deadline } from "../common/deadline";
import { PermanentError, TransientError } from "../common/errors";
import { describeAnswer } from "../common/egress";
import { fetchThroughProxy } from "../common/proxy-probe";
import { waitForTcpPort } from "../common/readiness";
import type { ProxyAddress } from "./schema";

export async function waitUntilServing(
  proxy: ProxyAddress,
  readiness: { mode: "port" | "none"; probeUrl?: string },
  deadline: Deadline,
): Promise<void> {
  if (readiness.mode === "none") return;
  await waitForTcpPort(proxy.host, proxy.port, deadline);
  if (readiness.probeUrl === undefined) return;
  let last = "no attempt";
  while (deadline.remainingMs() > 0) {
    try {
      const answer = await fetchThroughProxy(
        proxy,
        readiness.probeUrl,
        deadline.capped(10_000),
        proxy.credentials,
      );
      if (answer.status === 407)
        throw new PermanentError(
          `the proxy at ${proxy.endpoint} refused ${proxy.credentials === undefined ? "a request without credentials; put user:password@ in url" : "the url's credentials"} (${describeAnswer(answer)})`,
        );
      if (answer.status >= 200 && answer.status < 400) return;
      last = describeAnswer(answer);
    } catch (error) {
      if (error instanceof PermanentError) throw error;
      last = (error as Error).message;
    }
    await sleepWithin(2000, deadline);
  }
  throw new TransientError(
    `a request to readiness.probeUrl through the proxy at ${proxy.endpoint} did not succeed in time (last: ${last}); raise timeouts.readySeconds if the proxy is just slow`,
  );
}
