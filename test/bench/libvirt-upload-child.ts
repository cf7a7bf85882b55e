/**
 * One upload in a process of its own, so its peak RSS is the upload's and not
 * the benchmark runner's:
 * `node libvirt-upload-child.js <env.json> <file> <volume> [times]`
 * uploads `file` `times` times in a row (default once) as one stream.
 * Prints one JSON line: {"ms": connect + upload time, "cpuMs": this process's
 * CPU over the same span, "maxRssMb": peak RSS, "loadedRssMb": RSS with the
 * modules loaded and nothing done yet, "ssh": the negotiated cipher
 * and MAC and whether ssh2's native binding loaded, "sealing": who encrypted
 * the channel's data packets} once the upload is done, then waits for a line
 * on stdin (or its end) before it closes the connection: meanwhile the bench
 * reads what the lab's sshd process serving this connection spent, which it
 * can no longer once the connection is gone (upload-host-cpu.ts).
 */
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { Procedures, fileUploadSource, type ReadIntoSource } from "../../provider/libvirt-rpc-xdr";
import {
  openLibvirtOverSsh,
  type ChannelDataWriter,
  type SshLinkAlgorithms,
} from "../../provider/ssh";
import { labSshTarget } from "../lab/ssh-helpers";
import type { LabEnv } from "../lab/lab";

/**
 * The file's bytes `times` times over, read through fileUploadSource (straight
 * into the upload's frames), the way a caller uploading a file does.
 */
async function repeatedFile(file: string, times: number): Promise<ReadIntoSource> {
  let round = 0;
  let current = await fileUploadSource(file);
  return {
    async readInto(targets) {
      for (;;) {
        const bytes = await current.readInto(targets);
        if (bytes > 0 || ++round >= times) return bytes;
        current.close?.();
        current = await fileUploadSource(file);
      }
    },
    close: () => current.close?.(),
  };
}

/**
 * This process's own peak RSS. Not resourceUsage().maxRSS: Linux carries the
 * parent's high-water mark into a child across fork and exec (the signal's
 * maxrss), so a bench parent holding 125 MB made every child "peak" at 125 MB
 * whatever the upload used. VmHWM belongs to the address space exec made.
 */
function ownPeakRssMb(): number {
  try {
    const match = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync("/proc/self/status", "utf8"));
    if (match) return Number(match[1]) / 1024;
  } catch {
    // not Linux: the rusage figure, which may include the parent's
  }
  // resourceUsage().maxRSS is in KiB.
  return process.resourceUsage().maxRSS / 1024;
}

async function main(): Promise<void> {
  const [envFile, file, volumeName, timesArg] = process.argv.slice(2);
  if (!envFile || !file || !volumeName)
    throw new Error("usage: libvirt-upload-child <env.json> <file> <volume> [times]");
  const times = Number(timesArg ?? "1");
  const lab = JSON.parse(readFileSync(envFile, "utf8")) as LabEnv;
  let ssh: SshLinkAlgorithms | undefined;
  let sealing = null as ChannelDataWriter | null;
  // What the process holds before it does anything: Node plus this package and ssh2 loaded.
  const loadedRssMb = process.memoryUsage().rss / (1024 * 1024);
  const started = performance.now();
  const cpuBefore = process.cpuUsage();
  const conn = await openLibvirtOverSsh(labSshTarget(lab), {
    handshakeTimeoutMs: 10_000,
    onHandshake: (algorithms) => (ssh = algorithms),
    onChannelData: (writer) => (sealing = writer),
  });
  const pool = await conn.call(Procedures.storagePoolLookupByName, { name: lab.pool });
  const vol = await conn.call(Procedures.storageVolLookupByName, { pool, name: volumeName });
  await conn.upload({ vol }, await repeatedFile(file, times), { timeoutMs: 600_000 });
  const ms = performance.now() - started;
  const cpu = process.cpuUsage(cpuBefore);
  console.log(
    JSON.stringify({
      ms,
      cpuMs: (cpu.user + cpu.system) / 1000,
      maxRssMb: ownPeakRssMb(),
      loadedRssMb,
      ssh: ssh && { cipher: ssh.cipher, mac: ssh.mac, nativeBinding: ssh.nativeBinding },
      // Who sealed the channel's data packets: "ours" (channel-data.ts) or "ssh2" (all of them).
      sealing: sealing && sealing.counts.sealed > 0 ? "ours" : "ssh2",
    }),
  );
  await goAhead();
  await conn.close();
}

/** Resolves at the first line on stdin, or at its end (the bench went away). */
function goAhead(): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      process.stdin.destroy();
      resolve();
    };
    process.stdin.on("data", (chunk: Buffer) => {
      if (chunk.includes(0x0a)) done();
    });
    process.stdin.once("end", done);
    process.stdin.once("error", done);
  });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
