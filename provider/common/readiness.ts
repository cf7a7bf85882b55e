import { connect } from "node:net";
import { Deadline, sleepWithin } from "./deadline";
import { fetchThroughProxy } from "./proxy-probe";

/**
 * Readiness: the proxy is ready when its port accepts a TCP connection. Each
 * attempt has its own short timeout so a silently dropped SYN cannot eat the
 * whole budget; attempts repeat until the deadline.
 */
export async function waitForTcpPort(
  host: string,
  port: number,
  deadline: Deadline,
  options: { attemptTimeoutMs?: number; pauseMs?: number } = {},
): Promise<void> {
  const attemptTimeoutMs = options.attemptTimeoutMs ?? 3000;
  const pauseMs = options.pauseMs ?? 1000;
  let lastError: unknown;
  while (!deadline.expired()) {
    try {
      await tryTcpConnect(host, port, deadline.capped(attemptTimeoutMs));
      return;
    } catch (error) {
      lastError = error;
      await sleepWithin(pauseMs, deadline);
    }
  }
  throw deadline.timeoutError(`port ${port} on ${host} accepting connections`, lastError);
}

/**
 * Readiness of a proxy whose configuration demands credentials: its port
 * accepting connections is not enough when a package starts the proxy with
 * its own default configuration before cloud-init writes ours (Debian's
 * squid listens on 3128 from the first boot and answers 403), so the proxy
 * is ready when a request without credentials is answered 407. The target is
 * never reached: authentication comes first (`.invalid` never resolves).
 */
export async function waitForProxyAuthRequired(
  host: string,
  port: number,
  deadline: Deadline,
  options: { attemptTimeoutMs?: number; pauseMs?: number } = {},
): Promise<void> {
  const attemptTimeoutMs = options.attemptTimeoutMs ?? 5000;
  const pauseMs = options.pauseMs ?? 1000;
  let last = "no answer yet";
  while (!deadline.expired()) {
    try {
      const { status, squidError } = await fetchThroughProxy(
        { host, port },
        "http://readiness.invalid/",
        deadline.capped(attemptTimeoutMs),
      );
      if (status === 407) return;
      last = `HTTP ${status}${squidError === undefined ? "" : ` (${squidError})`}`;
    } catch (error) {
      last = (error as Error).message;
    }
    await sleepWithin(pauseMs, deadline);
  }
  throw deadline.timeoutError(
    `the proxy at ${host}:${port} asking for credentials (407: its own configuration serving; last: ${last})`,
  );
}

export function tryTcpConnect(host: string, port: number, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host, port });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no answer from ${host}:${port} within ${timeoutMs} ms`));
    }, timeoutMs);
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.destroy();
      resolve();
    });
    socket.once("error", (error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(error);
    });
  });
}
