/**
 * OpenSSH known_hosts, read the way `ssh` reads it (sshd(8) "SSH_KNOWN_HOSTS
 * FILE FORMAT"): comma-separated host patterns with `*`/`?` wildcards and `!`
 * negation, hashed hosts (`|1|salt|hmac-sha1`), `[host]:port` for ports other
 * than 22, several keys (and key types) per host, and `@revoked` markers.
 * `@cert-authority` lines are recognised and ignored: host certificates are
 * not supported, so such a host is "unknown" unless a plain key line exists.
 */
import { createHash, createHmac } from "node:crypto";
import { canonicalHost } from "./address";
import { SshHostKeyError } from "./errors";

export interface KnownHostEntry {
  marker: "revoked" | "cert-authority" | undefined;
  patterns: string[];
  keyType: string;
  /** The public key blob (base64-decoded). */
  key: Buffer;
  line: number;
}

export type HostKeyVerdict =
  { ok: true; keyType: string; fingerprint: string } | { ok: false; error: SshHostKeyError };

/** Parses known_hosts content; malformed lines are skipped, as OpenSSH does. */
export function parseKnownHosts(content: string): KnownHostEntry[] {
  const entries: KnownHostEntry[] = [];
  content.split(/\r?\n/).forEach((raw, index) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    const fields = line.split(/\s+/);
    let marker: KnownHostEntry["marker"];
    if (fields[0] === "@revoked" || fields[0] === "@cert-authority") {
      marker = fields[0] === "@revoked" ? "revoked" : "cert-authority";
      fields.shift();
    } else if (fields[0]!.startsWith("@")) {
      return;
    }
    if (fields.length < 3) return;
    const [hosts, keyType, keyBase64] = fields as [string, string, string];
    const key = Buffer.from(keyBase64, "base64");
    if (key.length === 0 || keyTypeOfBlob(key) !== keyType) return;
    entries.push({ marker, patterns: hosts.split(","), keyType, key, line: index + 1 });
  });
  return entries;
}

/** The name known_hosts uses for a host: `host` on port 22, `[host]:port` otherwise. */
export function knownHostsName(host: string, port: number): string {
  // ssh lowercases the host name before matching (and before hashing), so do we; an IPv6
  // literal is matched in the spelling ssh-keyscan writes, bare on port 22 and inside the
  // port's brackets otherwise, never twice.
  const name = canonicalHost(host).toLowerCase();
  return port === 22 ? name : `[${name}]:${port}`;
}

function globToRegExp(pattern: string): RegExp {
  const escaped = pattern
    .replace(/[.+^${}()|[\]\\]/g, "\\$&")
    .replace(/\*/g, ".*")
    .replace(/\?/g, ".");
  return new RegExp(`^${escaped}$`, "i");
}

function patternMatches(pattern: string, name: string): boolean {
  if (pattern.startsWith("|1|")) {
    const [, , salt, hash] = pattern.split("|");
    if (!salt || !hash) return false;
    const digest = createHmac("sha1", Buffer.from(salt, "base64")).update(name).digest("base64");
    return digest === hash;
  }
  return globToRegExp(pattern).test(name);
}

/** Whether an entry's host field applies to `name` (a negated match excludes the entry). */
export function entryMatchesHost(entry: KnownHostEntry, name: string): boolean {
  let matched = false;
  for (const pattern of entry.patterns) {
    if (pattern.startsWith("!")) {
      if (patternMatches(pattern.slice(1), name)) return false;
    } else if (patternMatches(pattern, name)) {
      matched = true;
    }
  }
  return matched;
}

/** The key type string at the start of an SSH public key blob. */
function keyTypeOfBlob(blob: Buffer): string {
  if (blob.length < 4) return "";
  const length = blob.readUInt32BE(0);
  if (length > blob.length - 4 || length > 64) return "";
  return blob.toString("latin1", 4, 4 + length);
}

/** OpenSSH's SHA256 fingerprint: "SHA256:" + unpadded base64. */
export function fingerprintOf(blob: Buffer): string {
  return `SHA256:${createHash("sha256").update(blob).digest("base64").replace(/=+$/, "")}`;
}

/** Checks the key a host presented against known_hosts entries. */
export function verifyHostKey(
  entries: readonly KnownHostEntry[],
  host: string,
  port: number,
  presented: Buffer,
): HostKeyVerdict {
  const name = knownHostsName(host, port);
  const keyType = keyTypeOfBlob(presented);
  const fingerprint = fingerprintOf(presented);
  const forHost = entries.filter((entry) => entryMatchesHost(entry, name));
  if (forHost.some((entry) => entry.marker === "revoked" && entry.key.equals(presented))) {
    return { ok: false, error: new SshHostKeyError("revoked", host, port, fingerprint, keyType) };
  }
  const pinned = forHost.filter((entry) => entry.marker === undefined);
  if (pinned.some((entry) => entry.key.equals(presented)))
    return { ok: true, keyType, fingerprint };
  const problem = pinned.length > 0 ? "mismatch" : "unknown";
  return { ok: false, error: new SshHostKeyError(problem, host, port, fingerprint, keyType) };
}

/** ssh2 host-key algorithm names for each known_hosts key type. */
const ALGORITHMS_FOR_KEY_TYPE: Record<string, string[]> = {
  "ssh-ed25519": ["ssh-ed25519"],
  "ecdsa-sha2-nistp256": ["ecdsa-sha2-nistp256"],
  "ecdsa-sha2-nistp384": ["ecdsa-sha2-nistp384"],
  "ecdsa-sha2-nistp521": ["ecdsa-sha2-nistp521"],
  "ssh-rsa": ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"],
};

/** The key types of the plain (not @revoked, not @cert-authority) entries for this host, in file order. */
export function pinnedKeyTypes(
  entries: readonly KnownHostEntry[],
  host: string,
  port: number,
): string[] {
  const name = knownHostsName(host, port);
  const types = entries
    .filter((entry) => entry.marker === undefined && entryMatchesHost(entry, name))
    .map((entry) => entry.keyType);
  return [...new Set(types)];
}

/**
 * The host-key algorithms to offer: those of the keys known_hosts pins for
 * this host, so a server whose first choice is another type still presents
 * a key we can check. `undefined` when nothing is pinned (keep ssh2's list;
 * verification will then report the host as unknown).
 */
export function pinnedHostKeyAlgorithms(
  entries: readonly KnownHostEntry[],
  host: string,
  port: number,
): string[] | undefined {
  const algorithms = pinnedKeyTypes(entries, host, port).flatMap(
    (keyType) => ALGORITHMS_FOR_KEY_TYPE[keyType] ?? [],
  );
  return algorithms.length > 0 ? algorithms : undefined;
}

/**
 * Whether a failed handshake means "the host offers none of the pinned key
 * types": ssh2 then ends the key exchange with this message (its kex.js)
 * before any key is presented, so the host verifier never runs.
 */
export function isNoCommonHostKeyType(error: Error): boolean {
  return /no matching host key format/i.test(error.message);
}

/** Hashes a host name the way `ssh-keygen -H` does (for tests and for writing entries). */
export function hashKnownHostsName(name: string, salt: Buffer): string {
  const hash = createHmac("sha1", salt).update(name).digest("base64");
  return `|1|${salt.toString("base64")}|${hash}`;
}
