/**
 * The default cloud-init of a pool proxy: a cloud-config that installs squid,
 * writes its configuration and has squid load it. Pure: the same settings always
 * give the same bytes, because the document is part of each VM's identity and
 * a changed byte replaces the VM.
 *
 * Extra cloud-init from the user is never merged into this document. It
 * travels verbatim as its own MIME part, before ours; our part carries a
 * `merge_how` so cloud-init appends our lists (packages, write_files, runcmd)
 * to the user's and keeps the user's value wherever both set the same key.
 */
import { createHash } from "node:crypto";
import { isIP } from "node:net";
import { buildMultipart } from "../provider/nocloud";
import { runcmdEntry, writeFileEntry } from "./cloud-config";
import { htpasswdLine } from "./password-hash";
import {
  prefixEgressParts,
  prefixEgressProblems,
  type GuestFileText,
  type PrefixEgressSettings,
} from "./prefix-egress";

export const DEFAULT_SQUID_PORT = 3128;
/** Private ranges: a proxy that answers the whole internet is an open relay. */
export const DEFAULT_ALLOWED_CLIENT_CIDRS: readonly string[] = [
  "10.0.0.0/8",
  "172.16.0.0/12",
  "192.168.0.0/16",
];
const SQUID_CONFIG_PATH = "/etc/squid/squid.conf";
const SQUID_PASSWORD_FILE = "/etc/squid/egress-proxies.htpasswd";
/** Debian and Ubuntu put the helper here; those are the images this document targets. */
const BASIC_AUTH_HELPER = "/usr/lib/squid/basic_ncsa_auth";

export interface SquidSettings {
  port: number;
  allowedClientCidrs: readonly string[];
  /** Plaintext here only: the document carries a SHA-512-crypt hash. */
  basicAuth?: { user: string; password: string };
  /** squid.conf lines placed before the access rules (so `acl` + `http_access deny` work). */
  extraConfigLines: readonly string[];
  /** Hook (workloads/prefix-egress.ts): a routed IPv6 prefix spread over this proxy's outgoing connections. */
  prefixEgress?: PrefixEgressSettings;
}

/** Problems with the settings, each naming the field and the fix; empty when fine. */
export function squidSettingsProblems(settings: SquidSettings, field = "squid"): string[] {
  const problems: string[] = [];
  if (!Number.isInteger(settings.port) || settings.port < 1 || settings.port > 65535)
    problems.push(`${field}.port must be a whole number from 1 to 65535, e.g. 3128`);
  if (settings.allowedClientCidrs.length === 0)
    problems.push(
      `${field}.allowedClientCidrs must list at least one CIDR, e.g. ["10.0.0.0/8"]; an empty list would let nobody in`,
    );
  settings.allowedClientCidrs.forEach((cidr, index) => {
    const problem = cidrProblem(cidr);
    if (problem !== undefined)
      problems.push(`${field}.allowedClientCidrs[${index}] ${JSON.stringify(cidr)} ${problem}`);
  });
  if (settings.basicAuth !== undefined) {
    if (!/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$/.test(settings.basicAuth.user))
      problems.push(
        `${field}.basicAuth.user must be 1-64 letters, digits, '_', '.' or '-' (it appears in proxy URLs and squid's password file)`,
      );
    // The password itself is never quoted back: it is a secret.
    if (settings.basicAuth.password.length < 8)
      problems.push(`${field}.basicAuth.password must be at least 8 characters`);
    if (/[\r\n\0]/.test(settings.basicAuth.password))
      problems.push(`${field}.basicAuth.password must not contain line breaks or NUL`);
  }
  settings.extraConfigLines.forEach((line, index) => {
    // eslint-disable-next-line no-control-regex
    if (/[\u0000-\u0008\u000a-\u001f\u007f]/.test(line))
      problems.push(
        `${field}.extraConfigLines[${index}] must be one line without control characters; give each directive its own entry`,
      );
  });
  // Hook: prefix egress validates itself (and that squid's port leaves the dialer's free).
  if (settings.prefixEgress !== undefined)
    problems.push(
      ...prefixEgressProblems(settings.prefixEgress, `${field}.prefixEgress`, settings.port),
    );
  return problems;
}

function cidrProblem(cidr: string): string | undefined {
  const match = /^([^/]+)\/(\d{1,3})$/.exec(cidr);
  const family = match ? isIP(match[1]) : 0;
  if (!match || family === 0)
    return 'must be an address and a prefix length, e.g. "10.0.0.0/8" or "fd00::/8"';
  const prefix = Number(match[2]);
  if (prefix > (family === 4 ? 32 : 128))
    return `has a prefix longer than ${family === 4 ? 32 : 128} bits`;
  return undefined;
}

/** The squid.conf the proxies run. */
export function squidConfig(settings: SquidSettings): string {
  const lines = [
    "# Written by egress-proxies (EgressProxyPool). Edits are lost when the VM is replaced.",
    `http_port ${settings.port}`,
    // An egress proxy: no cache, and nothing that reveals the client behind it.
    "cache deny all",
    "forwarded_for delete",
    "via off",
    "shutdown_lifetime 3 seconds",
    "coredump_dir /var/spool/squid",
    "acl Safe_ports port 80 443 1025-65535",
    ...settings.allowedClientCidrs.map((cidr) => `acl egress_clients src ${cidr}`),
  ];
  if (settings.basicAuth !== undefined)
    lines.push(
      `auth_param basic program ${BASIC_AUTH_HELPER} ${SQUID_PASSWORD_FILE}`,
      "auth_param basic realm egress-proxies",
      "acl egress_users proxy_auth REQUIRED",
    );
  lines.push(
    // Hook: with a prefix, every request leaves through the prefix dialer.
    ...(settings.prefixEgress ? prefixEgressParts(settings.prefixEgress).squidConfigLines : []),
    ...settings.extraConfigLines,
    "http_access deny !Safe_ports",
    settings.basicAuth !== undefined
      ? "http_access allow egress_clients egress_users"
      : "http_access allow egress_clients",
    "http_access deny all",
  );
  return lines.join("\n") + "\n";
}

/** squid's helper runs as the package's user: "proxy" on Debian, "squid" elsewhere. */
const CHGRP_PASSWORD_FILE = [
  "sh",
  "-c",
  `chgrp "$(getent group proxy >/dev/null && echo proxy || echo squid)" ${SQUID_PASSWORD_FILE}`,
];
// A reload, not a restart: the squid the package started runs the package's squid.conf, and a
// squid always waits shutdown_lifetime + 1 s before it exits (30 + 1 by default), idle or not: a
// restart added half a minute to every first boot. The reload (SIGHUP) applies our ports, ACLs,
// helpers and parent at once; a squid that is not running is started.
const RELOAD_SQUID = ["systemctl", "reload-or-restart", "squid"];

/**
 * What the guest's software reads, as files and the commands that make it
 * read them: written by our cloud-config at first boot, and delivered into
 * a running member when they change (common/guest-files.ts), so a changed
 * squid.conf or dialer reaches the fleet without replacing a VM.
 */
export function squidGuestFiles(settings: SquidSettings): {
  files: GuestFileText[];
  commands: string[][];
  listensOn: number;
} {
  const prefix = settings.prefixEgress ? prefixEgressParts(settings.prefixEgress) : undefined;
  return {
    files: [
      { path: SQUID_CONFIG_PATH, permissions: "0644", content: squidConfig(settings) },
      ...(settings.basicAuth === undefined
        ? []
        : [
            {
              path: SQUID_PASSWORD_FILE,
              permissions: "0640",
              content: htpasswdLine(settings.basicAuth.user, settings.basicAuth.password) + "\n",
            },
          ]),
      ...(prefix?.files ?? []),
    ],
    commands: [
      ...(prefix?.inPlaceCommands ?? []),
      ...(settings.basicAuth === undefined ? [] : [CHGRP_PASSWORD_FILE]),
      RELOAD_SQUID,
    ],
    listensOn: settings.port,
  };
}

/** The default user-data: a cloud-config for squid. */
export function squidCloudConfig(settings: SquidSettings): string {
  return renderSquidCloudConfig(settings, (file) => file);
}

/**
 * What in the user-data is not the files delivered in place: the document
 * with every file's text left out, and the user's extra cloud-init. A change
 * of it (packages, the user's document) replaces the VM; a change of only the
 * files is delivered (common/guest-files.ts, `userDataIdentity`).
 */
export function squidUserDataIdentity(settings: SquidSettings, extraCloudInit?: string): string {
  const skeleton = renderSquidCloudConfig(settings, (file) => ({ ...file, content: "" }));
  return createHash("sha256").update(poolUserData(skeleton, extraCloudInit)).digest("hex");
}

function renderSquidCloudConfig(
  settings: SquidSettings,
  shown: (file: GuestFileText) => GuestFileText,
): string {
  const problems = squidSettingsProblems(settings);
  if (problems.length > 0) throw new Error(problems.join("; "));
  const prefix = settings.prefixEgress ? prefixEgressParts(settings.prefixEgress) : undefined;
  const { files } = squidGuestFiles(settings);
  const ours = files.filter((file) => !prefix?.files.some((each) => each.path === file.path));
  return [
    "#cloud-config",
    "# egress-proxies: squid forward proxy (EgressProxyPool's default user-data)",
    "merge_how:",
    "  - name: list",
    "    settings: [append]",
    "  - name: dict",
    "    settings: [no_replace, recurse_list]",
    "packages:",
    "  - squid",
    ...(prefix?.packages ?? []).map((name) => `  - ${name}`),
    "write_files:",
    // Deferred: written after packages are installed, so the package's own
    // squid.conf never overwrites ours and dpkg asks no conffile question.
    ...ours.flatMap((file) => writeFileEntry(shown(file), true)),
    // Hook: the prefix dialer's files, and its units started before squid reloads onto it.
    ...(prefix?.files ?? []).flatMap((file) => writeFileEntry(shown(file), false)),
    "runcmd:",
    ...(settings.basicAuth === undefined ? [] : [runcmdEntry(CHGRP_PASSWORD_FILE)]),
    ...(prefix?.commands ?? []).map(runcmdEntry),
    runcmdEntry(RELOAD_SQUID),
    "",
  ].join("\n");
}

/**
 * The user-data a pool proxy boots with: our cloud-config alone, or, with
 * extra cloud-init, a MIME multipart whose first part is the user's document
 * byte for byte (any format cloud-init accepts) and whose second part is ours.
 */
export function poolUserData(squidDocument: string, extraCloudInit?: string): string {
  if (extraCloudInit === undefined || extraCloudInit === "") return squidDocument;
  return buildMultipart([
    { payload: Buffer.from(extraCloudInit, "utf8"), filename: "extra-cloud-init" },
    { payload: Buffer.from(squidDocument, "utf8"), filename: "egress-proxies-squid.cfg" },
  ]).toString("utf8");
}
