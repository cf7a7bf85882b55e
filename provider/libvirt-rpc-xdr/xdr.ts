/**
 * XDR (RFC 4506) as libvirt uses it: everything is big-endian and padded to
 * 4 bytes, `char` takes 4 bytes, strings are length-prefixed UTF-8, optional
 * values are a 0/1 word followed by the value. 64-bit values are BigInt so no
 * precision is lost; callers that want a Number convert with `toSafeNumber`.
 */

/** A malformed or out-of-bounds XDR value, on either side of the wire. */
export class XdrError extends Error {
  override readonly name = "XdrError";
}

const UINT32_MAX = 0xffffffff;
const INT32_MIN = -0x80000000;
const INT32_MAX = 0x7fffffff;
const UINT64_MAX = (1n << 64n) - 1n;
const INT64_MIN = -(1n << 63n);
const INT64_MAX = (1n << 63n) - 1n;

function padding(length: number): number {
  return (4 - (length % 4)) % 4;
}

/** Appends XDR values to a growing buffer. */
export class XdrWriter {
  private buffer: Buffer;
  private offset = 0;

  constructor(initialCapacity = 256) {
    this.buffer = Buffer.allocUnsafe(initialCapacity);
  }

  get length(): number {
    return this.offset;
  }

  /** The bytes written so far (a view, not a copy). */
  finish(): Buffer {
    return this.buffer.subarray(0, this.offset);
  }

  private reserve(bytes: number): void {
    if (this.offset + bytes <= this.buffer.length) return;
    let capacity = this.buffer.length * 2;
    while (capacity < this.offset + bytes) capacity *= 2;
    const grown = Buffer.allocUnsafe(capacity);
    this.buffer.copy(grown, 0, 0, this.offset);
    this.buffer = grown;
  }

  int(value: number): this {
    if (!Number.isInteger(value) || value < INT32_MIN || value > INT32_MAX) {
      throw new XdrError(`int out of range: ${value}`);
    }
    this.reserve(4);
    this.buffer.writeInt32BE(value, this.offset);
    this.offset += 4;
    return this;
  }

  uint(value: number): this {
    if (!Number.isInteger(value) || value < 0 || value > UINT32_MAX) {
      throw new XdrError(`unsigned int out of range: ${value}`);
    }
    this.reserve(4);
    this.buffer.writeUInt32BE(value, this.offset);
    this.offset += 4;
    return this;
  }

  bool(value: boolean): this {
    return this.uint(value ? 1 : 0);
  }

  hyper(value: bigint | number): this {
    const big = BigInt(value);
    if (big < INT64_MIN || big > INT64_MAX) throw new XdrError(`hyper out of range: ${big}`);
    this.reserve(8);
    this.buffer.writeBigInt64BE(big, this.offset);
    this.offset += 8;
    return this;
  }

  uhyper(value: bigint | number): this {
    const big = BigInt(value);
    if (big < 0n || big > UINT64_MAX) throw new XdrError(`unsigned hyper out of range: ${big}`);
    this.reserve(8);
    this.buffer.writeBigUInt64BE(big, this.offset);
    this.offset += 8;
    return this;
  }

  /** IEEE 754 double, big-endian (XDR §4.7). */
  double(value: number): this {
    this.reserve(8);
    this.buffer.writeDoubleBE(value, this.offset);
    this.offset += 8;
    return this;
  }

  /** Fixed-length opaque: exactly `length` bytes, padded, no length word. */
  fixedOpaque(bytes: Uint8Array, length: number): this {
    if (bytes.length !== length) {
      throw new XdrError(`fixed opaque must be ${length} bytes, got ${bytes.length}`);
    }
    this.reserve(length + padding(length));
    this.buffer.set(bytes, this.offset);
    this.offset += length;
    this.zeroPad(length);
    return this;
  }

  /** Variable-length opaque: length word, bytes, padding. */
  opaque(bytes: Uint8Array, maxLength = UINT32_MAX): this {
    if (bytes.length > maxLength) {
      throw new XdrError(`opaque of ${bytes.length} bytes exceeds its limit of ${maxLength}`);
    }
    this.uint(bytes.length);
    this.reserve(bytes.length + padding(bytes.length));
    this.buffer.set(bytes, this.offset);
    this.offset += bytes.length;
    this.zeroPad(bytes.length);
    return this;
  }

  string(value: string, maxLength = UINT32_MAX): this {
    const bytes = Buffer.from(value, "utf8");
    if (bytes.length > maxLength) {
      throw new XdrError(`string of ${bytes.length} bytes exceeds its limit of ${maxLength}`);
    }
    return this.opaque(bytes);
  }

  /** An optional value (XDR pointer): 0, or 1 followed by the value. */
  optional<T>(value: T | null | undefined, encode: (writer: this, value: T) => void): this {
    if (value === null || value === undefined) return this.uint(0);
    this.uint(1);
    encode(this, value);
    return this;
  }

  /** A variable-length array: count word then each element. */
  array<T>(items: readonly T[], maxLength: number, encode: (writer: this, item: T) => void): this {
    if (items.length > maxLength) {
      throw new XdrError(`array of ${items.length} elements exceeds its limit of ${maxLength}`);
    }
    this.uint(items.length);
    for (const item of items) encode(this, item);
    return this;
  }

  private zeroPad(length: number): void {
    const pad = padding(length);
    this.buffer.fill(0, this.offset, this.offset + pad);
    this.offset += pad;
  }
}

/** Reads XDR values from a buffer, refusing to read past its end. */
export class XdrReader {
  private offset = 0;

  constructor(private readonly buffer: Buffer) {}

  get remaining(): number {
    return this.buffer.length - this.offset;
  }

  private need(bytes: number, what: string): void {
    if (this.offset + bytes > this.buffer.length) {
      throw new XdrError(
        `truncated XDR: ${what} needs ${bytes} bytes at offset ${this.offset}, only ${this.remaining} left`,
      );
    }
  }

  int(): number {
    this.need(4, "int");
    const value = this.buffer.readInt32BE(this.offset);
    this.offset += 4;
    return value;
  }

  uint(): number {
    this.need(4, "unsigned int");
    const value = this.buffer.readUInt32BE(this.offset);
    this.offset += 4;
    return value;
  }

  bool(): boolean {
    const word = this.uint();
    if (word > 1) throw new XdrError(`bool must be 0 or 1, got ${word}`);
    return word === 1;
  }

  hyper(): bigint {
    this.need(8, "hyper");
    const value = this.buffer.readBigInt64BE(this.offset);
    this.offset += 8;
    return value;
  }

  uhyper(): bigint {
    this.need(8, "unsigned hyper");
    const value = this.buffer.readBigUInt64BE(this.offset);
    this.offset += 8;
    return value;
  }

  double(): number {
    this.need(8, "double");
    const value = this.buffer.readDoubleBE(this.offset);
    this.offset += 8;
    return value;
  }

  fixedOpaque(length: number): Buffer {
    this.need(length + padding(length), "fixed opaque");
    const bytes = Buffer.from(this.buffer.subarray(this.offset, this.offset + length));
    this.offset += length + padding(length);
    return bytes;
  }

  opaque(maxLength = UINT32_MAX): Buffer {
    const length = this.uint();
    if (length > maxLength) {
      throw new XdrError(`opaque of ${length} bytes exceeds its limit of ${maxLength}`);
    }
    return this.fixedOpaque(length);
  }

  string(maxLength = UINT32_MAX): string {
    const length = this.uint();
    if (length > maxLength) {
      throw new XdrError(`string of ${length} bytes exceeds its limit of ${maxLength}`);
    }
    this.need(length + padding(length), "string");
    const value = this.buffer.toString("utf8", this.offset, this.offset + length);
    this.offset += length + padding(length);
    return value;
  }

  optional<T>(decode: (reader: this) => T): T | null {
    const present = this.uint();
    if (present > 1) throw new XdrError(`optional marker must be 0 or 1, got ${present}`);
    return present === 1 ? decode(this) : null;
  }

  array<T>(maxLength: number, decode: (reader: this) => T): T[] {
    const count = this.uint();
    if (count > maxLength) {
      throw new XdrError(`array of ${count} elements exceeds its limit of ${maxLength}`);
    }
    // Each element takes at least 4 bytes: a count larger than that is a lie we can reject early.
    if (count * 4 > this.remaining) {
      throw new XdrError(
        `array claims ${count} elements but only ${this.remaining} bytes are left`,
      );
    }
    const items: T[] = [];
    for (let i = 0; i < count; i++) items.push(decode(this));
    return items;
  }

  /** Call after decoding a whole message: trailing bytes mean the struct was misread. */
  expectEnd(what: string): void {
    if (this.remaining !== 0) {
      throw new XdrError(`${what}: ${this.remaining} unexpected trailing bytes`);
    }
  }
}

/** A 64-bit value as a Number, or an error if it does not fit exactly. */
export function toSafeNumber(value: bigint, what = "value"): number {
  if (value > BigInt(Number.MAX_SAFE_INTEGER) || value < BigInt(Number.MIN_SAFE_INTEGER)) {
    throw new XdrError(`${what} ${value} does not fit in a JavaScript number`);
  }
  return Number(value);
}
