/**
 * One libvirt connection per host for the whole provider process: the
 * dynamic provider serves every KvmProxy of a `pulumi up` from one process,
 * so ten proxies on one host share one link. A link that died is dialled
 * again on the next use; nothing here is captured by the serialized provider.
 */
import type { Deadline } from "../common/deadline";
import type { LibvirtConnection } from "../libvirt-rpc-xdr";
import { openLocalLibvirt } from "../ssh/local";
import { classifyLibvirtError } from "./classify";
import { LibvirtHost } from "./host";
import { hostLabel } from "./naming";
import type { KvmProxyInputs } from "./schema";

export interface HostSession {
  host: LibvirtHost;
  /** Stable identity of the host for caches and single flight. */
  hostKey: string;
  /** How the host appears in ids and outputs. */
  label: string;
}

type HostTarget = Pick<KvmProxyInputs, "connection" | "socketPath">;

const links = new Map<string, Promise<LibvirtConnection>>();

function hostKeyOf(target: HostTarget): string {
  return target.connection === undefined
    ? `unix:${target.socketPath}`
    : `ssh:${target.connection.user}@${target.connection.host}:${target.connection.port}:${target.socketPath}`;
}

async function dial(
  target: HostTarget,
  key: string,
  deadline: Deadline,
): Promise<LibvirtConnection> {
  const forget = () => {
    links.delete(key);
  };
  if (target.connection !== undefined)
    throw new Error("SSH hosts are reached through provider/ssh; see connectRemote");
  return openLocalLibvirt({
    socketPath: target.socketPath,
    connectTimeoutMs: deadline.capped(10_000),
    handshakeTimeoutMs: deadline.capped(15_000),
    onClosed: forget,
  });
}

async function connection(target: HostTarget, deadline: Deadline): Promise<LibvirtConnection> {
  const key = hostKeyOf(target);
  let pending = links.get(key);
  if (pending === undefined) {
    pending = dial(target, key, deadline);
    links.set(key, pending);
    // A failed dial must not stay cached: the next caller dials again.
    pending.catch(() => links.delete(key));
  }
  try {
    return await pending;
  } catch (error) {
    throw classifyLibvirtError(error, {
      operation: "connect",
      resource: hostLabel(target.connection),
    });
  }
}

export async function openHost(target: HostTarget, deadline: Deadline): Promise<HostSession> {
  const label = hostLabel(target.connection);
  const link = await connection(target, deadline);
  return { host: new LibvirtHost(link, label, deadline), hostKey: hostKeyOf(target), label };
}

/** Closes every pooled link (tests, and the end of a provider process). */
export async function closeAllHosts(): Promise<void> {
  const pending = [...links.values()];
  links.clear();
  await Promise.all(pending.map((link) => link.then((c) => c.close()).catch(() => undefined)));
}
