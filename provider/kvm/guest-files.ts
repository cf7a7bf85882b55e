/**
 * Files read in a guest through its qemu-guest-agent (libvirt's passthrough:
 * guest-file-open, guest-file-read until end of file, guest-file-close), and
 * what the guest's socket tables say of the proxy's port (common/guest-view.ts).
 */
import type { Deadline } from "../common/deadline";
import { GUEST_SOCKET_TABLES, guestViewOf, type GuestView } from "../common/guest-view";
import type { DomainHandle } from "../libvirt-rpc-xdr";
import type { LibvirtHost } from "./host";

/** What one read asks for; a socket table of a proxy VM is a few KiB. */
const READ_CHUNK_BYTES = 64 * 1024;
/** A file larger than this is not what was asked for: the read stops there. */
const MAX_FILE_BYTES = 1024 * 1024;
/** Longest the agent may take for one command: a guest that slow is not answering. */
const AGENT_COMMAND_SECONDS = 5;

/** The text of `path` in the guest, through its agent. */
export async function readGuestFile(
  host: LibvirtHost,
  dom: DomainHandle,
  path: string,
  deadline: Deadline,
): Promise<string> {
  const seconds = () =>
    Math.max(1, Math.min(AGENT_COMMAND_SECONDS, Math.floor(deadline.remainingMs() / 1000)));
  const handle = await host.agentCommand(dom, "guest-file-open", { path, mode: "r" }, seconds());
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for (;;) {
      const read = (await host.agentCommand(
        dom,
        "guest-file-read",
        { handle, count: READ_CHUNK_BYTES },
        seconds(),
      )) as { "buf-b64"?: unknown; eof?: unknown };
      const chunk = Buffer.from(
        typeof read["buf-b64"] === "string" ? read["buf-b64"] : "",
        "base64",
      );
      chunks.push(chunk);
      size += chunk.length;
      if (read.eof === true || chunk.length === 0 || size >= MAX_FILE_BYTES) break;
    }
  } finally {
    await host.agentCommand(dom, "guest-file-close", { handle }, seconds()).catch(() => undefined);
  }
  return Buffer.concat(chunks).toString("latin1");
}

/** Whether the guest listens on `port`, from its socket tables; "unknown" when its agent cannot tell. */
export async function guestViewOfDomain(
  host: LibvirtHost,
  dom: DomainHandle,
  port: number,
  deadline: Deadline,
): Promise<GuestView> {
  const tables: Array<string | undefined> = [];
  // One after another: the agent serves one command at a time anyway.
  for (const table of GUEST_SOCKET_TABLES)
    tables.push(await readGuestFile(host, dom, table, deadline).catch(() => undefined));
  return guestViewOf(tables, port);
}
