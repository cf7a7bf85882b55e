/**
 * Many exit addresses from one proxy: the cloud-init pieces that spread a
 * routed IPv6 prefix over a squid proxy VM. Pure, like the squid document it
 * joins (the same settings give the same bytes: the document is part of the
 * VM's identity).
 *
 * In the guest: a `local` route for the whole prefix on lo (replies to any of
 * its addresses arrive, with no per-address configuration),
 * `net.ipv6.ip_nonlocal_bind=1` (a socket may bind an address no interface
 * carries), and the prefix dialer (workloads/prefix-dialer/dialer.py, a
 * stdlib-only Python forward proxy on loopback) that opens each upstream
 * connection from an address of the prefix. squid stays in front (auth,
 * client ACLs, its port) and hands every request to the dialer as its only
 * parent.
 *
 * The dialer ships as a real .py file in the package (package.json "files")
 * and is read once at module load, relative to this module: the same relative
 * path holds in the repository (dist/components → components/) and in the
 * packed tarball, and a package built without it fails at import, not at
 * first boot.
 */
import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import { join } from "node:path";
import { ipv6Groups } from "../provider/common/ipv6";

/** Loopback only: squid is the one client; nobody outside the VM reaches the dialer. */
export const PREFIX_DIALER_PORT = 3129;
/** The dialer's source, byte for byte what the guest runs. */
export const PREFIX_DIALER_SCRIPT = readFileSync(
  join(__dirname, "..", "..", "workloads", "prefix-dialer", "dialer.py"),
  "utf8",
);

export type PrefixMode = "random" | "sticky" | "pool";
export const PREFIX_MODES: readonly PrefixMode[] = ["random", "sticky", "pool"];

export interface PrefixEgressSettings {
  /** A routed IPv6 prefix, host bits zero, e.g. "2001:db8:1:2::/64". */
  prefix: string;
  /** random: a fresh address per connection; sticky: one per client credential; pool: `count` fixed addresses. */
  mode: PrefixMode;
  /** pool mode only: addresses prefix+1 .. prefix+count. */
  count?: number;
}

/** A file the guest gets: written by cloud-init at first boot, delivered in place after (common/guest-files.ts). */
export interface GuestFileText {
  path: string;
  permissions: string;
  content: string;
}

/** The pieces a squid cloud-config takes in. */
export interface PrefixEgressParts {
  packages: string[];
  /** Entries under `write_files:`. */
  files: GuestFileText[];
  /** Entries under `runcmd:` (argv), to run before squid reloads (so its parent is there). */
  commands: string[][];
  /** What delivering changed files in place runs instead: the units restarted onto the new files. */
  inPlaceCommands: string[][];
  /** squid.conf directives that send every request through the dialer. */
  squidConfigLines: string[];
}

const DIALER_PATH = "/usr/local/lib/egress-proxies/prefix-dialer.py";
const ROUTE_UNIT = "egress-prefix-route.service";
const DIALER_UNIT = "egress-prefix-dialer.service";
const SYSCTL_PATH = "/etc/sysctl.d/60-egress-prefix.conf";
/** The header squid adds with the client's address, so sticky mode can key on it without a credential. */
const CLIENT_HEADER = "X-Egress-Prefix-Client";
/** Shorter would leave too few addresses to matter; longer than a /48 is more than one VM can use. */
const MIN_PREFIX_LENGTH = 48;
const MAX_PREFIX_LENGTH = 124;
const MAX_POOL_COUNT = 65536;

/** Problems with the settings, each naming the field and the fix; empty when fine. */
export function prefixEgressProblems(
  settings: PrefixEgressSettings,
  field = "ipv6Prefix",
  squidPort?: number,
): string[] {
  const problems: string[] = [];
  const parsed = parsePrefix(settings.prefix);
  if (typeof parsed === "string") problems.push(`${field}.prefix ${parsed}`);
  if (!PREFIX_MODES.includes(settings.mode))
    problems.push(`${field}.mode must be one of ${PREFIX_MODES.map((m) => `"${m}"`).join(", ")}`);
  if (settings.mode === "pool") {
    const count = settings.count;
    if (count === undefined)
      problems.push(`${field}.count is required in pool mode: how many fixed addresses, e.g. 16`);
    else if (!Number.isInteger(count) || count < 1 || count > MAX_POOL_COUNT)
      problems.push(`${field}.count must be a whole number from 1 to ${MAX_POOL_COUNT}`);
    else if (typeof parsed !== "string" && BigInt(count) > parsed.size - 1n)
      problems.push(
        `${field}.count ${count} does not fit in ${settings.prefix}: it has ${parsed.size - 1n} usable addresses (its first, the subnet-router anycast address, is never a source); lower the count or give a shorter prefix`,
      );
  } else if (settings.count !== undefined)
    problems.push(`${field}.count applies to mode "pool" only; remove it or set mode: "pool"`);
  if (squidPort === PREFIX_DIALER_PORT)
    problems.push(
      `${field}: squid's port ${squidPort} is the prefix dialer's loopback port; give squid another port, e.g. 3128`,
    );
  return problems;
}

interface ParsedPrefix {
  network: bigint;
  length: number;
  size: bigint;
}

/** The prefix as numbers, or what is wrong with it (the text follows the field name). */
function parsePrefix(text: string): ParsedPrefix | string {
  const match = /^([0-9A-Fa-f:.]+)\/(\d{1,3})$/.exec(text);
  if (!match || isIP(match[1]!) !== 6)
    return `${JSON.stringify(text)} must be an IPv6 prefix in CIDR form, e.g. "2001:db8:1:2::/64"`;
  const length = Number(match[2]);
  if (length < MIN_PREFIX_LENGTH || length > MAX_PREFIX_LENGTH)
    return `${JSON.stringify(text)} must be from /${MIN_PREFIX_LENGTH} to /${MAX_PREFIX_LENGTH} long (a routed /64 is usual)`;
  const address = ipv6ToBigInt(match[1]!);
  const hostBits = BigInt(128 - length);
  const network = (address >> hostBits) << hostBits;
  if (network !== address)
    return `${JSON.stringify(text)} has host bits set; write the network itself: "${formatIpv6(network)}/${length}"`;
  const reserved = reservedRange(network);
  if (reserved !== undefined)
    return `${JSON.stringify(text)} is ${reserved}, not a prefix routed to this machine; use the global (or unique-local) prefix the provider routes to the VM`;
  return { network, length, size: 1n << hostBits };
}

function reservedRange(network: bigint): string | undefined {
  const top8 = Number(network >> 120n);
  const top10 = Number(network >> 118n);
  if (top8 === 0xff) return "multicast (ff00::/8)";
  if (top10 === 0x3fa) return "link-local (fe80::/10)";
  // ::/8 holds the unspecified and loopback addresses, IPv4-mapped and NAT64 forms: none is routable to a VM.
  if (top8 === 0) return "in ::/8 (unspecified, loopback, IPv4-mapped or NAT64 space)";
  return undefined;
}

/** Node has checked the syntax (isIP). */
function ipv6ToBigInt(text: string): bigint {
  return ipv6Groups(text)!.reduce((sum, group) => (sum << 16n) | BigInt(group), 0n);
}

/** RFC 5952 text (lower case, the longest run of zero groups as `::`), as the URL parser writes it. */
function formatIpv6(value: bigint): string {
  const groups = Array.from({ length: 8 }, (_, i) =>
    ((value >> BigInt(112 - 16 * i)) & 0xffffn).toString(16),
  );
  return new URL(`http://[${groups.join(":")}]/`).hostname.slice(1, -1);
}

/** The prefix as the guest gets it: validated and in canonical text form. */
function canonicalPrefix(settings: PrefixEgressSettings): string {
  const problems = prefixEgressProblems(settings);
  if (problems.length > 0) throw new Error(problems.join("; "));
  const parsed = parsePrefix(settings.prefix) as ParsedPrefix;
  return `${formatIpv6(parsed.network)}/${parsed.length}`;
}

/** squid.conf lines: every request, CONNECT too, goes to the dialer and never directly. */
export function prefixSquidConfigLines(): string[] {
  return [
    "# egress-proxies: every request leaves through the prefix dialer (one exit address per connection)",
    // login=PASSTHRU hands the client's Proxy-Authorization to the dialer: sticky mode keys on its user.
    `cache_peer 127.0.0.1 parent ${PREFIX_DIALER_PORT} 0 no-query no-digest default login=PASSTHRU name=prefixdialer`,
    "never_direct allow all",
    // squid would otherwise reuse one dialer connection for requests to other sites and clients.
    "server_persistent_connections off",
    // The client's address for sticky mode without credentials: a client's own copy is dropped
    // first (squid adds its header after applying request_header_access).
    `request_header_access ${CLIENT_HEADER} deny all`,
    `request_header_add ${CLIENT_HEADER} "%>a" all`,
  ];
}

/** The systemd unit that makes the whole prefix local on lo (no address per exit address). */
export function prefixRouteUnit(prefix: string): string {
  return [
    "[Unit]",
    `Description=egress-proxies: every address of ${prefix} is local (prefix dialer sources)`,
    "Before=egress-prefix-dialer.service",
    "",
    "[Service]",
    "Type=oneshot",
    "RemainAfterExit=yes",
    // replace, not add: a restart of the unit finds the route already there.
    `ExecStart=/sbin/ip -6 route replace local ${prefix} dev lo`,
    `ExecStop=/sbin/ip -6 route del local ${prefix} dev lo`,
    "",
    "[Install]",
    "WantedBy=multi-user.target",
    "",
  ].join("\n");
}

/** The systemd unit of the dialer: unprivileged, restarted on failure, started before squid. */
export function prefixDialerUnit(settings: PrefixEgressSettings): string {
  const prefix = canonicalPrefix(settings);
  const count = settings.mode === "pool" ? ` --count ${settings.count}` : "";
  return [
    "[Unit]",
    `Description=egress-proxies prefix dialer (${settings.mode} source addresses of ${prefix})`,
    `Wants=network-online.target ${ROUTE_UNIT}`,
    `After=network-online.target ${ROUTE_UNIT}`,
    "Before=squid.service",
    "",
    "[Service]",
    // Ready once it listens: squid (Before= below, and runcmd's reload) then finds its parent alive.
    "Type=notify",
    `ExecStart=/usr/bin/python3 ${DIALER_PATH} --prefix ${prefix} --mode ${settings.mode}${count} --port ${PREFIX_DIALER_PORT}`,
    "Restart=on-failure",
    "RestartSec=2",
    // Binding a non-local address with IP_FREEBIND needs no capability: the dialer runs as nobody.
    "DynamicUser=yes",
    "CapabilityBoundingSet=",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
    // Two descriptors per relayed connection, up to the dialer's 1024 at once.
    "LimitNOFILE=8192",
    "",
    "[Install]",
    "WantedBy=multi-user.target",
    "",
  ].join("\n");
}

const file = (path: string, permissions: string, content: string): GuestFileText => ({
  path,
  permissions,
  content,
});

/** Everything the squid cloud-config adds for a prefix; throws with every problem when the settings are wrong. */
export function prefixEgressParts(settings: PrefixEgressSettings): PrefixEgressParts {
  const prefix = canonicalPrefix(settings);
  return {
    // Always there on Debian and Ubuntu cloud images (cloud-init is Python); listed so a
    // slimmed image fails loudly at package install rather than silently at dialer start.
    packages: ["python3"],
    files: [
      file(DIALER_PATH, "0755", PREFIX_DIALER_SCRIPT),
      file(`/etc/systemd/system/${ROUTE_UNIT}`, "0644", prefixRouteUnit(prefix)),
      file(`/etc/systemd/system/${DIALER_UNIT}`, "0644", prefixDialerUnit(settings)),
      file(
        SYSCTL_PATH,
        "0644",
        "# egress-proxies: the prefix dialer binds addresses of its routed prefix that no interface carries\nnet.ipv6.ip_nonlocal_bind = 1\n",
      ),
    ],
    commands: [
      ["sysctl", "-p", SYSCTL_PATH],
      ["systemctl", "daemon-reload"],
      ["systemctl", "enable", "--now", ROUTE_UNIT, DIALER_UNIT],
    ],
    inPlaceCommands: [
      ["sysctl", "-p", SYSCTL_PATH],
      ["systemctl", "daemon-reload"],
      ["systemctl", "enable", ROUTE_UNIT, DIALER_UNIT],
      // restart starts a unit that was not running: either way it runs the new files.
      ["systemctl", "restart", ROUTE_UNIT, DIALER_UNIT],
    ],
    squidConfigLines: prefixSquidConfigLines(),
  };
}

/** Each member of a split prefix gets a /64: the usual routed unit, and what SLAAC-sized sites rate-limit by. */
export const MEMBER_PREFIX_LENGTH = 64;

/**
 * The prefix of the member at `index` (0-based, counted per backend): a /64
 * or longer prefix is that one proxy's (index 0 only); a shorter one is split
 * into /64s and member i takes the i-th, so a member keeps its /64 when others
 * are added or removed after it. A string says why the member gets none.
 */
export function memberPrefix(prefix: string, index: number): string {
  const parsed = parsePrefix(prefix);
  if (typeof parsed === "string") throw new Error(`ipv6Prefix.prefix ${parsed}`);
  if (parsed.length >= MEMBER_PREFIX_LENGTH) {
    if (index !== 0)
      throw new Error(
        `ipv6Prefix.prefix ${prefix} serves one proxy, but member ${index} needs one too: give a /56 or shorter (one /64 per proxy) or one proxy per prefix`,
      );
    return `${formatIpv6(parsed.network)}/${parsed.length}`;
  }
  const slots = 1n << BigInt(MEMBER_PREFIX_LENGTH - parsed.length);
  if (BigInt(index) >= slots)
    throw new Error(
      `ipv6Prefix.prefix ${prefix} holds ${slots} /64s, too few for member ${index}: give a shorter prefix`,
    );
  const network = parsed.network + (BigInt(index) << BigInt(128 - MEMBER_PREFIX_LENGTH));
  return `${formatIpv6(network)}/${MEMBER_PREFIX_LENGTH}`;
}

/** How many proxies a prefix serves: one per /64, or one for a /64 or longer. */
export function prefixMemberCapacity(prefix: string): number | undefined {
  const parsed = parsePrefix(prefix);
  if (typeof parsed === "string") return undefined;
  return parsed.length >= MEMBER_PREFIX_LENGTH ? 1 : 2 ** (MEMBER_PREFIX_LENGTH - parsed.length);
}
