/**
 * Probing one proxy the way its users do, within one deadline: a plain HTTP
 * request (absolute-form GET), a CONNECT tunnel, and the egress address from
 * an echo service, each through the proxy with its basic auth. The first
 * failure ends the probe: the proxy is down and that is the reason.
 */
import { request } from "node:http";
import { Deadline } from "../../provider/common/deadline";
import { describeAnswer, fetchEgressAddress } from "../../provider/common/egress";
import {
  fetchThroughProxy,
  proxyAuthorization,
  type ProxyCredentials,
} from "../../provider/common/proxy-probe";
import { safeErrorMessage } from "../../provider/common/redact";
import type { ProxyTarget, RecordedProblem } from "./targets";

export interface ProbePlan {
  /** http:// URL fetched through the proxy; 2xx or 3xx passes. */
  target: string;
  /** host:port to open a CONNECT tunnel to; 200 passes. */
  connect?: string;
  /** An echo service answering with the caller's address. */
  egress?: { url: string; field?: string };
  /** For proxies reached over IPv6 (--egress-url-ipv6): the echo service by its IPv6 literal; else `egress`. */
  egressIpv6?: { url: string; field?: string };
  /** Budget per proxy. */
  timeoutMs: number;
}

export interface ProbeResult {
  name: string;
  /** host:port, without credentials. */
  endpoint: string;
  /** The family the proxy was reached over (a dual-stack member has one result per family). */
  family: "ipv4" | "ipv6";
  up: boolean;
  /** Why the proxy is down: the failing probe and the proxy's answer. */
  error?: string;
  httpStatus?: number;
  httpSeconds?: number;
  connectSeconds?: number;
  egressIp?: string;
  egressSeconds?: number;
  /** When the pool rotates this member by age (its `proxies[].rotateAfter`), when it has a limit. */
  rotateAfter?: string;
  /** What the last refresh's re-check recorded for this member (the pool's `proxies` output). */
  recordedProblem?: RecordedProblem;
}

export async function probeProxy(target: ProxyTarget, plan: ProbePlan): Promise<ProbeResult> {
  const deadline = new Deadline(plan.timeoutMs, "--timeout");
  const proxy = { host: target.host, port: target.port };
  const result: ProbeResult = {
    name: target.name,
    endpoint: target.endpoint,
    family: target.family,
    up: false,
    ...(target.rotateAfter === undefined ? {} : { rotateAfter: target.rotateAfter }),
    ...(target.recordedProblem === undefined ? {} : { recordedProblem: target.recordedProblem }),
  };
  let step = "http";
  try {
    let started = performance.now();
    const answer = await withDeadline(
      fetchThroughProxy(proxy, plan.target, deadline.remainingMs(), target.credentials),
      deadline,
    );
    result.httpStatus = answer.status;
    result.httpSeconds = seconds(started);
    if (answer.status < 200 || answer.status >= 400) throw new Error(describeAnswer(answer));
    if (plan.connect !== undefined) {
      step = "connect";
      started = performance.now();
      await withDeadline(
        connectThroughProxy(proxy, plan.connect, target.credentials, deadline.remainingMs()),
        deadline,
      );
      result.connectSeconds = seconds(started);
    }
    const egress = (target.family === "ipv6" ? plan.egressIpv6 : undefined) ?? plan.egress;
    if (egress !== undefined) {
      step = "egress";
      started = performance.now();
      result.egressIp = await withDeadline(
        fetchEgressAddress(proxy, egress, deadline.remainingMs(), target.credentials),
        deadline,
      );
      result.egressSeconds = seconds(started);
    }
    result.up = true;
  } catch (error) {
    result.error = `${step}: ${safeErrorMessage(error as Error, [target.credentials?.password])}`;
  }
  return result;
}

const seconds = (started: number) => Math.round(performance.now() - started) / 1000;

/**
 * The deadline is the whole probe's, not a socket idle timeout: a proxy that
 * trickles bytes (or a paused VM whose kernel still ACKs) cannot stretch it.
 */
/** Timers run on a monotonic clock, the deadline on Date.now(): they may disagree by a millisecond or two. */
const CLOCK_SKEW_MS = 5;

function withDeadline<T>(work: Promise<T>, deadline: Deadline): Promise<T> {
  const deadlineError = () =>
    new Error(`no answer within ${deadline.budgetMs / 1000} s (--timeout)`);
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(deadlineError()), deadline.remainingMs());
    work.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        // The socket's own timeout is set to the same remaining time and may fire first (a busy event
        // loop runs both timers late): when the budget is spent (within the clocks' few ms of skew), the reason
        // is the budget.
        reject(deadline.remainingMs() <= CLOCK_SKEW_MS ? deadlineError() : (error as Error));
      },
    );
  });
}

/**
 * `CONNECT host:port` through the proxy; resolves on a 200 answer and closes
 * the tunnel at once (opening it is what the probe checks: squid's access
 * rules, auth and its reach to the target).
 */
function connectThroughProxy(
  proxy: { host: string; port: number },
  authority: string,
  credentials?: ProxyCredentials,
  timeoutMs = 10_000,
): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = request({
      host: proxy.host,
      port: proxy.port,
      method: "CONNECT",
      path: authority,
      headers: {
        host: authority,
        ...(credentials === undefined
          ? {}
          : { "proxy-authorization": proxyAuthorization(credentials) }),
      },
      timeout: timeoutMs,
    });
    req.on("connect", (res, socket) => {
      socket.destroy();
      if (res.statusCode === 200) resolve();
      else reject(new Error(`CONNECT ${authority}: HTTP ${res.statusCode ?? 0}`));
    });
    // A proxy that refuses CONNECT answers an ordinary response.
    req.on("response", (res) => {
      res.resume();
      reject(new Error(`CONNECT ${authority}: HTTP ${res.statusCode ?? 0}`));
    });
    req.on("timeout", () => req.destroy(new Error(`no answer to CONNECT within ${timeoutMs} ms`)));
    req.on("error", reject);
    req.end();
  });
}
