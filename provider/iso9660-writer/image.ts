/**
 * Lays the tree out in sectors and serialises it: volume descriptors (primary
 * + Joliet, descriptors.ts), four path tables, two directory hierarchies
 * (planned in directories.ts) that share one copy of every file's data, and a
 * Rock Ridge continuation area.
 *
 * Sector map (2048-byte sectors):
 *   0-15 system area | 16 PVD | 17 Joliet SVD | 18 terminator |
 *   path tables (primary L, M, Joliet L, M) | primary directories |
 *   Joliet directories | continuation areas | file data
 */
import { Readable } from "node:stream";
import { volumeDescriptor, terminator } from "./descriptors";
import {
  pathTableBytes,
  placeContinuations,
  planDirectory,
  type Continuation,
  type DirectoryPlan,
  type Tree,
} from "./directories";
import { IsoWriterError } from "./errors";
import {
  buildTree,
  directoriesInPathTableOrder,
  filesInOrder,
  type DirNode,
  type FileNode,
  type IsoFile,
} from "./layout";
import { SECTOR_SIZE, ceEntry, directoryRecord, ucs2be } from "./records";

export interface IsoImageSpec {
  files: readonly IsoFile[];
  /** Directories to create even when empty. Parents of files are created anyway. */
  directories?: readonly string[];
  /** Volume label; 1-16 characters of A-Z a-z 0-9 _ . - (NoCloud wants "cidata"). */
  volumeId?: string;
  /**
   * Every timestamp in the image. Fixed by default so equal inputs give
   * byte-identical images.
   */
  timestamp?: Date;
  systemId?: string;
  applicationId?: string;
}

export interface IsoImage {
  /** Exact byte length, known before the first byte is produced (uploads need it). */
  readonly size: number;
  toBuffer(): Buffer;
  /** Produces the image chunk by chunk without copying file contents into one buffer. */
  toStream(): Readable;
  /**
   * The image's bytes in order, as views of what the image already holds (file
   * contents are not copied; padding is shared zeros). For reading only, e.g.
   * hashing the image without building it in one buffer first.
   */
  chunks(): Iterable<Uint8Array>;
}

export const DEFAULT_TIMESTAMP = new Date(Date.UTC(2000, 0, 1, 0, 0, 0));
const FIRST_PATH_TABLE_SECTOR = 19;
/** Sectors 0-15, the system area: all zeros here (nothing boots from a seed). */
const SYSTEM_AREA_BYTES = 16 * SECTOR_SIZE;
/** Read-only zeros that stand for the system area and sector padding in chunks(). */
const SHARED_ZEROS = new Uint8Array(SYSTEM_AREA_BYTES);
const VOLUME_ID = /^[A-Za-z0-9_.-]{1,16}$/;
/** Sector numbers are 32-bit; keep well inside them and inside Node's Buffer limit. */
const MAX_IMAGE_BYTES = 2 ** 32 - 1;

export function buildIsoImage(spec: IsoImageSpec): IsoImage {
  const { volumeId, timestamp } = checkedLabels(spec);
  const root = buildTree(spec.files, spec.directories ?? []);
  const trees: Trees = {
    primary: directoriesInPathTableOrder(root, (dir) => Buffer.from(dir.isoName, "ascii")).map(
      (dir) => planDirectory(dir, "primary", timestamp),
    ),
    joliet: directoriesInPathTableOrder(root, (dir) => ucs2be(dir.name)).map((dir) =>
      planDirectory(dir, "joliet", timestamp),
    ),
  };
  const files = filesInOrder(root);
  const sectors = allocateSectors(trees, files);

  // `metadata` starts at sector 16: the system area is zeros, written only where bytes are produced.
  const metadata = Buffer.alloc(sectors.metadataEnd * SECTOR_SIZE - SYSTEM_AREA_BYTES);
  const place: Place = (bytes, imageOffset) => {
    bytes.copy(metadata, imageOffset - SYSTEM_AREA_BYTES);
  };
  const plans: PlansByTree = {
    primary: new Map(trees.primary.map((plan) => [plan.dir, plan])),
    joliet: new Map(trees.joliet.map((plan) => [plan.dir, plan])),
  };
  writeVolumeDescriptors(place, {
    volumeId,
    systemId: spec.systemId ?? "LINUX",
    applicationId: spec.applicationId ?? "EGRESS-PROXIES ISO9660-WRITER",
    timestamp,
    totalSectors: sectors.total,
    root: (tree) => plans[tree].get(root)!,
    sectors,
  });
  writePathTables(place, trees, sectors.pathTables);
  writeDirectoryRecords(place, trees, plans, timestamp);
  for (const continuation of sectors.continuations)
    place(continuation.bytes, continuation.block * SECTOR_SIZE + continuation.offset);

  return imageOf(metadata, files, sectors.total * SECTOR_SIZE);
}

type Trees = Record<Tree, DirectoryPlan[]>;
type PlansByTree = Record<Tree, Map<DirNode, DirectoryPlan>>;
/** Copies bytes into the image at an absolute byte offset. */
type Place = (bytes: Buffer, imageOffset: number) => void;

/** The volume label and timestamp, checked: both end up in fixed-width fields. */
function checkedLabels(spec: IsoImageSpec): { volumeId: string; timestamp: Date } {
  const volumeId = spec.volumeId ?? "CDROM";
  if (!VOLUME_ID.test(volumeId))
    throw new IsoWriterError(
      `volumeId ${JSON.stringify(volumeId)} must be 1-16 characters of A-Z a-z 0-9 _ . - (Joliet stores 16 at most)`,
    );
  const timestamp = spec.timestamp ?? DEFAULT_TIMESTAMP;
  if (!(timestamp instanceof Date) || Number.isNaN(timestamp.getTime()))
    throw new IsoWriterError("timestamp must be a valid Date");
  if (timestamp.getUTCFullYear() < 1900 || timestamp.getUTCFullYear() > 2155)
    throw new IsoWriterError(
      "timestamp must fall between 1900 and 2155 (ISO 9660 stores years since 1900 in a byte)",
    );
  return { volumeId, timestamp };
}

interface SectorMap {
  /** Each tree's path table size in bytes, and where its L and M copies start. */
  pathTables: Record<Tree, { bytes: number; l: number; m: number }>;
  continuations: Continuation[];
  /** The first sector after the metadata (where file data starts). */
  metadataEnd: number;
  total: number;
}

/**
 * Gives every structure its sectors, in the order of the sector map above;
 * sets each directory plan's and file's extent on the way.
 */
function allocateSectors(trees: Trees, files: FileNode[]): SectorMap {
  let next = FIRST_PATH_TABLE_SECTOR;
  const take = (bytes: number): number => {
    const start = next;
    next += Math.max(1, Math.ceil(bytes / SECTOR_SIZE));
    return start;
  };
  const pathTable = (tree: Tree) => {
    const bytes = pathTableBytes(trees[tree], tree, false).length;
    return { bytes, l: take(bytes), m: take(bytes) };
  };
  const pathTables = { primary: pathTable("primary"), joliet: pathTable("joliet") };
  for (const tree of [trees.primary, trees.joliet])
    for (const plan of tree) plan.extent = take(plan.size);
  const continuations = trees.primary.flatMap((plan) =>
    plan.records.flatMap((record) => (record.continuation ? [record.continuation] : [])),
  );
  placeContinuations(continuations, () => take(SECTOR_SIZE));
  const metadataEnd = next;
  for (const file of files)
    file.extent = file.content.byteLength === 0 ? 0 : take(file.content.byteLength);
  if (next * SECTOR_SIZE > MAX_IMAGE_BYTES)
    throw new IsoWriterError(
      `the image would be ${next * SECTOR_SIZE} bytes; this writer stops at 4 GiB`,
    );
  return { pathTables, continuations, metadataEnd, total: next };
}

/** The primary and Joliet volume descriptors (sectors 16 and 17) and the terminator (18). */
function writeVolumeDescriptors(
  place: Place,
  volume: {
    volumeId: string;
    systemId: string;
    applicationId: string;
    timestamp: Date;
    totalSectors: number;
    root: (tree: Tree) => DirectoryPlan;
    sectors: SectorMap;
  },
): void {
  const { root, sectors, ...fields } = volume;
  const rootRecord = (tree: Tree): Buffer =>
    directoryRecord({
      extent: root(tree).extent,
      dataLength: root(tree).size,
      date: volume.timestamp,
      isDirectory: true,
      identifier: Buffer.from([0]),
    });
  (["primary", "joliet"] as const).forEach((tree, index) => {
    const table = sectors.pathTables[tree];
    place(
      volumeDescriptor({
        ...fields,
        type: index === 0 ? 1 : 2,
        pathTableSize: table.bytes,
        pathTableL: table.l,
        pathTableM: table.m,
        rootRecord: rootRecord(tree),
      }),
      (16 + index) * SECTOR_SIZE,
    );
  });
  place(terminator(), 18 * SECTOR_SIZE);
}

/** Each tree's path table, little-endian (L) and big-endian (M). */
function writePathTables(place: Place, trees: Trees, tables: SectorMap["pathTables"]): void {
  for (const tree of ["primary", "joliet"] as const) {
    place(pathTableBytes(trees[tree], tree, false), tables[tree].l * SECTOR_SIZE);
    place(pathTableBytes(trees[tree], tree, true), tables[tree].m * SECTOR_SIZE);
  }
}

/** Every directory's records, in both trees; a record with a continuation points at it (CE). */
function writeDirectoryRecords(
  place: Place,
  trees: Trees,
  plans: PlansByTree,
  timestamp: Date,
): void {
  for (const tree of ["primary", "joliet"] as const) {
    for (const plan of trees[tree]) {
      for (const record of plan.records) {
        const target =
          record.target.kind === "dir"
            ? {
                extent: plans[tree].get(record.target)!.extent,
                dataLength: plans[tree].get(record.target)!.size,
              }
            : { extent: record.target.extent, dataLength: record.target.content.byteLength };
        const systemUse = record.continuation
          ? [
              ...record.systemUse,
              ceEntry(
                record.continuation.block,
                record.continuation.offset,
                record.continuation.bytes.length,
              ),
            ]
          : record.systemUse;
        place(
          directoryRecord({
            ...target,
            date: timestamp,
            isDirectory: record.target.kind === "dir",
            identifier: record.identifier,
            systemUse: Buffer.concat(systemUse),
          }),
          plan.extent * SECTOR_SIZE + record.offset,
        );
      }
    }
  }
}

/**
 * The image as pieces in byte order: the system area, the metadata, then each
 * file's content and the zeros that pad it to a whole sector. `zeros(n)` gives
 * the padding, so each consumer decides whether it may share one buffer.
 */
function* piecesOf(
  metadata: Buffer,
  files: FileNode[],
  zeros: (length: number) => Uint8Array,
): Generator<Uint8Array> {
  yield zeros(SYSTEM_AREA_BYTES);
  yield metadata;
  for (const file of files) {
    if (file.content.byteLength === 0) continue;
    yield file.content;
    const tail = file.content.byteLength % SECTOR_SIZE;
    if (tail !== 0) yield zeros(SECTOR_SIZE - tail);
  }
}

const sharedZeros = (length: number): Uint8Array => SHARED_ZEROS.subarray(0, length);

function imageOf(metadata: Buffer, files: FileNode[], size: number): IsoImage {
  return {
    size,
    toBuffer(): Buffer {
      // Every byte is written below (padding included), so the zero-fill of alloc() would be wasted work.
      const out = Buffer.allocUnsafe(size);
      let offset = 0;
      for (const piece of piecesOf(metadata, files, sharedZeros)) {
        out.set(piece, offset);
        offset += piece.byteLength;
      }
      return out;
    },
    toStream(): Readable {
      // A stream's reader owns its chunks, so padding is fresh zeros, never the shared ones.
      function* chunks(): Generator<Buffer> {
        for (const piece of piecesOf(metadata, files, (length) => Buffer.alloc(length)))
          yield Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
      }
      return Readable.from(chunks(), { objectMode: false });
    },
    chunks(): Iterable<Uint8Array> {
      return piecesOf(metadata, files, sharedZeros);
    },
  };
}
