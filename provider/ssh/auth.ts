/**
 * Which credentials to offer, the way users expect from `ssh`: an explicit
 * private key (with its passphrase) when one is configured; otherwise the
 * ssh-agent behind SSH_AUTH_SOCK, then the usual ~/.ssh/id_* files that need
 * no passphrase. Key material and passphrases never appear in messages; a
 * refused login names where the keys came from and their public fingerprints.
 */
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import type { AuthMethod, AgentAuthMethod, PublicKeyAuthMethod } from "ssh2";
import { parseSshKey } from "./ssh2-parts";
import { SecretValue } from "../common/redact";
import { SshConfigError } from "./errors";
import { fingerprintOf } from "./known-hosts";

export interface SshCredentials {
  /** PEM/OpenSSH private key text. Wins over the agent and ~/.ssh. */
  privateKey?: string | Buffer | SecretValue<string>;
  /**
   * Where `privateKey` was set, for messages (e.g. "connection.privateKey",
   * "provider config egress-proxies:kvmPrivateKey", "--identity ./key").
   * Default "privateKey".
   */
  privateKeySource?: string;
  passphrase?: string | SecretValue<string>;
  /** Agent socket; defaults to $SSH_AUTH_SOCK. */
  agentSocket?: string;
  /** Where to look for id_* files; defaults to the user's home. */
  homeDirectory?: string;
}

/** The key files OpenSSH tries by default, in its order. */
const DEFAULT_IDENTITY_FILES = ["id_ed25519", "id_ecdsa", "id_rsa"];

function reveal<T>(value: T | SecretValue<T> | undefined): T | undefined {
  return value instanceof SecretValue ? value.reveal() : value;
}

/** The credentials to offer, in order, and where they came from in words (no key material). */
export interface ResolvedAuth {
  methods: AuthMethod[];
  /** e.g. "the key from connection.privateKey (ssh-ed25519 SHA256:…)". */
  offered: string;
}

/** A parsed key as a person finds it in authorized_keys: its type and fingerprint. */
function describeKey(key: ReturnType<typeof parseSshKey>): string {
  if (key instanceof Error) return "";
  const parsed = Array.isArray(key) ? key[0] : key;
  return parsed === undefined ? "" : `${parsed.type} ${fingerprintOf(parsed.getPublicSSH())}`;
}

export function resolveAuth(username: string, credentials: SshCredentials = {}): ResolvedAuth {
  const explicitKey = reveal(credentials.privateKey);
  if (explicitKey !== undefined) {
    const passphrase = reveal(credentials.passphrase);
    const parsed = parseSshKey(explicitKey, passphrase);
    if (parsed instanceof Error) {
      const hint = /passphrase|encrypted|decrypt/i.test(parsed.message)
        ? passphrase === undefined
          ? "it is encrypted: set the passphrase"
          : "the passphrase does not decrypt it"
        : "it is not an OpenSSH or PEM private key";
      throw new SshConfigError(`ssh privateKey cannot be used: ${hint}`);
    }
    const method: PublicKeyAuthMethod = { type: "publickey", username, key: parsed };
    const source = credentials.privateKeySource ?? "privateKey";
    return { methods: [method], offered: `the key from ${source} (${describeKey(parsed)})` };
  }

  const methods: AuthMethod[] = [];
  const offered: string[] = [];
  const agent = credentials.agentSocket ?? process.env.SSH_AUTH_SOCK;
  if (agent) {
    const method: AgentAuthMethod = { type: "agent", username, agent };
    methods.push(method);
    offered.push(`the keys of the ssh-agent at ${agent}`);
  }
  const sshDirectory = join(credentials.homeDirectory ?? homedir(), ".ssh");
  for (const file of DEFAULT_IDENTITY_FILES) {
    let text: Buffer;
    try {
      text = readFileSync(join(sshDirectory, file));
    } catch {
      continue;
    }
    const parsed = parseSshKey(text);
    // Encrypted default keys need a passphrase we do not have; ssh would prompt, we skip.
    if (parsed instanceof Error) continue;
    const method: PublicKeyAuthMethod = { type: "publickey", username, key: parsed };
    methods.push(method);
    offered.push(`${join(sshDirectory, file)} (${describeKey(parsed)})`);
  }
  if (methods.length === 0) {
    throw new SshConfigError(
      `no SSH credentials for ${username}: set privateKey, run an ssh-agent (SSH_AUTH_SOCK), ` +
        `or put an unencrypted key in ${join(sshDirectory, DEFAULT_IDENTITY_FILES[0]!)}`,
    );
  }
  return { methods, offered: offered.join(", then ") };
}
