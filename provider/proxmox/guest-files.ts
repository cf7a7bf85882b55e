/**
 * A Proxmox VM's guest as common/guest-files.ts reaches it: qemu-server's
 * agent/file-read, agent/file-write and agent/exec + agent/exec-status
 * (API2/Qemu/Agent.pm). file-write needs VM.GuestAgent.FileWrite and exec
 * VM.GuestAgent.Unrestricted on PVE 9 (VM.Monitor on PVE 8): docs/proxmox.md.
 */
import type { Deadline } from "../common/deadline";
import { untilExited, type GuestChannel, type GuestExecStatus } from "../common/guest-files";
import type { ProxmoxClient } from "./client";
import { agentFileRead, vmPath, type VmRef } from "./vm";

/** Each agent call's deadline: a guest that slow is not answering. */
const AGENT_CALL_MS = 10_000;
/** file-write's `content` is at most 60 KiB (API2/Qemu/Agent.pm); sent as base64, the file is at most 45. */
const MAX_WRITE_BYTES = 45 * 1024;

async function writeFile(
  client: ProxmoxClient,
  ref: VmRef,
  file: string,
  content: Buffer,
  deadline: Deadline,
): Promise<void> {
  if (content.length > MAX_WRITE_BYTES)
    throw new Error(
      `${file} is ${content.length} bytes; Proxmox's agent/file-write takes at most ${MAX_WRITE_BYTES}`,
    );
  // Encoded here (encode=0): the bytes arrive exactly, whatever their characters.
  await client.post(
    `${vmPath(ref)}/agent/file-write`,
    { file, content: content.toString("base64"), encode: false },
    { timeoutMs: deadline.capped(AGENT_CALL_MS) },
  );
}

async function run(
  client: ProxmoxClient,
  ref: VmRef,
  argv: readonly string[],
  deadline: Deadline,
): Promise<{ exitCode: number; output: string }> {
  const started = await client.post<{ pid?: unknown }>(
    `${vmPath(ref)}/agent/exec`,
    { command: argv },
    { timeoutMs: deadline.capped(AGENT_CALL_MS) },
  );
  return untilExited(
    () =>
      client.get<GuestExecStatus>(
        `${vmPath(ref)}/agent/exec-status`,
        { pid: Number(started?.pid) },
        { timeoutMs: deadline.capped(AGENT_CALL_MS) },
      ),
    // PVE decodes the agent's base64 itself.
    (data) => data,
    `\`${argv.join(" ")}\` in VM ${ref.vmid}`,
    deadline,
  );
}

export function guestChannelOfVm(
  client: ProxmoxClient,
  ref: VmRef,
  deadline: Deadline,
): GuestChannel {
  return {
    read: (file) =>
      agentFileRead(client, ref, file, deadline.capped(AGENT_CALL_MS)).then(
        // PVE decodes the agent's base64 into bytes, which its JSON carries one character each.
        (content) => Buffer.from(content, "latin1"),
        (error: unknown) => {
          if (/No such file or directory/i.test((error as Error).message)) return undefined;
          throw error;
        },
      ),
    write: (file, content) => writeFile(client, ref, file, content, deadline),
    run: (argv) => run(client, ref, argv, deadline),
  };
}
