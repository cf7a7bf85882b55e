/**
 * Reading the gateway's access log: one line per request in the
 * `egress_gateway` logformat (GATEWAY_LOG_FORMAT in squid-gateway.ts):
 *
 *   %ts.%03tu %tr %>a %un %Ss/%03>Hs %<st %rm %Sh/%<A
 *   1796512238.531 58 127.0.0.1 crawler-session-42 TCP_MISS/200 224 GET USERHASH_PARENT/m1-0.sticky
 *
 * what each request was (whose, through which member, how it ended), so that
 * the gateway's metrics (cli/gateway-metrics/) count per member and per user.
 * Pure: text in, a record out.
 */
import { gatewayMemberOfPeer } from "./squid-gateway";
import { HOST_WORD, parseGatewayUserName, SESSION_WORD } from "./user-names";

/**
 * How a request ended, from the client's side:
 * - `routed`: a member answered (2xx, 3xx, and 4xx the origin gave);
 * - `failed`: no answer came through: 5xx, or 000 (the connection ended
 *   without one), whether a member was chosen or none could be; also a 407
 *   from a member, which refused the gateway's own credentials;
 * - `refused`: squid answered itself without asking a member: 407 (the
 *   client's credentials), 403 (the access rules), or another 4xx (a request
 *   squid could not read).
 */
export type GatewayResult = "routed" | "failed" | "refused";

export interface GatewayRequest {
  /** The user whose password was checked: the name without `-session-`/`-host-`; undefined when the client gave none. */
  user?: string;
  /** The name carried `-host-<label>`. */
  pinned: boolean;
  /** The name carried `-session-<id>`. */
  session: boolean;
  /** The member (its key in the pool, as `kvm1-0`) squid chose; undefined when it chose none. */
  member?: string;
  /** The status the client got; 0 when it got none. */
  status: number;
  /** Bytes sent to the client. */
  bytes: number;
  /** The request's method; `-` when the connection carried no request at all (a TCP probe). */
  method: string;
  result: GatewayResult;
}

const TIME = /^\d+\.\d{3}$/;
const WHOLE = /^\d+$/;
const SQUID_STATUS = /^[A-Z_]+\/(\d{3})$/;
const HIERARCHY = /^[A-Z_]+\/(\S+)$/;
/** squid's `%un` logs the name as the client sent it, spaces included: the fields around it are fixed. */
const FIELDS_BEFORE_USER = 3;
const FIELDS_AFTER_USER = 4;

/**
 * One access-log line as a request; undefined for a line that is not in the
 * `egress_gateway` format.
 */
export function parseGatewayLogLine(line: string): GatewayRequest | undefined {
  const fields = line.replace(/\r?\n$/, "").split(" ");
  if (fields.length < FIELDS_BEFORE_USER + 1 + FIELDS_AFTER_USER) return undefined;
  const [time, elapsed, client] = fields;
  const [squidStatus, bytes, method, hierarchy] = fields.slice(-FIELDS_AFTER_USER);
  const statusMatch = SQUID_STATUS.exec(squidStatus!);
  const hierarchyMatch = HIERARCHY.exec(hierarchy!);
  if (
    !TIME.test(time!) ||
    !WHOLE.test(elapsed!) ||
    client === "" ||
    statusMatch === null ||
    !WHOLE.test(bytes!) ||
    method === "" ||
    hierarchyMatch === null
  )
    return undefined;
  const name = fields.slice(FIELDS_BEFORE_USER, -FIELDS_AFTER_USER).join(" ");
  const peer = hierarchyMatch[1]!;
  const member = peer === "-" ? undefined : gatewayMemberOfPeer(peer);
  const status = Number(statusMatch[1]);
  return {
    ...userOf(name),
    ...(member === undefined ? {} : { member }),
    status,
    bytes: Number(bytes),
    method: method!,
    result: resultOf(status, member),
  };
}

/**
 * The base user and what the name asks for. A name the conventions cannot
 * read (`crawler-session-`) is read as squid read it: the auth helper checks
 * the name up to its first suffix word, and the session and pin ACLs look for
 * `-session-` and `-host-` anywhere in it.
 */
function userOf(name: string): Pick<GatewayRequest, "user" | "pinned" | "session"> {
  if (name === "-" || name === "") return { pinned: false, session: false };
  const parsed = parseGatewayUserName(name);
  if (parsed !== undefined)
    return {
      user: parsed.user,
      pinned: parsed.host !== undefined,
      session: parsed.session !== undefined,
    };
  const suffix = new RegExp(`-(${SESSION_WORD}|${HOST_WORD})-`);
  return {
    user: name.split(suffix)[0]!,
    pinned: name.includes(`-${HOST_WORD}-`),
    session: name.includes(`-${SESSION_WORD}-`),
  };
}

function resultOf(status: number, member: string | undefined): GatewayResult {
  if (status === 0 || status >= 500) return "failed";
  if (member === undefined) return "refused";
  return status === 407 ? "failed" : "routed";
}
