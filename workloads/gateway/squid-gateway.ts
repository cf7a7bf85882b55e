/**
 * The gateway's squid configuration: one port in front of the pool's members,
 * squid choosing a member (a `cache_peer` parent) for each request. Pure: the
 * same settings always give the same bytes, so an unchanged pool never looks
 * like a change to the Secret or the gateway VM's files.
 *
 * Every member is declared twice, under two names, because squid picks a
 * parent with one algorithm per peer:
 * - `<member>`: `round-robin`, for requests without a session: each request
 *   (each CONNECT tunnel) to the healthy member that has served fewest;
 * - `<member>.sticky`: `userhash`, for `-session-` names: squid hashes the
 *   whole user name over the members allowed to take it (highest random
 *   weight), so a session stays on one member, and a member that leaves moves
 *   only the sessions it held.
 * `cache_peer_access` keeps each request on its own set, and on the members
 * that carry the label a `-host-<label>` name pins it to. A member that
 * refuses or times out `connect-fail-limit` times is dead to squid until a
 * connection to it works again; requests meanwhile go to the next allowed
 * member (`never_direct`: never to the origin from the gateway itself).
 *
 * The client's name carries suffixes the password file does not know: the
 * auth helper (`authHelperScript`) strips them before squid's own
 * basic_ncsa_auth checks the password, so `alice-session-7` is checked as
 * `alice` and routed as `alice-session-7`.
 */
import { isIP } from "node:net";
import { htpasswdLine } from "../password-hash";
import type { GuestFileText } from "../prefix-egress";
import {
  HOST_WORD,
  SESSION_WORD,
  gatewayLabelProblems,
  gatewayUserListProblems,
} from "./user-names";

export const DEFAULT_GATEWAY_PORT = 3128;
/** Failed connects before squid counts a member dead (it revives on the first connect that works). */
export const GATEWAY_CONNECT_FAIL_LIMIT = 2;
/** Seconds a connect to a member may take before squid tries the next one. */
export const GATEWAY_PEER_CONNECT_SECONDS = 2;
/** squid's own helper, where Debian and Ubuntu (and the ubuntu/squid image) put it. */
const BASIC_AUTH_HELPER = "/usr/lib/squid/basic_ncsa_auth";
/** The log line per request that per-member and per-user counts are read from. */
export const GATEWAY_LOG_FORMAT =
  "logformat egress_gateway %ts.%03tu %tr %>a %un %Ss/%03>Hs %<st %rm %Sh/%<A";
const STICKY_SUFFIX = ".sticky";

/** One member the gateway routes to. */
export interface GatewayMember {
  /** The member's key in the pool (`kvm1-0`): squid's peer name, and the name in logs and metrics. */
  name: string;
  /** Its address as the gateway reaches it: an IPv4 or IPv6 literal. */
  address: string;
  port: number;
  /** Labels a `-host-<label>` name may pin to: its backend's name and the labels the backend declares. */
  labels: readonly string[];
  /** The member squid's own basic-auth credentials, sent on every request the gateway forwards to it. */
  login?: { user: string; password: string };
}

/** A user of the gateway, with its own password (a secret: only its hash is written). */
export interface GatewayUser {
  name: string;
  password: string;
}

/** Where the gateway's files live and its squid writes; squid's own defaults where absent. */
export interface GatewayPaths {
  /** Directory of squid.conf, the password file and the auth helper. */
  configDir: string;
  /** squid's access_log destination, e.g. `stdio:/dev/stdout` in a pod. */
  accessLog?: string;
  /**
   * host:port of a `gateway-metrics` intake: squid sends it each access-log
   * line over UDP as well, and the intake counts them (per member, per user).
   */
  metricsUdp?: string;
  cacheLog?: string;
  pidFile?: string;
}

export interface GatewaySettings {
  port: number;
  allowedClientCidrs: readonly string[];
  users: readonly GatewayUser[];
  members: readonly GatewayMember[];
  paths: GatewayPaths;
}

/** The files a gateway runs on, written into its pod (Secret) or VM (guest agent) as a set. */
export interface GatewayFiles {
  config: GuestFileText;
  users: GuestFileText;
  authHelper: GuestFileText;
}

/** Problems with the settings, each naming its field and the fix; empty when fine. */
export function gatewaySettingsProblems(settings: GatewaySettings, field = "gateway"): string[] {
  const problems: string[] = [];
  if (!Number.isInteger(settings.port) || settings.port < 1 || settings.port > 65535)
    problems.push(
      `${field}.port must be a whole number from 1 to 65535, e.g. ${DEFAULT_GATEWAY_PORT}`,
    );
  if (settings.users.length === 0)
    problems.push(
      `${field}.users must name at least one user, e.g. [{ name: "crawler", password }]`,
    );
  problems.push(
    ...gatewayUserListProblems(
      settings.users.map((user) => user.name),
      `${field}.users`,
    ),
  );
  settings.users.forEach((user, index) => {
    // Never quoted back: a secret.
    if (typeof user.password !== "string" || user.password.length < 12)
      problems.push(`${field}.users[${index}].password must be at least 12 characters`);
    else if (/[\r\n\0]/.test(user.password))
      problems.push(`${field}.users[${index}].password must not contain line breaks or NUL`);
  });
  const seenMembers = new Set<string>();
  settings.members.forEach((member, index) => {
    const where = `${field}.members[${index}]`;
    if (!/^[a-z0-9]+(-[a-z0-9]+)*$/.test(member.name) || seenMembers.has(member.name))
      problems.push(`${where}.name must be a distinct pool key such as "kvm1-0"`);
    seenMembers.add(member.name);
    if (isIP(member.address) === 0)
      problems.push(
        `${where}.address must be an IPv4 or IPv6 address, not ${JSON.stringify(member.address)}`,
      );
    if (!Number.isInteger(member.port) || member.port < 1 || member.port > 65535)
      problems.push(`${where}.port must be a whole number from 1 to 65535`);
    member.labels.forEach((label, labelIndex) =>
      problems.push(...gatewayLabelProblems(label, `${where}.labels[${labelIndex}]`)),
    );
  });
  const udp = settings.paths.metricsUdp;
  if (udp !== undefined && !/^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$/.test(udp))
    problems.push(
      `${field}.paths.metricsUdp must be host:port of the metrics intake, e.g. 127.0.0.1:5140 (not ${JSON.stringify(udp)})`,
    );
  return problems;
}

/** A label's ACL name: squid ACL names are words. */
const pinAcl = (label: string): string => `gateway_pin_${label.replace(/-/g, "_")}`;

/**
 * `login=` percent-encodes its value (squid decodes it): a password with a
 * space, `%` or `:` still reaches the member whole.
 */
const loginValue = (login: { user: string; password: string }): string =>
  `${encodeLoginPart(login.user)}:${encodeLoginPart(login.password)}`;
const encodeLoginPart = (text: string): string =>
  [...Buffer.from(text, "utf8")]
    .map((byte) => {
      const char = String.fromCharCode(byte);
      return /[A-Za-z0-9._~-]/.test(char)
        ? char
        : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
    })
    .join("");

function peerLines(member: GatewayMember): string[] {
  const options = [
    "no-query",
    "no-digest",
    "no-netdb-exchange",
    `connect-fail-limit=${GATEWAY_CONNECT_FAIL_LIMIT}`,
    `connect-timeout=${GATEWAY_PEER_CONNECT_SECONDS}`,
    ...(member.login === undefined ? [] : [`login=${loginValue(member.login)}`]),
  ].join(" ");
  const sticky = member.name + STICKY_SUFFIX;
  const pins = member.labels.map((label) => `allow gateway_pinned ${pinAcl(label)}`);
  return [
    `cache_peer ${member.address} parent ${member.port} 0 round-robin name=${member.name} ${options}`,
    `cache_peer ${member.address} parent ${member.port} 0 userhash name=${sticky} ${options}`,
    `cache_peer_access ${member.name} deny gateway_session`,
    ...pins.map((rule) => `cache_peer_access ${member.name} ${rule}`),
    `cache_peer_access ${member.name} deny gateway_pinned`,
    `cache_peer_access ${member.name} allow all`,
    `cache_peer_access ${sticky} deny !gateway_session`,
    ...pins.map((rule) => `cache_peer_access ${sticky} ${rule}`),
    `cache_peer_access ${sticky} deny gateway_pinned`,
    `cache_peer_access ${sticky} allow all`,
  ];
}

/** The gateway's squid.conf. */
export function gatewaySquidConfig(settings: GatewaySettings): string {
  const { paths } = settings;
  const labels = [...new Set(settings.members.flatMap((member) => member.labels))].sort();
  const members = [...settings.members].sort((a, b) => a.name.localeCompare(b.name));
  return (
    [
      "# Written by egress-proxies (EgressProxyPool gateway). Rewritten whenever the pool's members change.",
      `http_port ${settings.port}`,
      // A router, not a cache, and nothing that reveals the client behind it.
      "cache deny all",
      "via off",
      "forwarded_for delete",
      "shutdown_lifetime 1 seconds",
      // Without a name of its own squid looks itself up in DNS on every request it answers (a
      // reverse query each, and two warnings in cache.log per request where DNS has no name for it).
      "visible_hostname egress-proxies-gateway",
      // Only ever through a member; never to the origin from the gateway's own address.
      "never_direct allow all",
      "nonhierarchical_direct off",
      "prefer_direct off",
      // A member is two peers at one address, and squid pools idle connections by address: a reused
      // connection would carry the other set's peer. squid 5.7 also reuses connections opened before
      // a reload with the peer it has since dropped, and sends them origin-form requests (400).
      // CONNECT tunnels, most of a crawler's traffic, never reuse a connection anyway.
      "server_persistent_connections off",
      ...(paths.pidFile === undefined ? [] : [`pid_filename ${paths.pidFile}`]),
      ...(paths.cacheLog === undefined ? [] : [`cache_log ${paths.cacheLog}`]),
      GATEWAY_LOG_FORMAT,
      `access_log ${paths.accessLog ?? "daemon:/var/log/squid/access.log"} egress_gateway`,
      // A second copy of each line, not instead of the first: the readable log stays where it was.
      ...(paths.metricsUdp === undefined
        ? []
        : [`access_log udp://${paths.metricsUdp} egress_gateway`]),
      // sh runs the helper: a file from a Secret volume need not be executable.
      `auth_param basic program /bin/sh ${paths.configDir}/auth-helper.sh`,
      "auth_param basic children 8 startup=2 idle=2",
      "auth_param basic realm egress-proxies gateway",
      "auth_param basic credentialsttl 1 hour",
      "auth_param basic casesensitive on",
      "acl gateway_users proxy_auth REQUIRED",
      // "[-]", not "-": squid reads a value that starts with "-" as an option of the acl line.
      `acl gateway_session proxy_auth_regex [-]${SESSION_WORD}[-]`,
      `acl gateway_pinned proxy_auth_regex [-]${HOST_WORD}[-]`,
      // A label ends at the next suffix or at the end: "-host-kvm1" must not pin to "kvm1-b".
      ...labels.map(
        (label) =>
          `acl ${pinAcl(label)} proxy_auth_regex [-]${HOST_WORD}[-]${label}([-]${SESSION_WORD}[-]|$)`,
      ),
      ...settings.allowedClientCidrs.map((cidr) => `acl gateway_clients src ${cidr}`),
      "acl Safe_ports port 80 443 1025-65535",
      "http_access deny !Safe_ports",
      "http_access deny !gateway_clients",
      "http_access allow gateway_users",
      "http_access deny all",
      ...members.flatMap(peerLines),
    ].join("\n") + "\n"
  );
}

/**
 * The auth helper: the client's name without its `-session-`/`-host-`
 * suffixes, then squid's basic_ncsa_auth. squid sends one "name password"
 * line per check, both URL-escaped (no spaces inside either), so the first
 * suffix word in the line is the name's; `sed -u` passes each line on at once.
 */
export function authHelperScript(configDir: string): string {
  return [
    "#!/bin/sh",
    "# egress-proxies gateway: checks <user>[-session-<id>][-host-<label>] as <user>.",
    `sed -u -E 's/-(${SESSION_WORD}|${HOST_WORD})-[^ ]* / /' | ${BASIC_AUTH_HELPER} ${configDir}/users`,
    "",
  ].join("\n");
}

/** squid.conf, the password file (hashes only) and the auth helper, as one set. */
export function gatewayFiles(settings: GatewaySettings): GatewayFiles {
  const dir = settings.paths.configDir;
  return {
    config: {
      path: `${dir}/squid.conf`,
      permissions: "0640",
      content: gatewaySquidConfig(settings),
    },
    users: {
      path: `${dir}/users`,
      permissions: "0640",
      content: [...settings.users]
        .sort((a, b) => a.name.localeCompare(b.name))
        .map((user) => htpasswdLine(user.name, user.password) + "\n")
        .join(""),
    },
    authHelper: {
      path: `${dir}/auth-helper.sh`,
      permissions: "0644",
      content: authHelperScript(dir),
    },
  };
}

/** The peer names squid logs for a member (both of its sets), for per-member counts. */
export const gatewayPeerNames = (member: string): [string, string] => [
  member,
  member + STICKY_SUFFIX,
];

/** The member a peer name squid logs belongs to: gatewayPeerNames read backwards. */
export const gatewayMemberOfPeer = (peer: string): string =>
  peer.endsWith(STICKY_SUFFIX) ? peer.slice(0, -STICKY_SUFFIX.length) : peer;
