/**
 * Many KvmProxy members on the lab host without booting any (issue 32):
 * domains defined and not started, each with its overlay and seed volumes and
 * this stack's mark, plus the state a create would have recorded for them,
 * so the real provider's Read (in the dynamic-provider server, a child
 * process) can refresh hundreds at once. And a tap on the libvirt socket that
 * counts what the host was asked, by procedure, whoever asked it.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { createConnection, createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { OwnerIdentity, OwnershipMark } from "../../provider/common/mark";
import { buildDomainXml } from "../../provider/kvm/domain-xml";
import { macAddressFor, overlayVolumeName, seedVolumeName } from "../../provider/kvm/naming";
import {
  MessageType,
  Procedures,
  type LibvirtConnection,
  type StoragePoolHandle,
} from "../../provider/libvirt-rpc-xdr";
import type { LabEnv } from "./lab";

// ---- the tap ------------------------------------------------------------------------------------

export interface LibvirtTap {
  /** Give this as the resource's socketPath: sshd forwards to it, it forwards to libvirtd. */
  socketPath: string;
  /** CALL packets seen since the last reset, by procedure name. */
  calls(): Map<string, number>;
  /** Connections opened since the last reset: one per SSH link the provider dialled. */
  connections(): number;
  reset(): void;
  close(): Promise<void>;
}

const NAMES = new Map(
  Object.values(Procedures).map((procedure) => [
    `${procedure.program}/${procedure.number}`,
    procedure.name,
  ]),
);

/**
 * A relay between the provider's forwarded socket and libvirtd's that reads
 * the client's packet headers (length, then prog, vers, proc, type, serial,
 * status) and counts the calls: what the host saw, not what the provider
 * thinks it sent.
 */
export async function startLibvirtTap(libvirtSocket: string): Promise<LibvirtTap> {
  const dir = mkdtempSync(join(tmpdir(), "egress-kvm-tap-"));
  const socketPath = join(dir, "libvirt-sock");
  const counts = new Map<string, number>();
  let connections = 0;
  const sockets = new Set<Socket>();
  const count = (header: Buffer): void => {
    if (header.readUInt32BE(16) !== MessageType.CALL) return;
    const key = `${header.readUInt32BE(4)}/${header.readUInt32BE(12)}`;
    const name = NAMES.get(key) ?? `proc ${key}`;
    counts.set(name, (counts.get(name) ?? 0) + 1);
  };
  const server: Server = createServer((client) => {
    connections++;
    const daemon = createConnection(libvirtSocket);
    sockets.add(client).add(daemon);
    let pending = Buffer.alloc(0);
    client.on("data", (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 28) {
        const length = pending.readUInt32BE(0);
        if (pending.length < length) break;
        count(pending.subarray(0, 28));
        pending = pending.subarray(length);
      }
      daemon.write(chunk);
    });
    daemon.pipe(client);
    const end = () => {
      client.destroy();
      daemon.destroy();
      sockets.delete(client);
      sockets.delete(daemon);
    };
    client.on("close", end).on("error", end);
    daemon.on("close", end).on("error", end);
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(socketPath, resolve);
  });
  return {
    socketPath,
    calls: () => new Map(counts),
    connections: () => connections,
    reset: () => {
      counts.clear();
      connections = 0;
    },
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Calls of all procedures in `calls`. */
export const totalCalls = (calls: ReadonlyMap<string, number>): number =>
  [...calls.values()].reduce((sum, count) => sum + count, 0);

// ---- the fleet ----------------------------------------------------------------------------------

export interface FleetDomain {
  name: string;
  uuid: string;
  createdAt: string;
}

/** Calls in flight at once while defining: the daemon runs a client's calls side by side. */
const DEFINE_CONCURRENCY = 16;

async function inBatches<T, R>(items: readonly T[], work: (item: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const index = next++;
      results[index] = await work(items[index]!);
    }
  };
  await Promise.all(Array.from({ length: DEFINE_CONCURRENCY }, worker));
  return results;
}

const volumeXml = (name: string, format: "qcow2" | "raw") =>
  `<volume><name>${name}</name><capacity unit='bytes'>${1024 * 1024}</capacity><target><format type='${format}'/></target></volume>`;

/**
 * Defines `names` as KvmProxy would have (its domain XML, mark and two
 * volumes), none started. `ownerOf` gives each its owner (the resource name
 * differs per member).
 */
export async function defineFleet(
  inspector: LibvirtConnection,
  lab: LabEnv,
  names: readonly string[],
  ownerOf: (name: string) => OwnerIdentity,
): Promise<FleetDomain[]> {
  const pool = await inspector.call(Procedures.storagePoolLookupByName, { name: lab.pool });
  return inBatches(names, async (name) => {
    await inspector.call(Procedures.storageVolCreateXml, {
      pool,
      xml: volumeXml(overlayVolumeName(name), "qcow2"),
      flags: 0,
    });
    await inspector.call(Procedures.storageVolCreateXml, {
      pool,
      xml: volumeXml(seedVolumeName(name), "raw"),
      flags: 0,
    });
    const mark: OwnershipMark = {
      managed: true,
      owner: ownerOf(name),
      createdAt: new Date().toISOString(),
      packageVersion: "fleet",
    };
    const xml = buildDomainXml({
      name,
      domainType: "qemu",
      vcpus: 1,
      memoryMiB: 256,
      firmware: "bios",
      cpuMode: { model: "qemu64" },
      pool: lab.pool,
      overlayVolume: overlayVolumeName(name),
      seedVolume: seedVolumeName(name),
      network: { bridge: lab.bridge },
      mac: macAddressFor(name),
      mark,
    });
    const dom = await inspector.call(Procedures.domainDefineXml, { xml });
    return { name, uuid: uuidText(dom.uuid), createdAt: mark.createdAt };
  });
}

const uuidText = (bytes: Buffer): string =>
  bytes.toString("hex").replace(/^(.{8})(.{4})(.{4})(.{4})(.{12})$/, "$1-$2-$3-$4-$5");

/** Undefines the domains whose names start with `prefix` and deletes their volumes. */
export async function removeFleet(
  inspector: LibvirtConnection,
  lab: LabEnv,
  prefix: string,
): Promise<void> {
  const { domains } = await inspector.call(Procedures.connectListAllDomains, {
    needResults: 1,
    flags: 0,
  });
  await inBatches(
    domains.filter((dom) => dom.name.startsWith(prefix)),
    (dom) => inspector.call(Procedures.domainUndefineFlags, { dom, flags: 0 }),
  );
  const pool: StoragePoolHandle = await inspector.call(Procedures.storagePoolLookupByName, {
    name: lab.pool,
  });
  const { vols } = await inspector.call(Procedures.storagePoolListAllVolumes, {
    pool,
    needResults: 1,
    flags: 0,
  });
  await inBatches(
    vols.filter((vol) => vol.name.startsWith(prefix)),
    (vol) => inspector.call(Procedures.storageVolDelete, { vol, flags: 0 }),
  );
}
