import { connect } from "node:net";
import { Deadline, sleepWithin } from "./deadline";

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
