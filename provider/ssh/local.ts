/**
 * The local transport: libvirtd's unix socket on the machine this program
 * runs on. Connecting has its own deadline (a socket file whose daemon hangs
 * in accept would otherwise wait forever).
 */
import { connect, type Socket } from "node:net";
import {
  LibvirtConnection,
  LibvirtTransportError,
  type ConnectionOptions,
} from "../libvirt-rpc-xdr";

export const DEFAULT_LIBVIRT_SOCKET = "/var/run/libvirt/libvirt-sock";

export interface LocalLibvirtOptions extends ConnectionOptions {
  /** Path of libvirtd's socket. Default /var/run/libvirt/libvirt-sock. */
  socketPath?: string;
  /** Deadline for the socket connect itself. Default 10 s. */
  connectTimeoutMs?: number;
}

function connectUnixSocket(path: string, timeoutMs: number, signal?: AbortSignal): Promise<Socket> {
  return new Promise<Socket>((resolve, reject) => {
    const socket = connect({ path });
    const fail = (error: Error): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      socket.destroy();
      reject(error);
    };
    const onAbort = (): void =>
      fail(
        new LibvirtTransportError("io", `connecting to ${path} was aborted`, {
          cause: signal?.reason,
        }),
      );
    const timer = setTimeout(
      () =>
        fail(
          new LibvirtTransportError("io", `connecting to ${path} took longer than ${timeoutMs} ms`),
        ),
      timeoutMs,
    );
    timer.unref();
    signal?.addEventListener("abort", onAbort, { once: true });
    socket.once("error", (error) =>
      fail(new LibvirtTransportError("io", unixSocketProblem(path, error), { cause: error })),
    );
    socket.once("connect", () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      socket.removeAllListeners("error");
      // Until the connection attaches its own listener, an early error must not crash the process.
      socket.on("error", () => undefined);
      resolve(socket);
    });
  });
}

/**
 * Why the socket cannot be reached, in the words that lead to the fix. On
 * Debian and Ubuntu the socket is root:libvirt 0660/0770: a user outside the
 * group gets EACCES, and `usermod -aG` only counts from the next login.
 */
function unixSocketProblem(path: string, error: NodeJS.ErrnoException): string {
  const prefix = `cannot connect to libvirt socket ${path}: ${error.message}`;
  if (error.code === "EACCES" || error.code === "EPERM")
    return (
      `${prefix}; this user may not use it: add the user to the libvirt group ` +
      "(sudo usermod -aG libvirt $USER) and log in again (group membership counts from the next login; " +
      "`newgrp libvirt` or `id -nG` to check), or run as root"
    );
  if (error.code === "ENOENT")
    return `${prefix}; libvirtd is not running or listens elsewhere: start it (systemctl start libvirtd, or virtqemud on modular hosts) or set socketPath`;
  if (error.code === "ECONNREFUSED")
    return `${prefix}; nothing accepts on it: libvirtd stopped or is restarting (systemctl status libvirtd)`;
  return `${prefix}; is libvirtd running and is the path right?`;
}

/** Opens a libvirt connection over the local unix socket. */
export async function openLocalLibvirt(
  options: LocalLibvirtOptions = {},
): Promise<LibvirtConnection> {
  const path = options.socketPath ?? DEFAULT_LIBVIRT_SOCKET;
  const socket = await connectUnixSocket(path, options.connectTimeoutMs ?? 10_000, options.signal);
  return LibvirtConnection.open(socket, options);
}
