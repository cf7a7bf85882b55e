/**
 * Lays the tree out in sectors and serialises it: volume descriptors (primary
 * + Joliet), four path tables, two directory hierarchies that share one copy
 * of every file's data, and a Rock Ridge continuation area.
 *
 * Sector map (2048-byte sectors):
 *   0-15 system area | 16 PVD | 17 Joliet SVD | 18 terminator |
 *   path tables (primary L, M, Joliet L, M) | primary directories |
 *   Joliet directories | continuation areas | file data
 */
import { Readable } from "node:stream";
import { IsoWriterError } from "./errors";
import {
  buildTree,
  directoriesInPathTableOrder,
  filesInOrder,
  type DirNode,
  type FileNode,
  type IsoFile,
} from "./layout";
import {
  CE_ENTRY_LENGTH,
  POSIX_DIRECTORY,
  POSIX_REGULAR_FILE,
  RR_FLAG,
  SECTOR_SIZE,
  asciiField,
  bothEndian16,
  bothEndian32,
  ceEntry,
  directoryRecord,
  directoryRecordLength,
  erEntry,
  longDate,
  nmEntry,
  pathTableRecord,
  pxEntry,
  rrEntry,
  spEntry,
  tfEntry,
  ucs2Field,
  ucs2be,
} from "./records";

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

type Tree = "primary" | "joliet";

interface PlannedRecord {
  identifier: Buffer;
  target: DirNode | FileNode;
  systemUse: Buffer[];
  /** Entries moved out of the record because it would exceed 255 bytes. */
  continuation?: Continuation;
  length: number;
  /** Byte offset inside the directory's extent; records never straddle sectors. */
  offset: number;
}

interface Continuation {
  bytes: Buffer;
  block: number;
  offset: number;
}

interface DirectoryPlan {
  dir: DirNode;
  records: PlannedRecord[];
  extent: number;
  size: number;
}

export function buildIsoImage(spec: IsoImageSpec): IsoImage {
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

  const root = buildTree(spec.files, spec.directories ?? []);
  const trees: Record<Tree, DirectoryPlan[]> = {
    primary: directoriesInPathTableOrder(root, (dir) => Buffer.from(dir.isoName, "ascii")).map(
      (dir) => planDirectory(dir, "primary", timestamp),
    ),
    joliet: directoriesInPathTableOrder(root, (dir) => ucs2be(dir.name)).map((dir) =>
      planDirectory(dir, "joliet", timestamp),
    ),
  };
  const files = filesInOrder(root);

  // ---- allocation ----
  const pathTables = {
    primary: pathTableBytes(trees.primary, "primary", false).length,
    joliet: pathTableBytes(trees.joliet, "joliet", false).length,
  };
  let next = FIRST_PATH_TABLE_SECTOR;
  const take = (bytes: number): number => {
    const start = next;
    next += Math.max(1, Math.ceil(bytes / SECTOR_SIZE));
    return start;
  };
  const pathTableSectors = {
    primaryL: take(pathTables.primary),
    primaryM: take(pathTables.primary),
    jolietL: take(pathTables.joliet),
    jolietM: take(pathTables.joliet),
  };
  for (const tree of [trees.primary, trees.joliet])
    for (const plan of tree) plan.extent = take(plan.size);
  const continuations = trees.primary.flatMap((plan) =>
    plan.records.flatMap((record) => (record.continuation ? [record.continuation] : [])),
  );
  placeContinuations(continuations, () => take(SECTOR_SIZE));
  const metadataSectors = next;
  for (const file of files)
    file.extent = file.content.byteLength === 0 ? 0 : take(file.content.byteLength);
  const totalSectors = next;
  if (totalSectors * SECTOR_SIZE > MAX_IMAGE_BYTES)
    throw new IsoWriterError(
      `the image would be ${totalSectors * SECTOR_SIZE} bytes; this writer stops at 4 GiB`,
    );

  // ---- serialisation of everything before the file data ----
  // `metadata` starts at sector 16: the system area is zeros, written only where bytes are produced.
  const metadata = Buffer.alloc(metadataSectors * SECTOR_SIZE - SYSTEM_AREA_BYTES);
  const place = (bytes: Buffer, imageOffset: number): void => {
    bytes.copy(metadata, imageOffset - SYSTEM_AREA_BYTES);
  };
  const extentOf = new Map<Tree, Map<DirNode, DirectoryPlan>>([
    ["primary", new Map(trees.primary.map((plan) => [plan.dir, plan]))],
    ["joliet", new Map(trees.joliet.map((plan) => [plan.dir, plan]))],
  ]);
  const rootRecord = (tree: Tree): Buffer => {
    const plan = extentOf.get(tree)!.get(root)!;
    return directoryRecord({
      extent: plan.extent,
      dataLength: plan.size,
      date: timestamp,
      isDirectory: true,
      identifier: Buffer.from([0]),
    });
  };
  const descriptorFields = {
    volumeId,
    systemId: spec.systemId ?? "LINUX",
    applicationId: spec.applicationId ?? "EGRESS-PROXIES ISO9660-WRITER",
    timestamp,
    totalSectors,
  };
  place(
    volumeDescriptor({
      ...descriptorFields,
      type: 1,
      pathTableSize: pathTables.primary,
      pathTableL: pathTableSectors.primaryL,
      pathTableM: pathTableSectors.primaryM,
      rootRecord: rootRecord("primary"),
    }),
    16 * SECTOR_SIZE,
  );
  place(
    volumeDescriptor({
      ...descriptorFields,
      type: 2,
      pathTableSize: pathTables.joliet,
      pathTableL: pathTableSectors.jolietL,
      pathTableM: pathTableSectors.jolietM,
      rootRecord: rootRecord("joliet"),
    }),
    17 * SECTOR_SIZE,
  );
  place(terminator(), 18 * SECTOR_SIZE);
  place(pathTableBytes(trees.primary, "primary", false), pathTableSectors.primaryL * SECTOR_SIZE);
  place(pathTableBytes(trees.primary, "primary", true), pathTableSectors.primaryM * SECTOR_SIZE);
  place(pathTableBytes(trees.joliet, "joliet", false), pathTableSectors.jolietL * SECTOR_SIZE);
  place(pathTableBytes(trees.joliet, "joliet", true), pathTableSectors.jolietM * SECTOR_SIZE);
  for (const tree of ["primary", "joliet"] as const) {
    const plans = extentOf.get(tree)!;
    for (const plan of trees[tree]) {
      for (const record of plan.records) {
        const target =
          record.target.kind === "dir"
            ? {
                extent: plans.get(record.target)!.extent,
                dataLength: plans.get(record.target)!.size,
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
  for (const continuation of continuations)
    place(continuation.bytes, continuation.block * SECTOR_SIZE + continuation.offset);

  return imageOf(metadata, files, totalSectors * SECTOR_SIZE);
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

// ---- directory planning ------------------------------------------------------------

function sortedChildren(dir: DirNode, tree: Tree): Array<FileNode | DirNode> {
  const key = (node: FileNode | DirNode): Buffer =>
    tree === "primary" ? Buffer.from(node.isoName, "ascii") : ucs2be(node.name);
  return [...dir.children].sort((a, b) => Buffer.compare(key(a), key(b)));
}

function subdirectoryCount(dir: DirNode): number {
  return dir.children.filter((child) => child.kind === "dir").length;
}

function rockRidgeAttributes(node: FileNode | DirNode, date: Date): Buffer[] {
  return node.kind === "dir"
    ? [pxEntry(POSIX_DIRECTORY | 0o555, 2 + subdirectoryCount(node)), tfEntry(date)]
    : [pxEntry(POSIX_REGULAR_FILE | node.mode, 1), tfEntry(date)];
}

function planDirectory(dir: DirNode, tree: Tree, date: Date): DirectoryPlan {
  const records: PlannedRecord[] = [];
  const add = (
    identifier: Buffer,
    target: DirNode | FileNode,
    inline: Buffer[],
    moved?: Buffer[],
  ): void => {
    const continuation =
      moved && moved.length > 0 ? { bytes: Buffer.concat(moved), block: 0, offset: 0 } : undefined;
    const systemUseLength =
      inline.reduce((sum, entry) => sum + entry.length, 0) + (continuation ? CE_ENTRY_LENGTH : 0);
    records.push({
      identifier,
      target,
      systemUse: inline,
      continuation,
      length: directoryRecordLength(identifier.length, systemUseLength),
      offset: 0,
    });
  };
  const parent = dir.parent ?? dir;
  if (tree === "joliet") {
    add(Buffer.from([0]), dir, []);
    add(Buffer.from([1]), parent, []);
    // No ";1" version suffix: genisoimage and xorriso omit it too, and some readers show it verbatim.
    for (const child of sortedChildren(dir, tree)) add(ucs2be(child.name), child, []);
  } else {
    const flagsForDots = RR_FLAG.PX | RR_FLAG.TF;
    if (dir.parent === undefined) {
      // SUSP: SP opens the root's "." record; ER (too long to fit) goes to the continuation area.
      add(
        Buffer.from([0]),
        dir,
        [spEntry(), rrEntry(flagsForDots), ...rockRidgeAttributes(dir, date)],
        [erEntry()],
      );
    } else {
      add(Buffer.from([0]), dir, [rrEntry(flagsForDots), ...rockRidgeAttributes(dir, date)]);
    }
    add(Buffer.from([1]), parent, [rrEntry(flagsForDots), ...rockRidgeAttributes(parent, date)]);
    for (const child of sortedChildren(dir, tree)) {
      const identifier = Buffer.from(
        child.kind === "file" ? `${child.isoName};1` : child.isoName,
        "ascii",
      );
      const flags = RR_FLAG.PX | RR_FLAG.TF | RR_FLAG.NM;
      // MAX_NAME_UTF8_BYTES keeps this within 255 bytes; directoryRecord() checks it again.
      add(identifier, child, [
        rrEntry(flags),
        nmEntry(child.name),
        ...rockRidgeAttributes(child, date),
      ]);
    }
  }
  let offset = 0;
  for (const record of records) {
    if ((offset % SECTOR_SIZE) + record.length > SECTOR_SIZE)
      offset = Math.ceil(offset / SECTOR_SIZE) * SECTOR_SIZE;
    record.offset = offset;
    offset += record.length;
  }
  return { dir, records, extent: 0, size: Math.ceil(offset / SECTOR_SIZE) * SECTOR_SIZE };
}

/** Packs continuation areas into sectors; an area never crosses a sector (Linux reads one block). */
function placeContinuations(continuations: Continuation[], newSector: () => number): void {
  let sector = -1;
  let used = SECTOR_SIZE;
  for (const continuation of continuations) {
    if (used + continuation.bytes.length > SECTOR_SIZE) {
      sector = newSector();
      used = 0;
    }
    continuation.block = sector;
    continuation.offset = used;
    used += continuation.bytes.length;
  }
}

function pathTableBytes(plans: DirectoryPlan[], tree: Tree, bigEndian: boolean): Buffer {
  const numberOf = new Map(plans.map((plan, index) => [plan.dir, index + 1]));
  return Buffer.concat(
    plans.map((plan) => {
      const identifier =
        plan.dir.parent === undefined
          ? Buffer.from([0])
          : tree === "primary"
            ? Buffer.from(plan.dir.isoName, "ascii")
            : ucs2be(plan.dir.name);
      const parentNumber = plan.dir.parent === undefined ? 1 : numberOf.get(plan.dir.parent)!;
      return pathTableRecord(identifier, plan.extent, parentNumber, bigEndian);
    }),
  );
}

// ---- volume descriptors ------------------------------------------------------------

interface DescriptorFields {
  type: 1 | 2;
  volumeId: string;
  systemId: string;
  applicationId: string;
  timestamp: Date;
  totalSectors: number;
  pathTableSize: number;
  pathTableL: number;
  pathTableM: number;
  rootRecord: Buffer;
}

function volumeDescriptor(fields: DescriptorFields): Buffer {
  const joliet = fields.type === 2;
  const text = (value: string, width: number): Buffer =>
    joliet ? ucs2Field(value, width) : asciiField(value, width);
  const out = Buffer.alloc(SECTOR_SIZE);
  out[0] = fields.type;
  out.write("CD001", 1, "ascii");
  out[6] = 1;
  text(fields.systemId, 32).copy(out, 8);
  text(fields.volumeId, 32).copy(out, 40);
  bothEndian32(fields.totalSectors).copy(out, 80);
  if (joliet) out.write("%/E", 88, "ascii"); // UCS-2 level 3
  bothEndian16(1).copy(out, 120); // volume set size
  bothEndian16(1).copy(out, 124); // volume sequence number
  bothEndian16(SECTOR_SIZE).copy(out, 128);
  bothEndian32(fields.pathTableSize).copy(out, 132);
  out.writeUInt32LE(fields.pathTableL, 140);
  out.writeUInt32BE(fields.pathTableM, 148);
  fields.rootRecord.copy(out, 156);
  text("", 128).copy(out, 190); // volume set
  text("", 128).copy(out, 318); // publisher
  text("", 128).copy(out, 446); // data preparer
  text(fields.applicationId, 128).copy(out, 574);
  text("", 37).copy(out, 702); // copyright file
  text("", 37).copy(out, 739); // abstract file
  text("", 37).copy(out, 776); // bibliographic file
  longDate(fields.timestamp).copy(out, 813);
  longDate(fields.timestamp).copy(out, 830);
  longDate(undefined).copy(out, 847);
  longDate(undefined).copy(out, 864);
  out[881] = 1;
  return out;
}

function terminator(): Buffer {
  const out = Buffer.alloc(SECTOR_SIZE);
  out[0] = 255;
  out.write("CD001", 1, "ascii");
  out[6] = 1;
  return out;
}
