/**
 * The volume descriptors: primary (type 1), Joliet's supplementary (type 2,
 * UCS-2 text) and the set terminator.
 */
import {
  SECTOR_SIZE,
  asciiField,
  bothEndian16,
  bothEndian32,
  longDate,
  ucs2Field,
} from "./records";

export interface DescriptorFields {
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

export function volumeDescriptor(fields: DescriptorFields): Buffer {
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

export function terminator(): Buffer {
  const out = Buffer.alloc(SECTOR_SIZE);
  out[0] = 255;
  out.write("CD001", 1, "ascii");
  out[6] = 1;
  return out;
}
