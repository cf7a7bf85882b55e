/**
 * Byte-level encoders for ECMA-119 (ISO 9660) structures and the SUSP / Rock
 * Ridge (RRIP 1.10) entries. Each function returns exactly the bytes the
 * standard lays down; nothing here knows about sectors or trees.
 */

export const SECTOR_SIZE = 2048;
/** A directory record's length is one byte, so it can never exceed this. */
const MAX_DIRECTORY_RECORD = 255;

export function bothEndian16(value: number): Buffer {
  const out = Buffer.alloc(4);
  out.writeUInt16LE(value, 0);
  out.writeUInt16BE(value, 2);
  return out;
}

export function bothEndian32(value: number): Buffer {
  const out = Buffer.alloc(8);
  out.writeUInt32LE(value, 0);
  out.writeUInt32BE(value, 4);
  return out;
}

/** 7-byte "recording date and time" used by directory records and RR TF entries (UTC). */
function shortDate(date: Date): Buffer {
  return Buffer.from([
    date.getUTCFullYear() - 1900,
    date.getUTCMonth() + 1,
    date.getUTCDate(),
    date.getUTCHours(),
    date.getUTCMinutes(),
    date.getUTCSeconds(),
    0,
  ]);
}

/** 17-byte volume descriptor date ("YYYYMMDDHHMMSScc" + GMT offset), or the "not specified" form. */
export function longDate(date: Date | undefined): Buffer {
  if (date === undefined)
    return Buffer.concat([Buffer.from("0000000000000000", "ascii"), Buffer.from([0])]);
  const pad = (value: number, width: number): string => String(value).padStart(width, "0");
  const text =
    pad(date.getUTCFullYear(), 4) +
    pad(date.getUTCMonth() + 1, 2) +
    pad(date.getUTCDate(), 2) +
    pad(date.getUTCHours(), 2) +
    pad(date.getUTCMinutes(), 2) +
    pad(date.getUTCSeconds(), 2) +
    pad(Math.floor(date.getUTCMilliseconds() / 10), 2);
  return Buffer.concat([Buffer.from(text, "ascii"), Buffer.from([0])]);
}

/** Fixed-width text field padded with spaces (ASCII for the primary descriptor). */
export function asciiField(text: string, width: number): Buffer {
  const out = Buffer.alloc(width, 0x20);
  out.write(text.slice(0, width), 0, "ascii");
  return out;
}

/** UCS-2 big-endian, as Joliet stores every identifier. */
export function ucs2be(text: string): Buffer {
  const out = Buffer.alloc(text.length * 2);
  for (let i = 0; i < text.length; i++) out.writeUInt16BE(text.charCodeAt(i), i * 2);
  return out;
}

/** Fixed-width Joliet text field padded with UCS-2 spaces. */
export function ucs2Field(text: string, width: number): Buffer {
  const out = Buffer.alloc(width);
  for (let offset = 0; offset + 1 < width; offset += 2) out.writeUInt16BE(0x0020, offset);
  ucs2be(text.slice(0, Math.floor(width / 2))).copy(out, 0);
  return out;
}

export interface DirectoryRecordFields {
  extent: number;
  dataLength: number;
  date: Date;
  isDirectory: boolean;
  identifier: Buffer;
  systemUse?: Buffer;
}

export function directoryRecordLength(identifierLength: number, systemUseLength: number): number {
  const base = 33 + identifierLength + (identifierLength % 2 === 0 ? 1 : 0);
  const total = base + systemUseLength;
  return total + (total % 2);
}

export function directoryRecord(fields: DirectoryRecordFields): Buffer {
  const systemUse = fields.systemUse ?? Buffer.alloc(0);
  const length = directoryRecordLength(fields.identifier.length, systemUse.length);
  if (length > MAX_DIRECTORY_RECORD)
    throw new RangeError(`directory record of ${length} bytes exceeds 255`);
  const out = Buffer.alloc(length);
  out[0] = length;
  out[1] = 0; // no extended attribute record
  bothEndian32(fields.extent).copy(out, 2);
  bothEndian32(fields.dataLength).copy(out, 10);
  shortDate(fields.date).copy(out, 18);
  out[25] = fields.isDirectory ? 0x02 : 0x00;
  out[26] = 0;
  out[27] = 0;
  bothEndian16(1).copy(out, 28);
  out[32] = fields.identifier.length;
  fields.identifier.copy(out, 33);
  const systemUseStart =
    33 + fields.identifier.length + (fields.identifier.length % 2 === 0 ? 1 : 0);
  systemUse.copy(out, systemUseStart);
  return out;
}

export function pathTableRecord(
  identifier: Buffer,
  extent: number,
  parentNumber: number,
  bigEndian: boolean,
): Buffer {
  const out = Buffer.alloc(8 + identifier.length + (identifier.length % 2));
  out[0] = identifier.length;
  out[1] = 0;
  if (bigEndian) {
    out.writeUInt32BE(extent, 2);
    out.writeUInt16BE(parentNumber, 6);
  } else {
    out.writeUInt32LE(extent, 2);
    out.writeUInt16LE(parentNumber, 6);
  }
  identifier.copy(out, 8);
  return out;
}

// ---- SUSP / Rock Ridge entries -------------------------------------------------

function suspEntry(signature: string, body: Buffer): Buffer {
  const header = Buffer.from([
    signature.charCodeAt(0),
    signature.charCodeAt(1),
    4 + body.length,
    1,
  ]);
  return Buffer.concat([header, body]);
}

/** SUSP "SP": marks the root's "." record as carrying system use entries. */
export function spEntry(): Buffer {
  return suspEntry("SP", Buffer.from([0xbe, 0xef, 0]));
}

/** SUSP "CE": the rest of this record's entries live in a continuation area. */
export function ceEntry(block: number, offset: number, length: number): Buffer {
  return suspEntry(
    "CE",
    Buffer.concat([bothEndian32(block), bothEndian32(offset), bothEndian32(length)]),
  );
}
export const CE_ENTRY_LENGTH = 28;

/** SUSP "ER": names the extension in use (Rock Ridge 1.10, as registered). */
export function erEntry(): Buffer {
  const id = Buffer.from("RRIP_1991A", "ascii");
  const description = Buffer.from(
    "THE ROCK RIDGE INTERCHANGE PROTOCOL PROVIDES SUPPORT FOR POSIX FILE SYSTEM SEMANTICS",
    "ascii",
  );
  const source = Buffer.from(
    "PLEASE CONTACT DISC PUBLISHER FOR SPECIFICATION SOURCE.  SEE PUBLISHER IDENTIFIER IN PRIMARY VOLUME DESCRIPTOR FOR CONTACT INFORMATION.",
    "ascii",
  );
  return suspEntry(
    "ER",
    Buffer.concat([
      Buffer.from([id.length, description.length, source.length, 1]),
      id,
      description,
      source,
    ]),
  );
}

export const RR_FLAG = { PX: 0x01, NM: 0x08, TF: 0x80 } as const;

/** RRIP 1.09 "RR": which entries follow. Linux consults it when present, so it must be right. */
export function rrEntry(flags: number): Buffer {
  return suspEntry("RR", Buffer.from([flags]));
}

/** RRIP "PX" in its 1.10 form (36 bytes: mode, links, uid, gid). */
export function pxEntry(mode: number, links: number): Buffer {
  return suspEntry(
    "PX",
    Buffer.concat([bothEndian32(mode), bothEndian32(links), bothEndian32(0), bothEndian32(0)]),
  );
}

/** RRIP "TF": modify, access and attribute-change times, short form. */
export function tfEntry(date: Date): Buffer {
  const stamp = shortDate(date);
  return suspEntry("TF", Buffer.concat([Buffer.from([0x0e]), stamp, stamp, stamp]));
}

/** RRIP "NM": the real file name, UTF-8, exactly as given. */
export function nmEntry(name: string): Buffer {
  return suspEntry("NM", Buffer.concat([Buffer.from([0]), Buffer.from(name, "utf8")]));
}

export const POSIX_DIRECTORY = 0o040000;
export const POSIX_REGULAR_FILE = 0o100000;
