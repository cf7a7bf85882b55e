/**
 * Where an upload's bytes come from when they are not a Node Readable: a
 * source that reads into the upload's own frames (a file, with readv).
 */
import { open } from "node:fs/promises";
import type { Readable } from "node:stream";

/**
 * An upload source that reads into buffers it is given (a file), so the
 * upload reads straight into its reused frames: no Buffer per chunk, no copy.
 * A Node Readable hands over a fresh Buffer per chunk instead, and that
 * garbage sets the process's peak memory (V8 frees Buffer memory only once
 * ~64 MB of it piled up).
 */
export interface ReadIntoSource {
  /**
   * Fills `targets` in order as far as the source goes, like readv(2);
   * resolves how many bytes it wrote (fewer than asked is fine), 0 at the end.
   */
  readInto(targets: Buffer[]): Promise<number>;
  /** Called once when the upload no longer needs the source, whether it succeeded or failed. */
  close?(): void;
}

/** A file as a ReadIntoSource, read from its start to its end; closed by the upload. */
export async function fileUploadSource(path: string): Promise<ReadIntoSource> {
  const file = await open(path, "r");
  let position = 0;
  return {
    async readInto(targets) {
      const { bytesRead } = await file.readv(targets, position);
      position += bytesRead;
      return bytesRead;
    },
    close() {
      file.close().catch(() => undefined);
    },
  };
}

export function isReadIntoSource(source: Readable | ReadIntoSource): source is ReadIntoSource {
  return typeof (source as Partial<ReadIntoSource>).readInto === "function";
}
