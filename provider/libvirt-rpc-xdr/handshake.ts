/**
 * The handshake libvirt's own remote driver speaks on a new connection:
 * AUTH_LIST, then (if the daemon supports it) keepalive, then CONNECT_OPEN.
 *
 * The three calls leave together, so a daemon that wants no authentication
 * (root over SSH, or a socket the libvirt group may use) answers the
 * handshake in one round trip instead of three. libvirtd runs one client's
 * calls side by side, and on a polkit socket it is AUTH_LIST itself that
 * lets root in: an early call may overtake it and be refused
 * ("authentication required", an RPC error), as it is before polkit
 * authentication. A call refused so is asked again once AUTH_LIST (and
 * polkit) are done, one more round trip in that case only.
 */
import type { CallOptions } from "./deadlines";
import { ErrorCode, LibvirtError, LibvirtTimeoutError, LibvirtTransportError } from "./errors";
import { AuthType, FEATURE_PROGRAM_KEEPALIVE, Procedures, type Procedure } from "./protocol";

export interface ConnectionInfo {
  /** Authentication types the daemon offered (AuthType values). */
  authTypes: number[];
  /** Whether the daemon supports the keepalive program. */
  keepalive: boolean;
}

/** What the handshake needs of a connection: its calls, and its end when the handshake fails. */
export interface HandshakePeer {
  call<Args, Ret>(procedure: Procedure<Args, Ret>, args: Args, options?: CallOptions): Promise<Ret>;
  destroy(reason: LibvirtTransportError): void;
}

export interface HandshakeOptions {
  /** The URI passed to CONNECT_OPEN. Default "qemu:///system". */
  uri?: string;
  /** Deadline for the whole handshake. Default 15 s. */
  handshakeTimeoutMs?: number;
  signal?: AbortSignal;
}

type Settled<T> = { ok: true; value: T } | { ok: false; error: unknown };

/** The outcome of a call that is judged later, so its failure is no unhandled rejection meanwhile. */
const settled = <T>(promise: Promise<T>): Promise<Settled<T>> =>
  promise.then(
    (value) => ({ ok: true, value }),
    (error: unknown) => ({ ok: false, error }),
  );

/** Runs the handshake on `peer`; on any failure destroys it and throws. */
export async function handshake(
  peer: HandshakePeer,
  options: HandshakeOptions,
): Promise<ConnectionInfo> {
  const handshakeMs = options.handshakeTimeoutMs ?? 15_000;
  const callOptions: CallOptions = {
    deadline: Date.now() + handshakeMs,
    ...(options.signal ? { signal: options.signal } : {}),
  };
  const askKeepalive = () =>
    settled(
      peer.call(
        Procedures.connectSupportsFeature,
        { feature: FEATURE_PROGRAM_KEEPALIVE },
        callOptions,
      ),
    );
  const askOpen = () =>
    settled(
      peer.call(
        Procedures.connectOpen,
        { name: options.uri ?? "qemu:///system", flags: 0 },
        callOptions,
      ),
    );
  try {
    const authList = peer.call(Procedures.authList, undefined, callOptions);
    const early = [askKeepalive(), askOpen()] as const;
    const { types, didAuthenticate } = await authenticate(peer, authList, callOptions);
    const refused = (outcome: Settled<unknown>): boolean =>
      !outcome.ok &&
      (didAuthenticate ||
        (outcome.error instanceof LibvirtError && outcome.error.code === ErrorCode.RPC));
    const [earlyKeepalive, earlyOpen] = await Promise.all(early);
    const [keepalive, opened] = await Promise.all([
      refused(earlyKeepalive) ? askKeepalive() : earlyKeepalive,
      refused(earlyOpen) ? askOpen() : earlyOpen,
    ]);
    if (!keepalive.ok && !(keepalive.error instanceof LibvirtError)) throw keepalive.error;
    if (!opened.ok) throw opened.error;
    return { authTypes: types, keepalive: keepalive.ok && keepalive.value };
  } catch (error) {
    const reason =
      error instanceof LibvirtTimeoutError
        ? new LibvirtTransportError(
            "handshake",
            `libvirt handshake did not finish within ${handshakeMs} ms`,
            { cause: error },
          )
        : error;
    peer.destroy(
      reason instanceof LibvirtTransportError
        ? reason
        : new LibvirtTransportError("handshake", "libvirt handshake failed", { cause: reason }),
    );
    throw reason;
  }
}

/** What AUTH_LIST offered, and whether an authentication step ran (then the open is asked again). */
async function authenticate(
  peer: HandshakePeer,
  authList: Promise<number[]>,
  options: CallOptions,
): Promise<{ types: number[]; didAuthenticate: boolean }> {
  let types: number[];
  try {
    types = await authList;
  } catch (error) {
    // A daemon too old to know AUTH_LIST needs no authentication step.
    if (error instanceof LibvirtError && error.code === ErrorCode.NO_SUPPORT)
      return { types: [], didAuthenticate: false };
    throw error;
  }
  if (types.length === 0 || types.includes(AuthType.NONE)) return { types, didAuthenticate: false };
  if (types.includes(AuthType.POLKIT)) {
    await peer.call(Procedures.authPolkit, undefined, options);
    return { types, didAuthenticate: true };
  }
  throw new LibvirtError("authList", {
    code: ErrorCode.AUTH_UNAVAILABLE,
    domain: 0,
    message: `the daemon only offers authentication types [${types.join(", ")}]; this client supports none (0) and polkit (2)`,
    level: 2,
    dom: null,
    str1: null,
    str2: null,
    str3: null,
    int1: 0,
    int2: 0,
    net: null,
  });
}
