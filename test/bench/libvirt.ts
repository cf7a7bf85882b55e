/**
 * libvirt client benchmarks against the lab, each beside the standard tool in
 * the same run:
 * - upload of a 512 MiB file into the pool through our client over the lab's
 *   sshd, beside `virsh vol-upload` over qemu+ssh:// to the same sshd, beside
 *   `ssh … 'cat > /dev/null'` over the same link (the practical ceiling);
 *   plus the peak RSS of the process doing our upload (connect + upload
 *   timed inside it, so node's own start-up is not counted against virsh),
 *   its CPU per MiB, the RSS that process starts from (modules loaded,
 *   nothing done), and the peak RSS of a 2 GiB upload (the same file four
 *   times as one stream), which must not grow with the image; the file is
 *   read through fileUploadSource (straight into the upload's frames); the
 *   lines `bench ssh_cipher=…`, `ssh_mac=…`, `ssh_native_binding=…`,
 *   `ssh_channel_sealing=…` say what our link negotiated and who sealed it;
 *   and what the host side (the lab's sshd and libvirtd) spent on our upload,
 *   from /proc (upload-host-cpu.ts), with our wall time against it: the goal
 *   (goals.ts) is stated against the host's own cost, the ratios to virsh and
 *   ssh cat are printed for information;
 * - reading the metadata element of 500 domains through our client
 *   (one list call, then the reads pipelined) beside one virsh process
 *   running the same 500 `metadata` commands; connecting is timed in both.
 * Ratios are time(ours) / time(theirs) for uploads (lower is better) and
 * time(virsh) / time(ours) for the sweep (higher is better).
 */
import { execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createReadStream, createWriteStream, mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  ErrorCode,
  LibvirtError,
  MetadataType,
  Procedures,
  type LibvirtConnection,
  type StoragePoolHandle,
} from "../../provider/libvirt-rpc-xdr";
import { openLibvirtOverSsh } from "../../provider/ssh";
import { labSshTarget } from "../lab/ssh-helpers";
import { stopWhatThisProcessStarted, useLab, type LabEnv } from "../lab/lab";
import { median, printBench, printBenchFact, timeMsAsync } from "./measure";
import { closeHostCpuWindow, openHostCpuWindow, type HostCpu } from "./upload-host-cpu";

const run = promisify(execFile);
const MIB = 1024 * 1024;
const UPLOAD_BYTES = 512 * MIB;
const UPLOAD_ROUNDS = 3;
const UPLOAD_2GIB_TIMES = 4;
const SWEEP_DOMAINS = 500;
const SWEEP_ROUNDS = 5;
const MARK_URI = "https://egress-proxies.invalid/bench-mark/v1";

function openOurs(lab: LabEnv): Promise<LibvirtConnection> {
  return openLibvirtOverSsh(labSshTarget(lab), { handshakeTimeoutMs: 10_000 });
}

function virshSshUri(lab: LabEnv): string {
  // virsh runs the ssh binary; it verifies the host against the lab's known_hosts through -o options
  // it does not expose, so host-key checking is left to the libvirt default for this local benchmark.
  return `qemu+ssh://${lab.sshUser}@${lab.sshHost}:${lab.sshPort}/system?keyfile=${lab.clientKey}&no_verify=1`;
}

async function writeRandomFile(path: string, bytes: number): Promise<void> {
  const out = createWriteStream(path);
  for (let written = 0; written < bytes; written += 4 * MIB) {
    if (!out.write(randomBytes(Math.min(4 * MIB, bytes - written)))) {
      await new Promise<void>((resolve) => out.once("drain", () => resolve()));
    }
  }
  await new Promise<void>((resolve, reject) => {
    out.once("error", reject);
    out.end(() => resolve());
  });
}

async function recreateVolume(
  conn: LibvirtConnection,
  pool: StoragePoolHandle,
  name: string,
  bytes: number,
) {
  try {
    const old = await conn.call(Procedures.storageVolLookupByName, { pool, name });
    await conn.call(Procedures.storageVolDelete, { vol: old, flags: 0 });
  } catch (error) {
    if (!(error instanceof LibvirtError && error.code === ErrorCode.NO_STORAGE_VOL)) throw error;
  }
  const xml = `<volume><name>${name}</name><capacity unit='bytes'>${bytes}</capacity><target><format type='raw'/></target></volume>`;
  return conn.call(Procedures.storageVolCreateXml, { pool, xml, flags: 0 });
}

/** Runs a command with stdin from a file; resolves when it exits 0. */
function runWithStdin(command: string, args: string[], stdinFile: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ["pipe", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    createReadStream(stdinFile).pipe(child.stdin);
    child.on("error", reject);
    child.on("exit", (code) =>
      code === 0 ? resolve() : reject(new Error(`${command} exited ${code}: ${stderr}`)),
    );
  });
}

interface UploadChildReport {
  ms: number;
  cpuMs: number;
  maxRssMb: number;
  loadedRssMb?: number;
  ssh?: { cipher: string; mac: string; nativeBinding: boolean | null };
  sealing?: string;
}

/**
 * Our upload, in a process of its own so its peak RSS is the upload's alone.
 * The process reports once the upload is done and keeps its connection open
 * until `whileOpen` has run (libvirt-upload-child.ts), then closes it and exits.
 */
function uploadInChild(
  lab: LabEnv,
  file: string,
  volumeName: string,
  times = 1,
  whileOpen: (report: UploadChildReport) => void = () => {},
): Promise<UploadChildReport> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [
        join(__dirname, "libvirt-upload-child.js"),
        join(lab.labDir, "env.json"),
        file,
        volumeName,
        String(times),
      ],
      { stdio: ["pipe", "pipe", "pipe"] },
    );
    let stdout = "";
    let stderr = "";
    let report: UploadChildReport | undefined;
    let answered = false;
    let failure: unknown;
    const timer = setTimeout(() => {
      failure ??= new Error("the upload process took more than 600 s");
      child.kill("SIGKILL");
    }, 600_000);
    child.stderr.on("data", (data: Buffer) => (stderr += data.toString()));
    // A child that died before reading our line: its exit status says so (below), not an EPIPE here.
    child.stdin.on("error", () => {});
    child.stdout.on("data", (data: Buffer) => {
      stdout += data.toString();
      // The report is the first whole line that is a JSON object.
      const line = /^\{.*\n/m.exec(stdout)?.[0];
      if (answered || line === undefined) return;
      answered = true;
      try {
        report = JSON.parse(line) as UploadChildReport;
        whileOpen(report);
      } catch (error) {
        failure ??= error;
      }
      child.stdin.end("close\n");
    });
    child.on("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      if (failure !== undefined) reject(failure);
      else if (code !== 0 || report === undefined)
        reject(new Error(`the upload process exited ${code ?? signal}: ${stderr}${stdout}`));
      else resolve(report);
    });
  });
}

/** What our upload link negotiated, as facts of the run (printed and kept in bench-results.json). */
function recordSshLink(report: UploadChildReport): void {
  const ssh = report.ssh;
  const binding = !ssh || ssh.nativeBinding === null ? "unknown" : ssh.nativeBinding ? "yes" : "no";
  printBenchFact("ssh_cipher", ssh?.cipher ?? "unknown");
  printBenchFact("ssh_mac", ssh?.mac ?? "unknown");
  printBenchFact("ssh_native_binding", binding);
  printBenchFact("ssh_channel_sealing", report.sealing ?? "unknown");
}

async function benchUpload(lab: LabEnv, file: string): Promise<void> {
  const conn = await openOurs(lab);
  const pool = await conn.call(Procedures.storagePoolLookupByName, { name: lab.pool });
  const volumeName = "egress-bench-upload";
  const ours: number[] = [];
  const oursCpuMsPerMib: number[] = [];
  const hostCpu: HostCpu[] = [];
  const oursVsHostCpu: number[] = [];
  const virsh: number[] = [];
  const ssh: number[] = [];
  let peakRssMb = 0;
  let loadedRssMb = 0;
  let peakRss2GibMb = 0;
  try {
    for (let round = 0; round < UPLOAD_ROUNDS; round++) {
      await recreateVolume(conn, pool, volumeName, UPLOAD_BYTES);
      // The host side's CPU from just before the dial to the end of the upload, read while the
      // connection's sshd process still lives (upload-host-cpu.ts says why then and what is counted).
      const window = openHostCpuWindow(lab);
      let host: HostCpu | undefined;
      const child = await uploadInChild(lab, file, volumeName, 1, () => {
        host = closeHostCpuWindow(window);
      });
      if (round === 0) recordSshLink(child);
      ours.push(child.ms);
      oursCpuMsPerMib.push(child.cpuMs / (UPLOAD_BYTES / MIB));
      hostCpu.push(host!);
      oursVsHostCpu.push(child.ms / (host!.sshdMs + host!.libvirtdMs));
      peakRssMb = Math.max(peakRssMb, child.maxRssMb);
      loadedRssMb = Math.max(loadedRssMb, child.loadedRssMb ?? 0);

      await recreateVolume(conn, pool, volumeName, UPLOAD_BYTES);
      virsh.push(
        await timeMsAsync(() =>
          run(
            "virsh",
            ["-q", "-c", virshSshUri(lab), "vol-upload", "--pool", lab.pool, volumeName, file],
            {
              timeout: 300_000,
            },
          ),
        ),
      );

      ssh.push(
        await timeMsAsync(() =>
          runWithStdin(
            "ssh",
            [
              "-p",
              String(lab.sshPort),
              "-i",
              lab.clientKey,
              "-o",
              `UserKnownHostsFile=${lab.knownHosts}`,
              "-o",
              "StrictHostKeyChecking=yes",
              "-o",
              "BatchMode=yes",
              `${lab.sshUser}@${lab.sshHost}`,
              "cat > /dev/null",
            ],
            file,
          ),
        ),
      );
    }
    // The same file four times over as one 2 GiB stream: the peak must not grow with the image.
    await recreateVolume(conn, pool, volumeName, UPLOAD_2GIB_TIMES * UPLOAD_BYTES);
    peakRss2GibMb = (await uploadInChild(lab, file, volumeName, UPLOAD_2GIB_TIMES)).maxRssMb;
    const vol = await conn.call(Procedures.storageVolLookupByName, { pool, name: volumeName });
    await conn.call(Procedures.storageVolDelete, { vol, flags: 0 });
  } finally {
    await conn.close();
  }
  const [oursMs, virshMs, sshMs] = [median(ours), median(virsh), median(ssh)];
  printBench("upload_512mib_ours_ms", oursMs);
  printBench("upload_512mib_virsh_ms", virshMs);
  printBench("upload_512mib_ssh_cat_ms", sshMs);
  // What the host must spend on our upload whoever sends it (sshd + libvirtd), and our wall time
  // against it, round by round (the same upload on both sides), the median of the rounds: no
  // client can take less time than the host's own CPU when the host has one core for it.
  printBench("upload_host_cpu_ms", median(hostCpu.map((host) => host.sshdMs + host.libvirtdMs)));
  printBench("upload_host_sshd_cpu_ms", median(hostCpu.map((host) => host.sshdMs)));
  printBench("upload_host_libvirtd_cpu_ms", median(hostCpu.map((host) => host.libvirtdMs)));
  printBench("upload_ratio_vs_host_cpu", median(oursVsHostCpu));
  // Information (no goal): they compare the hosts' paths as much as the clients (docs/libvirt-rpc.md).
  printBench("upload_time_ratio_vs_virsh", oursMs / virshMs);
  printBench("upload_time_ratio_vs_ssh", oursMs / sshMs);
  // Our client's own cost, which bounds the upload on a host with cores to spare.
  printBench("upload_ours_cpu_ms_per_mib", median(oursCpuMsPerMib));
  printBench("upload_peak_rss_mb", peakRssMb);
  // The part of the peak that is not the upload's: Node, this package and ssh2 loaded, nothing done.
  printBench("upload_process_loaded_rss_mb", loadedRssMb);
  printBench("upload_2gib_peak_rss_mb", peakRss2GibMb);
  printBench("upload_2gib_vs_512mib_peak_rss_ratio", peakRss2GibMb / peakRssMb);
}

function domainXml(name: string, index: number): string {
  return `<domain type='qemu'><name>${name}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>
<metadata><b:mark xmlns:b='${MARK_URI}'><b:owner>bench-${index}</b:owner></b:mark></metadata>
<os><type arch='x86_64' machine='pc'>hvm</type></os><devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices></domain>`;
}

async function benchMetadataSweep(lab: LabEnv): Promise<void> {
  const names = Array.from({ length: SWEEP_DOMAINS }, (_, i) => `egress-bench-sweep-${i}`);
  const setup = await openOurs(lab);
  try {
    await Promise.all(
      names.map((name, i) => setup.call(Procedures.domainDefineXml, { xml: domainXml(name, i) })),
    );

    // Ours: connect, list the domains once (as the reaper does), then read every element,
    // all pipelined on one link. virsh has no such shortcut: each `metadata` looks its domain up.
    // Each side runs SWEEP_ROUNDS times, alternating, and the medians are compared: one sweep of
    // ours lasts about as long as one SSH login, so a single sample is mostly noise (five, not
    // three: on a machine shared with other work one slow login in three moved the median).
    const wanted = new Set(names);
    const sweepOurs = async (): Promise<number> => {
      let read = 0;
      const ms = await timeMsAsync(async () => {
        const conn = await openOurs(lab);
        try {
          const { domains } = await conn.call(Procedures.connectListAllDomains, {
            needResults: 1,
            flags: 0,
          });
          const marks = await Promise.all(
            domains
              .filter((dom) => wanted.has(dom.name))
              .map((dom) =>
                conn.call(Procedures.domainGetMetadata, {
                  dom,
                  type: MetadataType.ELEMENT,
                  uri: MARK_URI,
                  flags: 0,
                }),
              ),
          );
          read = marks.filter((mark) => mark.includes("bench-")).length;
        } finally {
          await conn.close();
        }
      });
      if (read !== SWEEP_DOMAINS) throw new Error(`read ${read} marks, expected ${SWEEP_DOMAINS}`);
      return ms;
    };

    // virsh: one process, one connection, the same 500 commands one after another.
    const commands = names.map((name) => `metadata ${name} ${MARK_URI}`).join(" ; ");
    const sweepVirsh = async (): Promise<number> => {
      let virshOutput = "";
      const ms = await timeMsAsync(async () => {
        const { stdout } = await run("virsh", ["-q", "-c", virshSshUri(lab), commands], {
          timeout: 300_000,
          maxBuffer: 64 * MIB,
        });
        virshOutput = stdout;
      });
      const virshRead = (virshOutput.match(/bench-\d+/g) ?? []).length;
      if (virshRead !== SWEEP_DOMAINS)
        throw new Error(`virsh read ${virshRead} marks, expected ${SWEEP_DOMAINS}`);
      return ms;
    };
    const ours: number[] = [];
    const virsh: number[] = [];
    for (let round = 0; round < SWEEP_ROUNDS; round++) {
      ours.push(await sweepOurs());
      virsh.push(await sweepVirsh());
    }
    const [oursMs, virshMs] = [median(ours), median(virsh)];

    printBench("metadata_sweep_500_ours_ms", oursMs);
    printBench("metadata_sweep_500_virsh_ms", virshMs);
    printBench("metadata_sweep_speedup_vs_virsh", virshMs / oursMs);
  } finally {
    await Promise.all(
      names.map(async (name) => {
        try {
          const dom = await setup.call(Procedures.domainLookupByName, { name });
          await setup.call(Procedures.domainUndefineFlags, { dom, flags: 0 });
        } catch (error) {
          if (!(error instanceof LibvirtError && error.code === ErrorCode.NO_DOMAIN)) throw error;
        }
      }),
    );
    await setup.close();
  }
}

export async function runLibvirtBenchmarks(): Promise<void> {
  const lab = await useLab();
  const dir = mkdtempSync(join(tmpdir(), "egress-bench-libvirt-"));
  const file = join(dir, "upload.bin");
  try {
    await writeRandomFile(file, UPLOAD_BYTES);
    if (statSync(file).size !== UPLOAD_BYTES) throw new Error(`${file} has the wrong size`);
    await benchUpload(lab, file);
    await benchMetadataSweep(lab);
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await stopWhatThisProcessStarted();
  }
}
