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
  | "unknown";

/** The host's identity could not be verified: never retried, a person must look. */
export class SshHostKeyError extends Error {
  override readonly name = "SshHostKeyError";
  constructor(
    readonly problem: HostKeyProblem,
    readonly host: string,
    readonly port: number,
    readonly fingerprint: string,
    readonly keyType: string,
  ) {
    const where = port === 22 ? host : `[${host}]:${port}`;
    const why =
      problem === "revoked"
        ? `presented a ${keyType} host key (${fingerprint}) that known_hosts marks @revoked`
        : problem === "mismatch"
          ? `presented a ${keyType} host key (${fingerprint}) that matches none of its known_hosts entries; ` +
            "if the host was reinstalled, replace its known_hosts line"
          : `has no known_hosts entry (it presented ${keyType} ${fingerprint}); ` +
            `add one (e.g. from ssh-keyscan -p ${port} ${host}) or pass knownHosts`;
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
