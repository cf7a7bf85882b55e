/**
 * The TCP socket under ssh2, writing each tick's output in one system call.
 *
 * ssh2 hands its socket every SSH packet in three or four pieces (length,
 * ciphertext, MAC) and never batches them. Node writes each piece at once, so
 * a bulk upload on a fast link costs a write(2) per piece: three per 32 KiB
 * packet, and with TCP_NODELAY a TCP segment each. Profiled on Node 26 that
 * was the largest single cost of a volume upload (a third of the uploading
 * process's CPU), and every tiny segment also wakes the peer's sshd.
 *
 * Corking on the first write of a tick and uncorking on the next tick keeps
 * the order of the bytes and adds no latency beyond the current tick, but
 * lets Node pass everything written in between to the kernel as one
 * writev(2).
 */
import { Socket } from "node:net";

/**
 * Opens a TCP connection whose writes are batched per tick.
 *
 * The batching wraps the instance's `write` after `connect()`: Node's own
 * `Socket.prototype.connect` resets `this.write` to the prototype's, so an
 * override in a subclass would silently stop working there.
 */
export function connectTickCorked(host: string, port: number): Socket {
  const socket = new Socket();
  socket.connect({ host, port });
  const write = socket.write;
  let corkedForTick = false;
  const uncorkAfterTick = (): void => {
    corkedForTick = false;
    socket.uncork();
  };
  socket.write = function writeCorkedForTick(this: Socket, ...args: unknown[]): boolean {
    if (!corkedForTick && !socket.destroyed) {
      corkedForTick = true;
      socket.cork();
      process.nextTick(uncorkAfterTick);
    }
    return (write as (...args: unknown[]) => boolean).apply(socket, args);
  } as Socket["write"];
  return socket;
}
