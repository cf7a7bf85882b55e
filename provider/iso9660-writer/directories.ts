/**
 * Each directory as its records: "." and "..", then its children in the
 * order the tree sorts them, with Rock Ridge entries (primary tree) or UCS-2
 * names (Joliet); the continuation areas entries too long for a record move
 * to; and the path tables that list the directories. Where each record lands
 * in the image is image.ts's business.
 */
import type { DirNode, FileNode } from "./layout";
import {
  CE_ENTRY_LENGTH,
  POSIX_DIRECTORY,
  POSIX_REGULAR_FILE,
  RR_FLAG,
  SECTOR_SIZE,
  directoryRecordLength,
  erEntry,
  nmEntry,
  pathTableRecord,
  pxEntry,
  rrEntry,
  spEntry,
  tfEntry,
  ucs2be,
} from "./records";

export type Tree = "primary" | "joliet";

export interface PlannedRecord {
  identifier: Buffer;
  target: DirNode | FileNode;
  systemUse: Buffer[];
  /** Entries moved out of the record because it would exceed 255 bytes. */
  continuation?: Continuation;
  length: number;
  /** Byte offset inside the directory's extent; records never straddle sectors. */
  offset: number;
}

export interface Continuation {
  bytes: Buffer;
  block: number;
  offset: number;
}

export interface DirectoryPlan {
  dir: DirNode;
  records: PlannedRecord[];
  extent: number;
  size: number;
}

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

export function planDirectory(dir: DirNode, tree: Tree, date: Date): DirectoryPlan {
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
export function placeContinuations(continuations: Continuation[], newSector: () => number): void {
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

export function pathTableBytes(plans: DirectoryPlan[], tree: Tree, bigEndian: boolean): Buffer {
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
