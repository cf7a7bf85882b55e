import { connect } from "node:net";
import { Deadline, sleepWithin } from "./deadline";
import { fetchThroughProxy } from "./proxy-probe";

interface AttemptOptions {
  attemptTimeoutMs?: number;
  pauseMs?: number;
}

/**
 * Attempts until one succeeds or the deadline passes. Each attempt has its
 * own short timeout so a silently dropped packet cannot eat the whole
 * budget; the last failure goes into the timeout error.
 */
async function attemptUntil(
  deadline: Deadline,
  options: AttemptOptions,
  defaultAttemptMs: number,
  attempt: (timeoutMs: number) => Promise<void>,
  what: string,
): Promise<void> {
  const attemptTimeoutMs = options.attemptTimeoutMs ?? defaultAttemptMs;
  const pauseMs = options.pauseMs ?? 1000;
  let lastError: unknown;
  while (!deadline.expired()) {
    try {
      await attempt(deadline.capped(attemptTimeoutMs));
      return;
    } catch (error) {
      lastError = error;
      await sleepWithin(pauseMs, deadline);
    }
  }
  throw deadline.timeoutError(
    lastError instanceof NotYet ? `${what} (last answer: ${lastError.message})` : what,
    lastError instanceof NotYet ? undefined : lastError,
  );
}

/** An attempt that was answered, but not yet as wanted (its message says how). */
class NotYet extends Error {}

/** Readiness: the proxy is ready when its port accepts a TCP connection. */
export function waitForTcpPort(
  host: string,
  port: number,
  deadline: Deadline,
  options: AttemptOptions = {},
): Promise<void> {
  return attemptUntil(
    deadline,
    options,
    3000,
    (timeoutMs) => tryTcpConnect(host, port, timeoutMs),
    `port ${port} on ${host} accepting connections`,
  );
}

/**
 * Readiness of a proxy whose configuration demands credentials: its port
 * accepting connections is not enough when a package starts the proxy with
 * its own default configuration before cloud-init writes ours (Debian's
 * squid listens on 3128 from the first boot and answers 403), so the proxy
 * is ready when a request without credentials is answered 407. The target is
 * never reached: authentication comes first (`.invalid` never resolves).
 */
export function waitForProxyAuthRequired(
  host: string,
  port: number,
  deadline: Deadline,
  options: AttemptOptions = {},
): Promise<void> {
  return attemptUntil(
    deadline,
    options,
    5000,
    async (timeoutMs) => {
      const { status, squidError } = await fetchThroughProxy(
        { host, port },
        "http://readiness.invalid/",
        timeoutMs,
      );
      if (status === 403 && squidError?.startsWith("ERR_ACCESS_DENIED"))
        // Either the package's default (it denies everyone but localhost) or ours refusing this machine.
        throw new NotYet(
          `HTTP 403 (${squidError}): squid refuses this machine; if the proxy's own configuration is running, add this machine's address to its allowed clients (gateway.allowedClientCidrs)`,
        );
      if (status !== 407)
        throw new NotYet(`HTTP ${status}${squidError === undefined ? "" : ` (${squidError})`}`);
    },
    `the proxy at ${host}:${port} asking for credentials (407: its own configuration serving)`,
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
