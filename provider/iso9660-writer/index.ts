/**
 * iso9660-writer: an in-memory ISO 9660 image writer with Joliet and Rock
 * Ridge, deterministic output and no temporary files. Self-contained: it
 * imports nothing from the rest of the project, so it could be published alone.
 */
export { buildIsoImage, DEFAULT_TIMESTAMP } from "./image";
export type { IsoImage, IsoImageSpec } from "./image";
export type { IsoFile } from "./layout";
export { MAX_NAME_LENGTH, MAX_NAME_UTF8_BYTES, MAX_DEPTH } from "./layout";
export { IsoWriterError } from "./errors";
