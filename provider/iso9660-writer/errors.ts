/** Raised for input the ISO 9660 format (with Joliet and Rock Ridge) cannot represent. */
export class IsoWriterError extends Error {
  override readonly name = "IsoWriterError";
}
