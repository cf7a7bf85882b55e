/**
 * SSH failures as types. Messages name the host and what to change, and never
 * carry key material or passphrases.
 */

export type HostKeyProblem =
  /** known_hosts has keys for this host, none of them the one presented. */
  | "mismatch"
  /** The presented key is marked @revoked. */
  | "revoked"
  /** known_hosts has no entry for this host at all. */
  | "unknown"
  /**
   * known_hosts pins key types the host no longer offers (its keys were
   * replaced, or sshd_config dropped a HostKey): the handshake cannot even
   * reach a key to compare. Retrying cannot help, so it is no connect error.
   */
  | "type-not-offered";

/**
 * The host's identity could not be verified: never retried, a person must look.
 * `fingerprint` and `keyType` describe the key the host presented; for
 * "type-not-offered" it presented none, they are empty and `pinnedKeyTypes`
 * lists what known_hosts expects.
 */
export class SshHostKeyError extends Error {
  override readonly name = "SshHostKeyError";
  constructor(
    readonly problem: HostKeyProblem,
    readonly host: string,
    readonly port: number,
    readonly fingerprint: string,
    readonly keyType: string,
    readonly pinnedKeyTypes: readonly string[] = [],
  ) {
    const where = port === 22 ? host : `[${host}]:${port}`;
    const keyscan = `ssh-keyscan -p ${port} ${host}`;
    const why =
      problem === "revoked"
        ? `presented a ${keyType} host key (${fingerprint}) that known_hosts marks @revoked`
        : problem === "mismatch"
          ? `presented a ${keyType} host key (${fingerprint}) that matches none of its known_hosts entries; ` +
            "if the host was reinstalled, replace its known_hosts line"
          : problem === "type-not-offered"
            ? `offers no host key of a type known_hosts pins for it (${pinnedKeyTypes.join(", ")}); ` +
              "if its host keys were replaced, confirm the new key with the host's owner and replace " +
              `its known_hosts line (${keyscan} shows what it offers now)`
            : `has no known_hosts entry (it presented ${keyType} ${fingerprint}); ` +
              `add one (e.g. from ${keyscan}) or pass knownHosts`;
    super(`ssh host ${where} ${why}`);
  }
}

/** No offered credential was accepted. */
export class SshAuthError extends Error {
  override readonly name = "SshAuthError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** Configuration we can reject before dialing (unreadable key, wrong passphrase, bad known_hosts path). */
export class SshConfigError extends Error {
  override readonly name = "SshConfigError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/** The network path failed: refused, unreachable, handshake timeout, link lost. Retrying may help. */
export class SshConnectError extends Error {
  override readonly name = "SshConnectError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}
