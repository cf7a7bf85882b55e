/**
 * Files read and written in a guest through its qemu-guest-agent (libvirt's
 * passthrough: guest-file-open/read/write/close), commands run there
 * (guest-exec, guest-exec-status), and what the guest's socket tables say of
 * the proxy's port (common/guest-view.ts).
 */
import type { Deadline } from "../common/deadline";
import { untilExited, type GuestChannel, type GuestExecStatus } from "../common/guest-files";
import { GUEST_SOCKET_TABLES, guestViewOf, type GuestView } from "../common/guest-view";
import type { DomainHandle } from "../libvirt-rpc-xdr";
import type { LibvirtHost } from "./host";

/** What one read asks for; a socket table of a proxy VM is a few KiB. */
const READ_CHUNK_BYTES = 64 * 1024;
/** A file larger than this is not what was asked for: the read stops there. */
const MAX_FILE_BYTES = 1024 * 1024;
/** Longest the agent may take for one command when a read asks: a guest that slow is not answering. */
const AGENT_COMMAND_SECONDS = 5;
/**
 * Longest one command may take while an update delivers files. That is a
 * step of an `up` with minutes of budget, and failing it restores the old
 * files and fails the `up`: on a busy host an emulated guest's agent can take
 * more than 5 s to answer (a CI run under load failed an in-place delivery;
 * its error was not recorded). A read keeps 5 s: a silent agent must not hold
 * a refresh.
 */
const DELIVERY_COMMAND_SECONDS = 20;

/** One agent command's timeout: at most `capSeconds`, never past the deadline. */
const commandSeconds = (deadline: Deadline, capSeconds = AGENT_COMMAND_SECONDS) =>
  Math.max(1, Math.min(capSeconds, Math.floor(deadline.remainingMs() / 1000)));

/** The text of `path` in the guest, through its agent. */
export async function readGuestFile(
  host: LibvirtHost,
  dom: DomainHandle,
  path: string,
  deadline: Deadline,
): Promise<string> {
  return (await readGuestFileBytes(host, dom, path, deadline)).toString("latin1");
}

async function readGuestFileBytes(
  host: LibvirtHost,
  dom: DomainHandle,
  path: string,
  deadline: Deadline,
  capSeconds = AGENT_COMMAND_SECONDS,
): Promise<Buffer> {
  const seconds = () => commandSeconds(deadline, capSeconds);
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
  return Buffer.concat(chunks);
}

/** Replaces `path` in the guest with `content`. */
async function writeGuestFile(
  host: LibvirtHost,
  dom: DomainHandle,
  path: string,
  content: Buffer,
  deadline: Deadline,
  capSeconds: number,
): Promise<void> {
  const seconds = () => commandSeconds(deadline, capSeconds);
  const handle = await host.agentCommand(dom, "guest-file-open", { path, mode: "w" }, seconds());
  try {
    for (let at = 0; at < content.length; at += READ_CHUNK_BYTES) {
      const chunk = content.subarray(at, at + READ_CHUNK_BYTES);
      await host.agentCommand(
        dom,
        "guest-file-write",
        { handle, "buf-b64": chunk.toString("base64") },
        seconds(),
      );
    }
  } finally {
    await host.agentCommand(dom, "guest-file-close", { handle }, seconds()).catch(() => undefined);
  }
}

/** Runs argv in the guest (the agent searches PATH) and waits for it to exit, within the deadline. */
async function runInGuest(
  host: LibvirtHost,
  dom: DomainHandle,
  argv: readonly string[],
  deadline: Deadline,
  capSeconds: number,
): Promise<{ exitCode: number; output: string }> {
  const started = (await host.agentCommand(
    dom,
    "guest-exec",
    { path: argv[0], arg: argv.slice(1), "capture-output": true },
    commandSeconds(deadline, capSeconds),
  )) as { pid?: unknown };
  return untilExited(
    async () =>
      (await host.agentCommand(
        dom,
        "guest-exec-status",
        { pid: started.pid },
        commandSeconds(deadline, capSeconds),
      )) as GuestExecStatus,
    (data) => Buffer.from(data, "base64").toString("utf8"),
    `\`${argv.join(" ")}\` in the guest`,
    deadline,
  );
}

/** The guest of `dom` as common/guest-files.ts reaches it to deliver files (an update's step). */
export function guestChannelOf(
  host: LibvirtHost,
  dom: DomainHandle,
  deadline: Deadline,
): GuestChannel {
  return {
    read: (path) =>
      readGuestFileBytes(host, dom, path, deadline, DELIVERY_COMMAND_SECONDS).catch(
        (error: unknown) => {
          // The agent's own answer for a missing file; anything else is a real failure.
          if (/No such file|ENOENT|failed to open/i.test((error as Error).message))
            return undefined;
          throw error;
        },
      ),
    write: (path, content) =>
      writeGuestFile(host, dom, path, content, deadline, DELIVERY_COMMAND_SECONDS),
    run: (argv) => runInGuest(host, dom, argv, deadline, DELIVERY_COMMAND_SECONDS),
  };
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
