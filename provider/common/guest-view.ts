/**
 * The guest's own view of the proxy, asked through the hypervisor when the
 * runner's re-check got no answer: does anything in the guest listen on the
 * proxy's port? A proxy silent from here but listening there is "path
 * unknown" (the runner's path, a firewall, a route) rather than dead, and is
 * not restarted for it (docs/day2.md, "Corroborated before a restart").
 *
 * The question is put as reading the kernel's socket tables, which every
 * Linux guest has and which need nothing installed or run in the guest:
 * libvirt's guest-agent passthrough (guest-file-open/read) and Proxmox's
 * `agent/file-read` both read a file. Pure: the backends fetch the tables.
 */

/** What the guest says; "unknown" when it could not be asked (no agent, no privilege, no answer in time). */
export type GuestView = "listening" | "not-listening" | "unknown";

/** The socket tables read, IPv4 then IPv6 (a dual-stack listener on `::` is in the second). */
export const GUEST_SOCKET_TABLES = ["/proc/net/tcp", "/proc/net/tcp6"] as const;

/** The kernel's TCP state number for LISTEN, as /proc/net/tcp prints it. */
const LISTEN = "0A";

/** Loopback as /proc prints a local address: 127.0.0.0/8 (host order, little-endian) and ::1. */
function isLoopback(hexAddress: string): boolean {
  if (hexAddress.length === 8) return hexAddress.slice(6, 8).toUpperCase() === "7F";
  return /^0{24}01000000$/i.test(hexAddress);
}

/**
 * Whether a socket in `tables` (the text of /proc/net/tcp and tcp6) listens
 * on `port` on an address other than loopback: one only the guest itself
 * can reach serves no client.
 */
export function listensOn(tables: readonly string[], port: number): boolean {
  return tables.some((table) =>
    table
      .split("\n")
      .slice(1)
      .some((line) => {
        const [, local, , state] = line.trim().split(/\s+/);
        const match = /^([0-9A-Fa-f]+):([0-9A-Fa-f]{4})$/.exec(local ?? "");
        return (
          match !== null &&
          state === LISTEN &&
          parseInt(match[2]!, 16) === port &&
          !isLoopback(match[1]!)
        );
      }),
  );
}

/** The view from tables that were read (undefined entries: a table that could not be read). */
export function guestViewOf(tables: ReadonlyArray<string | undefined>, port: number): GuestView {
  const read = tables.filter((table): table is string => table !== undefined);
  if (read.length === 0) return "unknown";
  if (listensOn(read, port)) return "listening";
  // Only one table read: a listener may be in the other.
  return read.length === tables.length ? "not-listening" : "unknown";
}
