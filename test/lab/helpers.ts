/** Shared pieces of the lab tests: data sources with known digests, domain XML, cleanup. */
import { createHash, randomBytes } from "node:crypto";
import { Readable, Writable } from "node:stream";
import {
  ErrorCode,
  LibvirtError,
  Procedures,
  UndefineFlags,
  type LibvirtConnection,
  type StoragePoolHandle,
  type StorageVolHandle,
} from "../../provider/libvirt-rpc-xdr";

export const MIB = 1024 * 1024;
export const MARK_URI = "https://egress-proxies.invalid/test-mark/v1";

/** Random bytes produced chunk by chunk (never held whole); `digest()` is known once it ended. */
export function randomSource(
  totalBytes: number,
  options: { failAfter?: number; chunk?: number } = {},
) {
  const hash = createHash("sha256");
  const chunk = options.chunk ?? MIB;
  let produced = 0;
  const stream = new Readable({
    highWaterMark: chunk,
    read() {
      if (options.failAfter !== undefined && produced >= options.failAfter) {
        this.destroy(new Error(`test source failed on purpose after ${produced} bytes`));
        return;
      }
      if (produced >= totalBytes) {
        this.push(null);
        return;
      }
      const bytes = randomBytes(Math.min(chunk, totalBytes - produced));
      produced += bytes.length;
      hash.update(bytes);
      this.push(bytes);
    },
  });
  return { stream, digest: () => hash.digest("hex"), produced: () => produced };
}

/** A source that produces `bytes` and then never ends nor fails (a stalled download). */
export function stallingSource(bytes: number): Readable {
  let sent = false;
  return new Readable({
    read() {
      if (!sent) {
        sent = true;
        this.push(Buffer.alloc(bytes, 7));
      }
    },
  });
}

export function hashingSink(): { sink: Writable; digest: () => string; bytes: () => number } {
  const hash = createHash("sha256");
  let count = 0;
  const sink = new Writable({
    highWaterMark: 4 * MIB,
    write(chunk: Buffer, _encoding, callback) {
      hash.update(chunk);
      count += chunk.length;
      callback();
    },
  });
  return { sink, digest: () => hash.digest("hex"), bytes: () => count };
}

export function uniqueName(prefix: string): string {
  return `egress-rpc-test-${prefix}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;
}

/** A domain TCG can start without any disk: it just sits in the firmware. */
export function domainXml(name: string, owner = "lab-test"): string {
  return `<domain type='qemu'>
  <name>${name}</name>
  <memory unit='MiB'>32</memory>
  <vcpu>1</vcpu>
  <metadata>
    <egress:mark xmlns:egress='${MARK_URI}'><egress:owner>${owner}</egress:owner></egress:mark>
  </metadata>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices>
</domain>`;
}

export function volumeXml(name: string, capacityBytes: number): string {
  return `<volume><name>${name}</name><capacity unit='bytes'>${capacityBytes}</capacity><target><format type='raw'/></target></volume>`;
}

export async function deleteVolumeIfPresent(
  conn: LibvirtConnection,
  pool: StoragePoolHandle,
  name: string,
): Promise<void> {
  let vol: StorageVolHandle;
  try {
    vol = await conn.call(Procedures.storageVolLookupByName, { pool, name }, { timeoutMs: 10_000 });
  } catch (error) {
    if (error instanceof LibvirtError && error.code === ErrorCode.NO_STORAGE_VOL) return;
    throw error;
  }
  await conn.call(Procedures.storageVolDelete, { vol, flags: 0 }, { timeoutMs: 10_000 });
}

export async function removeDomainIfPresent(conn: LibvirtConnection, name: string): Promise<void> {
  try {
    const dom = await conn.call(Procedures.domainLookupByName, { name }, { timeoutMs: 10_000 });
    await conn
      .call(Procedures.domainDestroyFlags, { dom, flags: 0 }, { timeoutMs: 20_000 })
      .catch(() => undefined);
    await conn.call(
      Procedures.domainUndefineFlags,
      {
        dom,
        flags: UndefineFlags.NVRAM | UndefineFlags.MANAGED_SAVE | UndefineFlags.SNAPSHOTS_METADATA,
      },
      { timeoutMs: 10_000 },
    );
  } catch (error) {
    if (error instanceof LibvirtError && error.code === ErrorCode.NO_DOMAIN) return;
    throw error;
  }
}

export { rejectionOf } from "../support/rejection";
