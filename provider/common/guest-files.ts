/**
 * Guest files delivered in place: what a VM's software reads (squid.conf,
 * its password file, the prefix dialer), written into the running guest
 * through its agent and followed by commands (a reload), instead of a new
 * VM with a new exit address for every change of a document (issue: an
 * upgrade must not replace the fleet at once; docs/day2.md, "Upgrades in
 * place").
 *
 * The input `guestFiles` says which files and commands; the caller's
 * user-data still writes the same files at first boot (cloud-init runs once
 * per VM). Its `userDataIdentity` names what in the user-data is not these
 * files (packages, the user's own cloud-init): the user-data replaces the VM
 * only when that identity changes, and a user-data that differs only in the
 * files is an update that delivers them. Without an identity, user-data
 * replaces as always.
 *
 * The delivery is all or nothing: each file's previous text is read first;
 * when a write, a command, the read-back or the listening check fails, the
 * previous files are put back and the commands run again, and the update
 * fails saying what failed. Pure of I/O: a backend gives the channel
 * (libvirt's agent passthrough, Proxmox's agent/* calls).
 */
import { z } from "zod";
import { sleepWithin, type Deadline } from "./deadline";
import type { ChangeTable } from "./diff";
import { sameValue, valueAt } from "./diff";
import { PermanentError } from "./errors";
import { GUEST_SOCKET_TABLES, guestViewOf } from "./guest-view";

const MAX_FILE_BYTES = 256 * 1024;

export const guestFilesSchema = z
  .object(
    {
      files: z
        .array(
          z.object({
            path: z.string().regex(/^\/[^\0\n]*[^/]$/, {
              error:
                "guestFiles.files[].path must be an absolute file path, e.g. /etc/squid/squid.conf",
            }),
            content: z
              .string({ error: "guestFiles.files[].content must be text" })
              .refine((text) => Buffer.byteLength(text) <= MAX_FILE_BYTES, {
                error: `guestFiles.files[].content must be at most ${MAX_FILE_BYTES / 1024} KiB`,
              }),
            permissions: z
              .string()
              .regex(/^0?[0-7]{3}$/, {
                error: 'guestFiles.files[].permissions must be an octal mode, e.g. "0644"',
              })
              .default("0644"),
          }),
        )
        .min(1, { error: "guestFiles.files must list at least one file" })
        .max(32, { error: "guestFiles.files must list at most 32 files" }),
      /** Run in order after the files are written, each an argv (no shell unless you name one). */
      commands: z
        .array(
          z.array(z.string()).min(1, { error: "guestFiles.commands[] must be a non-empty argv" }),
        )
        .max(16, { error: "guestFiles.commands must list at most 16 commands" })
        .default([]),
      /** After the commands, this port must be listened on in the guest (the proxy's). */
      listensOn: z.number().int().min(1).max(65_535).optional(),
      /** What in the user-data is not these files; see the module's comment. */
      userDataIdentity: z.string().min(1).max(200).optional(),
    },
    { error: "guestFiles must be { files, commands?, listensOn?, userDataIdentity? }" },
  )
  .optional();

export type GuestFiles = NonNullable<z.output<typeof guestFilesSchema>>;

type Props = Record<string, unknown>;

/**
 * The change table with the guest-files rule applied: with an identity in
 * the new inputs, user-data is an update while the identity stays (except
 * when the old state has none: a VM made before guestFiles existed gets its
 * files in place, which is the upgrade this is for). A new identity
 * replaces, and then every part of the document does: a replacement the
 * disruption budget defers must leave the whole document as it was, not
 * deliver half of it.
 */
export function changeTableWithGuestFiles(
  table: ChangeTable,
  olds: Props,
  news: Props,
): ChangeTable {
  const identity = valueAt(news, "guestFiles.userDataIdentity");
  if (identity === undefined) return table;
  const before = valueAt(olds, "guestFiles.userDataIdentity");
  const kind = before !== undefined && !sameValue(before, identity) ? "replace" : "update";
  return {
    ...table,
    userData: kind,
    userDataBase64: kind,
    "guestFiles.files": kind,
    "guestFiles.commands": kind,
    "guestFiles.listensOn": kind,
    "guestFiles.userDataIdentity": kind,
  };
}

/**
 * The files to deliver in this update, or undefined. A VM made without
 * guestFiles whose user-data did not change already has them (cloud-init
 * wrote the same text): nothing to deliver, state just learns them.
 */
export function guestFilesToDeliver(
  olds: Props,
  news: { guestFiles?: GuestFiles } & Props,
): GuestFiles | undefined {
  const wanted = news.guestFiles;
  if (wanted === undefined) return undefined;
  const before = olds.guestFiles as GuestFiles | undefined;
  if (before === undefined)
    return sameValue(olds.userData, news.userData) &&
      sameValue(olds.userDataBase64, news.userDataBase64)
      ? undefined
      : wanted;
  return sameValue(before.files, wanted.files) && sameValue(before.commands, wanted.commands)
    ? undefined
    : wanted;
}

/**
 * What state keeps of a VM whose new files could not be delivered because
 * it is not running: the document it has, so the next update delivers them.
 */
export function documentKept(olds: Props): Props {
  return {
    guestFiles: olds.guestFiles,
    userData: olds.userData,
    userDataBase64: olds.userDataBase64,
  };
}

/** How a backend reaches into a running guest. Each call keeps its own deadline. */
export interface GuestChannel {
  /** The file's bytes; undefined when it does not exist. */
  read(path: string): Promise<Buffer | undefined>;
  write(path: string, content: Buffer): Promise<void>;
  run(argv: readonly string[]): Promise<{ exitCode: number; output: string }>;
}

export class GuestDeliveryError extends PermanentError {}

/** guest-exec-status's answer: the agent's (data in base64) or PVE's agent/exec-status (decoded; `exited` 1/0). */
export interface GuestExecStatus {
  exited?: unknown;
  exitcode?: unknown;
  "out-data"?: unknown;
  "err-data"?: unknown;
}

/** How often a running command's status is asked. */
const EXEC_POLL_MS = 250;

/** Asks a started command's status until it has exited, within the deadline; its code and what it said. */
export async function untilExited(
  ask: () => Promise<GuestExecStatus | undefined>,
  decode: (data: string) => string,
  what: string,
  deadline: Deadline,
): Promise<{ exitCode: number; output: string }> {
  for (;;) {
    const status = await ask();
    if (status?.exited === true || status?.exited === 1) {
      const text = (data: unknown) => (typeof data === "string" ? decode(data) : "");
      return {
        exitCode: typeof status.exitcode === "number" ? status.exitcode : -1,
        output: text(status["err-data"]) || text(status["out-data"]),
      };
    }
    deadline.check(what);
    await sleepWithin(EXEC_POLL_MS, deadline);
  }
}

/** A command's output in an error: short, one line. */
const brief = (text: string) => text.replace(/\s+/g, " ").trim().slice(0, 300);

async function runAll(
  channel: GuestChannel,
  commands: readonly (readonly string[])[],
): Promise<void> {
  for (const argv of commands) {
    const { exitCode, output } = await channel.run(argv);
    if (exitCode !== 0)
      throw new Error(
        `\`${argv.join(" ")}\` exited ${exitCode}${output ? `: ${brief(output)}` : ""}`,
      );
  }
}

async function writeAll(
  channel: GuestChannel,
  files: readonly { path: string; content: Buffer; permissions?: string }[],
) {
  for (const file of files) {
    await channel.write(file.path, file.content);
    if (file.permissions !== undefined)
      await runAll(channel, [["chmod", file.permissions, file.path]]);
  }
}

/** Waits for the port to be listened on (a reload takes a moment), at most `waitMs`. */
async function untilListening(
  channel: GuestChannel,
  port: number,
  waitMs: number,
): Promise<boolean> {
  const end = Date.now() + waitMs;
  for (;;) {
    const tables = await Promise.all(
      GUEST_SOCKET_TABLES.map(async (table) => (await channel.read(table))?.toString("latin1")),
    );
    if (guestViewOf(tables, port) === "listening") return true;
    if (Date.now() >= end) return false;
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

/**
 * Writes the files, runs the commands, reads the files back and checks the
 * port; on any failure puts the previous files back and fails. `label`
 * names the VM in the error; file contents never appear in it.
 */
export async function deliverGuestFiles(
  channel: GuestChannel,
  guestFiles: GuestFiles,
  label: string,
  listenWaitMs = 20_000,
): Promise<void> {
  const previous = [];
  for (const file of guestFiles.files)
    previous.push({ path: file.path, content: await channel.read(file.path) });
  const wanted = guestFiles.files.map((file) => ({
    path: file.path,
    content: Buffer.from(file.content, "utf8"),
    permissions: file.permissions,
  }));
  try {
    await writeAll(channel, wanted);
    await runAll(channel, guestFiles.commands);
    for (const file of wanted) {
      const back = await channel.read(file.path);
      if (back === undefined || !back.equals(file.content))
        throw new Error(`${file.path} does not read back as written`);
    }
    if (
      guestFiles.listensOn !== undefined &&
      !(await untilListening(channel, guestFiles.listensOn, listenWaitMs))
    )
      throw new Error(`nothing listens on port ${guestFiles.listensOn} after the commands`);
  } catch (error) {
    const restored = await restore(channel, previous, guestFiles.commands);
    throw new GuestDeliveryError(
      `${label}: delivering guest files in place failed (${(error as Error).message}); ${restored} ` +
        "Fix the cause and run `pulumi up` again, or replace the VM (a rotate entry).",
      { cause: error },
    );
  }
}

async function restore(
  channel: GuestChannel,
  previous: readonly { path: string; content: Buffer | undefined }[],
  commands: readonly (readonly string[])[],
): Promise<string> {
  try {
    for (const file of previous)
      if (file.content === undefined) await runAll(channel, [["rm", "-f", file.path]]);
      else await channel.write(file.path, file.content);
    await runAll(channel, commands);
    return "the previous files are back in place.";
  } catch (error) {
    return `putting the previous files back failed too (${(error as Error).message}).`;
  }
}
