/**
 * How LibvirtHost calls libvirt, whatever it asks: on the host's current
 * link, each call bounded by the operation's deadline (and a per-call cap),
 * each failure classified in classify.ts, and "nothing there" answers turned
 * into `undefined` where a caller asks for that. The questions themselves:
 * host-storage.ts (pools, volumes) and host.ts (domains, networks, facts).
 */
import type { Deadline } from "../common/deadline";
import { isNotFound } from "../common/errors";
import { LibvirtError, type LibvirtConnection, type Procedure } from "../libvirt-rpc-xdr";
import { classifyLibvirtError } from "./classify";
import { forgetHostListings, forgetsHostListings } from "./host-listings";

/** Longest any single call may take inside an operation's deadline. */
const PER_CALL_CAP_MS = 120_000;

export const isLibvirtCode = (error: unknown, ...codes: number[]): boolean =>
  error instanceof LibvirtError && codes.includes(error.code);

export abstract class HostRpc {
  constructor(
    /**
     * The host's shared link, asked for on every call: a create lasts minutes,
     * and the pool may close an idle link or replace a dead one meanwhile.
     */
    protected readonly link: () => Promise<LibvirtConnection>,
    /** How the host appears in messages, e.g. "kvm1.lan". */
    readonly label: string,
    protected readonly deadline: Deadline,
    /**
     * The host's key in the shared listings (connect.ts `hostKey`): every
     * call that may change the host forgets them, here and only here.
     * Undefined for a host whose Reads share nothing (the reaper's).
     */
    readonly hostKey?: string,
  ) {}

  /**
   * Stays the same object while the current link lasts (one daemon process,
   * one login): what is learnt about the host can be remembered against it.
   */
  linkIdentity(): Promise<object> {
    return this.link();
  }

  /**
   * One call on the current link, bounded by the operation's deadline. A
   * write forgets the host's listings once it has ended, failed or not (it
   * may have taken effect): a Read that starts after it asks the host again.
   */
  protected async call<Args, Ret>(procedure: Procedure<Args, Ret>, args: Args): Promise<Ret> {
    try {
      const connection = await this.link();
      return await connection.call(procedure, args, {
        timeoutMs: this.deadline.capped(PER_CALL_CAP_MS),
      });
    } finally {
      if (forgetsHostListings(procedure.name, args)) this.forgetListings();
    }
  }

  /** After a write that does not go through `call` (an upload stream). */
  protected forgetListings(): void {
    if (this.hostKey !== undefined) forgetHostListings(this.hostKey);
  }

  protected async rpc<Args, Ret>(
    procedure: Procedure<Args, Ret>,
    args: Args,
    resource: string,
  ): Promise<Ret> {
    this.deadline.check(`libvirt ${procedure.name} on ${this.label}`);
    try {
      return await this.call(procedure, args);
    } catch (error) {
      throw this.classify(error, procedure.name, resource);
    }
  }

  protected classify(error: unknown, operation: string, resource: string) {
    return classifyLibvirtError(error, { operation, resource: `${resource} on ${this.label}` });
  }

  /** Runs `call`, mapping NotFound to undefined. */
  protected async orUndefined<T>(call: () => Promise<T>): Promise<T | undefined> {
    try {
      return await call();
    } catch (error) {
      if (isNotFound(error)) return undefined;
      throw error;
    }
  }

  /** What a `connectListAll*` call returns (`needResults` 1: the objects, not only a count). */
  protected async listAll<Ret, T>(
    procedure: Procedure<{ needResults: number; flags: number }, Ret>,
    flags: number,
    resource: string,
    objects: (reply: Ret) => T[],
  ): Promise<T[]> {
    return objects(await this.rpc(procedure, { needResults: 1, flags }, resource));
  }

  protected async lookupOrUndefined<T>(
    call: () => Promise<T>,
    goneCode: number,
    operation: string,
    resource: string,
  ): Promise<T | undefined> {
    this.deadline.check(`libvirt ${operation} on ${this.label}`);
    try {
      return await call();
    } catch (error) {
      if (isLibvirtCode(error, goneCode)) return undefined;
      throw this.classify(error, operation, resource);
    }
  }
}
