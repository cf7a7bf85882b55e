/**
 * One libvirt connection per host for the whole provider process. Callers
 * share it (libvirt pipelines calls); a dial in progress is shared too, so
 * ten creates on one host log in once. A dead link is replaced on the next
 * call. An error the daemon reported (no such domain, bad XML) says nothing
 * about the link and keeps it; a transport error drops it.
 *
 * The shared dial is not tied to any one caller's AbortSignal: a caller that
 * gives up stops waiting, the dial carries on for the others.
 */
import {
  LibvirtConnection,
  LibvirtTransportError,
  type CallCounter,
  type CallOptions,
} from "../libvirt-rpc-xdr";
import { hostAndPort } from "./address";

export interface ConnectionPoolOptions<Target> {
  /** Opens a new connection to a target (e.g. openLibvirtOverSsh with dial options bound). */
  dial: (target: Target) => Promise<LibvirtConnection>;
  /** Which targets share a connection. */
  keyOf: (target: Target) => string;
  /**
   * Close a connection nobody has used for this long (and with no call in flight), so an idle
   * provider process holds no SSH session open and can exit. Default 60 s; 0 keeps links forever.
   */
  idleCloseMs?: number;
}

export class LibvirtConnectionPool<Target> {
  private readonly live = new Map<string, LibvirtConnection>();
  private readonly dialing = new Map<string, Promise<LibvirtConnection>>();
  private readonly lastUsed = new Map<string, number>();
  private sweeper: NodeJS.Timeout | undefined;
  /** How many dials were started; tests and logs use it to see sharing work. */
  dialCount = 0;
  private callCounter: CallCounter | undefined;

  constructor(private readonly options: ConnectionPoolOptions<Target>) {}

  /** The shared connection for `target`, dialing if there is none (or it died). */
  async get(
    target: Target,
    wait: Pick<CallOptions, "signal" | "timeoutMs"> = {},
  ): Promise<LibvirtConnection> {
    const key = this.options.keyOf(target);
    this.lastUsed.set(key, Date.now());
    const existing = this.live.get(key);
    if (existing && !existing.isClosed) return existing;
    if (existing) this.live.delete(key);
    let pending = this.dialing.get(key);
    if (!pending) {
      this.dialCount++;
      pending = this.options.dial(target).then(
        (connection) => {
          this.dialing.delete(key);
          if (this.callCounter !== undefined) connection.countCallsInto(this.callCounter);
          this.live.set(key, connection);
          this.lastUsed.set(key, Date.now());
          this.startSweeper();
          return connection;
        },
        (error: unknown) => {
          this.dialing.delete(key);
          throw error;
        },
      );
      this.dialing.set(key, pending);
    }
    return waitFor(pending, key, wait);
  }

  /**
   * Runs `work` on the shared connection. If it fails because the link broke,
   * the link is dropped so the next call dials afresh; daemon errors keep it.
   */
  async run<T>(
    target: Target,
    work: (connection: LibvirtConnection) => Promise<T>,
    wait: Pick<CallOptions, "signal" | "timeoutMs"> = {},
  ): Promise<T> {
    const connection = await this.get(target, wait);
    try {
      return await work(connection);
    } catch (error) {
      if (error instanceof LibvirtTransportError || connection.isClosed)
        this.drop(target, connection);
      throw error;
    } finally {
      this.lastUsed.set(this.options.keyOf(target), Date.now());
    }
  }

  private startSweeper(): void {
    const idleMs = this.options.idleCloseMs ?? 60_000;
    if (idleMs <= 0 || this.sweeper) return;
    this.sweeper = setInterval(
      () => this.closeIdle(idleMs),
      Math.max(10, Math.min(idleMs / 2, 5000)),
    );
    this.sweeper.unref();
  }

  private closeIdle(idleMs: number): void {
    const now = Date.now();
    for (const [key, connection] of this.live) {
      if (connection.inFlight > 0 || now - (this.lastUsed.get(key) ?? 0) < idleMs) continue;
      this.live.delete(key);
      void connection.close();
    }
    if (this.live.size === 0 && this.sweeper) {
      clearInterval(this.sweeper);
      this.sweeper = undefined;
    }
  }

  /** Closes and forgets a target's connection (only if it is still `connection`). */
  drop(target: Target, connection?: LibvirtConnection): void {
    const key = this.options.keyOf(target);
    const current = this.live.get(key);
    if (!current || (connection && current !== connection)) return;
    this.live.delete(key);
    current.destroy(
      new LibvirtTransportError(
        "closed",
        "connection dropped from the pool after a transport error",
      ),
    );
  }

  /** Counts the calls of every link, live or dialled later, into `counter` (undefined: stop). */
  countCallsInto(counter: CallCounter | undefined): void {
    this.callCounter = counter;
    for (const connection of this.live.values()) connection.countCallsInto(counter);
  }

  get size(): number {
    return this.live.size;
  }

  /** Calls somebody still waits for, over every live link (a failed operation must leave none). */
  get callsInFlight(): number {
    let calls = 0;
    for (const connection of this.live.values()) calls += connection.inFlight;
    return calls;
  }

  /** Closes every connection; never blocks longer than each connection's close bound. */
  async closeAll(): Promise<void> {
    const dials = [...this.dialing.values()];
    this.dialing.clear();
    if (this.sweeper) clearInterval(this.sweeper);
    this.sweeper = undefined;
    const connections = [...this.live.values()];
    this.live.clear();
    await Promise.all(connections.map((connection) => connection.close()));
    // Dials still in flight are closed when they land, so nothing outlives the pool.
    for (const dial of dials)
      dial.then(
        (connection) => connection.close(),
        () => undefined,
      );
  }
}

function waitFor<T>(
  promise: Promise<T>,
  key: string,
  wait: Pick<CallOptions, "signal" | "timeoutMs">,
): Promise<T> {
  if (wait.signal === undefined && wait.timeoutMs === undefined) return promise;
  return new Promise<T>((resolve, reject) => {
    const done = (): void => {
      clearTimeout(timer);
      wait.signal?.removeEventListener("abort", onAbort);
    };
    const onAbort = (): void => {
      done();
      reject(
        new LibvirtTransportError("handshake", `gave up waiting for the connection to ${key}`),
      );
    };
    const timer =
      wait.timeoutMs === undefined
        ? undefined
        : setTimeout(() => {
            done();
            reject(
              new LibvirtTransportError(
                "handshake",
                `connecting to ${key} took longer than ${wait.timeoutMs} ms`,
              ),
            );
          }, wait.timeoutMs);
    timer?.unref();
    if (wait.signal?.aborted) {
      onAbort();
      return;
    }
    wait.signal?.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => {
        done();
        resolve(value);
      },
      (error: unknown) => {
        done();
        reject(error);
      },
    );
  });
}

interface SshAddress {
  username: string;
  host: string;
  port?: number;
}

/** The pool key for SSH targets: one link per path of jump hosts, user, host, port, socket and URI. */
export function sshTargetKey(
  target: SshAddress & { socketPath?: string; uri?: string; jumps?: SshAddress[] },
): string {
  const address = (hop: SshAddress) => `${hop.username}@${hostAndPort(hop.host, hop.port ?? 22)}`;
  const path = (target.jumps ?? []).map((hop) => `${address(hop)}>`).join("");
  return `${path}${address(target)}${target.socketPath ?? ""}#${target.uri ?? "qemu:///system"}`;
}
