/**
 * When a KvmProxy is ready: the address from the VM's own NIC (the guest
 * agent, matched by MAC), then, by readiness.mode, the proxy port and an
 * optional request through it. Used by create and by an update that starts
 * a stopped VM again.
 */
import { type Deadline, sleepWithin } from "../common/deadline";
import { isPermanent } from "../common/errors";
import { deadlineFor, earlier } from "../common/lifecycle";
import { familiesOf } from "../common/ip-families";
import { fetchThroughProxy, type ProxyCredentials } from "../common/proxy-probe";
import { waitForProxyAuthRequired, waitForTcpPort } from "../common/readiness";
import type { DomainHandle } from "../libvirt-rpc-xdr";
import { lookUpAddress } from "./addresses";
import type { LibvirtHost } from "./host";
import { macAddressFor } from "./naming";
import type { KvmProxyInputs } from "./schema";

/** The proxy's addresses once ready: `ip` is the one clients use first (IPv4 unless it has none). */
export interface ReadyAddresses {
  ip: string;
  /** With "ipv6" in ipFamilies: the VM's IPv6 address (equal to `ip` for an IPv6-only proxy). */
  ipv6?: string;
}

/**
 * Waits for the addresses of the VM's own NIC (each family it takes), then
 * (by readiness.mode) for the proxy port on each of them: squid must answer
 * over every family the proxy is published with.
 */
export async function waitForReadiness(
  host: LibvirtHost,
  dom: DomainHandle,
  inputs: KvmProxyInputs,
  createDeadline: Deadline,
): Promise<ReadyAddresses | null> {
  if (inputs.readiness.mode === "none") return null;
  const deadline = earlier(createDeadline, deadlineFor(inputs.timeouts, "ready"));
  const mac = macAddressFor(inputs.vmName);
  const families = familiesOf(inputs);
  const wanted = { ...families, settings: inputs.ipv6 };
  let found: { ip: string | undefined; ipv6?: string } = { ip: undefined };
  while (found.ip === undefined || (families.ipv6 && found.ipv6 === undefined)) {
    // "Agent not connected yet" is the normal state of a booting VM, not an error.
    found = await lookUpAddress(mac, (source) => host.interfaces(dom, source), wanted);
    if (found.ip === undefined || (families.ipv6 && found.ipv6 === undefined)) {
      if (deadline.remainingMs() < 2000)
        throw deadline.timeoutError(
          `the guest agent reporting ${inputs.vmName}'s ${found.ip === undefined ? "address" : "IPv6 address (SLAAC needs router advertisements on its network)"}`,
        );
      await sleepWithin(2000, deadline);
    }
  }
  const ip = found.ip;
  const ipv6 = found.ipv6;
  if (inputs.readiness.mode === "port") {
    await waitForTcpPort(ip, inputs.readiness.port, deadline);
    if (ipv6 !== undefined && ipv6 !== ip)
      await waitForTcpPort(ipv6, inputs.readiness.port, deadline);
    if (inputs.readiness.authRequired === true)
      for (const address of new Set([ip, ...(ipv6 === undefined ? [] : [ipv6])]))
        await waitForProxyAuthRequired(address, inputs.readiness.port, deadline);
    if (inputs.readiness.probeUrl !== undefined)
      await waitForProxyProbe(
        ip,
        inputs.readiness.port,
        inputs.readiness.probeUrl,
        deadline,
        inputs.egressCheck?.proxyAuth,
      );
  }
  return ipv6 === undefined ? { ip } : { ip, ipv6 };
}

/**
 * The proxy is ready when a request through it succeeds; squid may answer 503
 * while it finishes starting. A proxy that asks for credentials gets the
 * egress check's (the pool's members require basic auth).
 */
export async function waitForProxyProbe(
  ip: string,
  port: number,
  url: string,
  deadline: Deadline,
  credentials: ProxyCredentials | undefined,
): Promise<void> {
  let last = "no attempt";
  while (deadline.remainingMs() > 0) {
    try {
      const { status } = await fetchThroughProxy(
        { host: ip, port },
        url,
        deadline.capped(10_000),
        credentials,
      );
      if (status >= 200 && status < 400) return;
      last =
        status === 407
          ? `HTTP 407: the proxy asks for credentials; ${credentials === undefined ? "set" : "check"} egressCheck.proxyAuth`
          : `HTTP ${status}`;
    } catch (error) {
      last = (error as Error).message;
    }
    await sleepWithin(2000, deadline);
  }
  throw deadline.timeoutError(
    `a request to readiness.probeUrl through the proxy at ${ip}:${port} (last: ${last})`,
  );
}

/**
 * Readiness of a VM that `up` started again. When its readiness budget runs
 * out (not a dropped link, not a refusal), restarting it did not heal it: the
 * error `replace` makes records it for replacement at the next `up`
 * (common/replacement.ts).
 */
export async function readyAfterRestart(
  host: LibvirtHost,
  dom: DomainHandle,
  inputs: KvmProxyInputs,
  updateDeadline: Deadline,
  replace: (reason: string, cause: Error) => Error,
): Promise<ReadyAddresses | null> {
  const readyDeadline = earlier(updateDeadline, deadlineFor(inputs.timeouts, "ready"));
  const startedAt = Date.now();
  try {
    return await waitForReadiness(host, dom, inputs, readyDeadline);
  } catch (error) {
    // waitForReadiness gives up with less than its 2 s poll left.
    if (isPermanent(error) || readyDeadline.remainingMs() > 2500) throw error;
    const spent = Math.round((Date.now() - startedAt) / 1000);
    return Promise.reject(
      replace(`it was not ready ${spent} s after \`up\` started it again`, error as Error),
    );
  }
}
