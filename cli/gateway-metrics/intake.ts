/**
 * The intake of `egress-proxies gateway-metrics`: the gateway's squid sends
 * its access-log lines over UDP (`access_log udp://…`, squid-gateway.ts), and
 * the counters here add each request up per member and per user.
 *
 * squid's UDP log module buffers lines and sends a datagram when its
 * 1400-byte buffer is full (about 15 lines) or when it reopens its logs (a
 * reload, a stop): a datagram holds one or more whole lines, and on a quiet
 * gateway the last few requests are counted only once more follow. UDP, not
 * a stream, so that squid never waits for this process nor fails without it:
 * lines sent while the intake is down are lost, the proxy keeps serving.
 */
import { createSocket, type Socket } from "node:dgram";
import { isIP } from "node:net";
import { parseGatewayLogLine, type GatewayResult } from "../../workloads/gateway/access-log";

/**
 * Users counted under their own label; later ones share OTHER_USERS. Labels
 * are per base user (`crawler` for `crawler-session-42-host-kvm1`), never per
 * session id, which would make a series per session. The users a gateway
 * knows are few, but a refused request carries whatever name the client
 * sent: the cap keeps a client that invents names from growing the series
 * (and this process's memory) without end.
 */
export const MAX_USERS = 200;
/** No user name contains parentheses: the label cannot be mistaken for a user's. */
export const OTHER_USERS = "(other)";
/** How much of an unreadable line this process's log quotes. */
const QUOTED_LINE_CHARS = 200;

/** One counter's samples, by their label values. */
export class LabelledCounter<Name extends string> {
  private readonly samples = new Map<string, { labels: Record<Name, string>; value: number }>();

  add(labels: Record<Name, string>, amount = 1): void {
    const key = JSON.stringify(Object.values(labels));
    const sample = this.samples.get(key);
    if (sample === undefined) this.samples.set(key, { labels, value: amount });
    else sample.value += amount;
  }

  /** Every sample, in a stable order (by label values), so that two scrapes list them alike. */
  entries(): Array<{ labels: Record<Name, string>; value: number }> {
    return [...this.samples.entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([, sample]) => sample);
  }
}

/** What the gateway's log lines add up to since this process started. */
export class GatewayCounters {
  readonly requests = new LabelledCounter<"member" | "user" | "result">();
  readonly responseBytes = new LabelledCounter<"member" | "user">();
  readonly refused = new LabelledCounter<"user">();
  readonly sessionRequests = new LabelledCounter<"member">();
  unreadableLines = 0;
  private readonly users = new Set<string>();

  /**
   * A datagram's lines; the unreadable ones are returned (to be logged). A
   * line for a connection that carried no request (a TCP probe of the proxy
   * port) is no request: it is skipped, counted nowhere.
   */
  recordDatagram(text: string): string[] {
    const unreadable: string[] = [];
    for (const line of text.split("\n")) {
      if (line.trim() === "") continue;
      const request = parseGatewayLogLine(line);
      if (request === undefined) {
        this.unreadableLines += 1;
        unreadable.push(line);
        continue;
      }
      if (request.method === "-" && request.status === 0) continue;
      this.count(
        request.member ?? "",
        this.userLabel(request.user ?? ""),
        request.result,
        request.bytes,
        request.session,
      );
    }
    return unreadable;
  }

  private count(
    member: string,
    user: string,
    result: GatewayResult,
    bytes: number,
    session: boolean,
  ): void {
    this.requests.add({ member, user, result });
    this.responseBytes.add({ member, user }, bytes);
    if (result === "refused") this.refused.add({ user });
    if (session) this.sessionRequests.add({ member });
  }

  private userLabel(user: string): string {
    if (this.users.has(user)) return user;
    if (this.users.size >= MAX_USERS) return OTHER_USERS;
    this.users.add(user);
    return user;
  }
}

/** Where the intake listens: an IP literal (squid sends to an address) and a port. */
export interface UdpAddress {
  host: string;
  port: number;
}

/** A problem that the person starting the command fixes (a flag, an address in use). */
export class GatewayMetricsUsageError extends Error {}

/** Why binding `flag` to `shown` failed, and what to do about it. */
export function bindProblem(flag: string, shown: string, error: NodeJS.ErrnoException): string {
  const code = error.code ?? error.message;
  const fix =
    code === "EADDRINUSE"
      ? "something else listens there: stop it, or choose another port"
      : code === "EADDRNOTAVAIL"
        ? "this host has no such address: give one of its addresses, or 0.0.0.0"
        : code === "EACCES"
          ? "a port below 1024 needs privileges: choose one from 1024"
          : "check the address and port";
  return `${flag} ${shown}: cannot listen (${code}); ${fix}`;
}

export interface RunningIntake {
  /** The bound port (the one asked for, or the one given for port 0). */
  port: number;
  /** False once the socket closed. */
  open(): boolean;
  close(): Promise<void>;
}

/** Datagrams queue here while the event loop is busy: a burst of log lines is not dropped. */
const RECEIVE_BUFFER_BYTES = 4 * 1024 * 1024;

/** Binds the UDP socket and feeds every datagram to `counters`. */
export function startIntake(
  address: UdpAddress,
  counters: GatewayCounters,
  log: (line: string) => void,
): Promise<RunningIntake> {
  const socket: Socket = createSocket({
    type: isIP(address.host) === 6 ? "udp6" : "udp4",
    recvBufferSize: RECEIVE_BUFFER_BYTES,
  });
  let open = true;
  let warned = false;
  socket.on("message", (message: Buffer) => {
    const unreadable = counters.recordDatagram(message.toString("utf8"));
    // Said once: a format mismatch makes every line unreadable, and the counter tells how many.
    if (unreadable.length > 0 && !warned) {
      warned = true;
      log(
        `a log line is not in squid's egress_gateway format (counted in egress_gateway_log_lines_unreadable_total): ${JSON.stringify(unreadable[0]!.slice(0, QUOTED_LINE_CHARS))}`,
      );
    }
  });
  socket.on("close", () => (open = false));
  const shown = `${isIP(address.host) === 6 ? `[${address.host}]` : address.host}:${address.port}`;
  return new Promise((resolve, reject) => {
    const failed = (error: NodeJS.ErrnoException) =>
      reject(new GatewayMetricsUsageError(bindProblem("--udp", shown, error)));
    socket.once("error", failed);
    socket.bind({ address: address.host, port: address.port, exclusive: true }, () => {
      socket.off("error", failed);
      socket.on("error", (error) => log(`--udp ${shown}: ${error.message}`));
      resolve({
        port: socket.address().port,
        open: () => open,
        close: () =>
          new Promise((done) => {
            if (!open) return done();
            socket.close(() => done());
          }),
      });
    });
  });
}
