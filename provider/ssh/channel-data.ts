/**
 * Channel data for the forwarded libvirt socket, sealed by us instead of by
 * ssh2's per-packet JavaScript when ssh2 runs without its native binding.
 *
 * Why: an upload is 32 KiB SSH packets by the ten thousand (OpenSSH's channel
 * packet size). ssh2's JavaScript path builds each in a fresh Buffer, copies
 * it, encrypts it into another fresh Buffer and writes it in three socket
 * writes; that garbage (about twice the data) is what sets the uploading
 * process's peak memory (V8 frees Buffer memory only after ~64 MB of it piled
 * up) and much of its CPU. Here every packet is built in one reused buffer,
 * encrypted with Node's crypto (the same algorithms, keys and state ssh2
 * negotiated), a whole `write` leaves the socket in one writev, and each
 * ciphertext's memory is released as soon as the socket is done with it.
 *
 * How it stays correct: we take over only the channel's `_write` (the same
 * window and packet-size rules ssh2 applies) and, per packet, only while the
 * link is in the state we understand: no key exchange under way (then ssh2
 * must queue the packet), no compression, and a cipher object of a shape we
 * checked (AES-GCM, or AES-CTR with an HMAC). Sequence number and GCM nonce
 * live in ssh2's own cipher object and we advance them exactly as ssh2 does,
 * so ssh2's own packets (window adjusts, keepalives, a rekey) carry on from
 * where ours stopped. Anything else, including a future ssh2 whose internals
 * look different, goes through ssh2's own `channelData`: slower, never wrong.
 */
import { createCipheriv, createHmac, randomFillSync, type Hmac } from "node:crypto";
import type { Socket } from "node:net";
import type { Client, ClientChannel } from "ssh2";

const MESSAGE_CHANNEL_DATA = 94;
/** Length word, padding length, message number, recipient channel, data length. */
const PACKET_HEAD_BYTES = 4 + 1 + 1 + 4 + 4;
/** The largest padding a cipher here adds (a block of 16 plus the 4-byte minimum). */
const MAX_PADDING_BYTES = 16 + 4;

/**
 * Random padding drawn from a block filled at once: one CSPRNG call per
 * ~3000 packets instead of one per packet (that call was 7 % of the upload's
 * CPU). Every byte is used once, so the padding is as random as before.
 */
class PaddingBytes {
  private readonly block = Buffer.allocUnsafeSlow(64 * 1024);
  private used = this.block.length;

  copyTo(target: Buffer, offset: number, length: number): void {
    if (this.used + length > this.block.length) {
      randomFillSync(this.block);
      this.used = 0;
    }
    this.block.copy(target, offset, this.used, this.used + length);
    this.used += length;
  }
}

/** The parts of ssh2's Protocol object this module reads (ssh2 1.x). */
interface Ssh2Protocol {
  _kexinit: unknown;
  _queue: unknown;
  _cipher: unknown;
  _packetRW: { write: unknown };
  channelData(channel: number, data: Buffer): void;
}

interface Ssh2ChannelState {
  outgoing: { id: number; window: number; packetSize: number; state: string };
  _waitWindow: boolean;
  _chunk: Buffer | undefined;
  _chunkcb: ((error?: Error | null) => void) | undefined;
  _write: (data: Buffer, encoding: unknown, callback: (error?: Error | null) => void) => void;
}

/** ssh2's AESGCMCipherNative: key, nonce (fixed part + invocation counter) and sequence number. */
interface Ssh2GcmCipher {
  outSeqno: number;
  _encSSLName: string;
  _encKey: Buffer;
  _encIV: Buffer;
  _dead: boolean;
}

/** ssh2's GenericCipherNative: one long-lived stream cipher plus an HMAC key. */
interface Ssh2StreamCipher {
  outSeqno: number;
  _cipherInstance: { update(data: Uint8Array): Buffer };
  _encBlockLen: number;
  _macSSLName: string;
  _macKey: Buffer;
  _macActualLen: number;
  _macETM: boolean;
  _dead: boolean;
}

/** Seals one plaintext packet (length word through padding, in `packet`) and hands the pieces to `emit`. */
interface PacketSealer {
  /** Padding for a packet whose length word + padding-length byte + payload is `unpadded` bytes. */
  paddingFor(unpadded: number): number;
  seal(packet: Buffer, emit: (bytes: Buffer, ownsMemory: boolean) => void): void;
}

type CipherShape =
  { kind: "gcm"; cipher: Ssh2GcmCipher } | { kind: "stream"; cipher: Ssh2StreamCipher };

function isBuffer(value: unknown, length?: number): value is Buffer {
  return Buffer.isBuffer(value) && (length === undefined || value.length === length);
}

/** Recognises ssh2's JavaScript cipher objects by shape; null for anything else (its binding, ChaCha20, …). */
export function recognizeCipher(cipher: unknown, negotiatedCipher: string): CipherShape | null {
  if (typeof cipher !== "object" || cipher === null) return null;
  const c = cipher as Record<string, unknown>;
  if (c._dead !== false || typeof c.outSeqno !== "number") return null;
  const name = (cipher as object).constructor?.name;
  if (name === "AESGCMCipherNative") {
    const ssl = c._encSSLName;
    const keyBytes = ssl === "aes-128-gcm" ? 16 : ssl === "aes-256-gcm" ? 32 : 0;
    if (keyBytes === 0 || !/^aes(128|256)-gcm(@openssh\.com)?$/.test(negotiatedCipher)) return null;
    if (!isBuffer(c._encKey, keyBytes) || !isBuffer(c._encIV, 12)) return null;
    return { kind: "gcm", cipher: cipher as Ssh2GcmCipher };
  }
  if (name === "GenericCipherNative") {
    // Only CTR: a stream cipher whose state is all in the one instance ssh2 keeps.
    if (!/^aes(128|192|256)-ctr$/.test(negotiatedCipher)) return null;
    const instance = c._cipherInstance as { update?: unknown } | undefined;
    if (typeof instance?.update !== "function") return null;
    if (c._encBlockLen !== 16 || typeof c._macETM !== "boolean") return null;
    if (!["sha256", "sha512", "sha1"].includes(c._macSSLName as string)) return null;
    if (!isBuffer(c._macKey) || typeof c._macActualLen !== "number") return null;
    return { kind: "stream", cipher: cipher as Ssh2StreamCipher };
  }
  return null;
}

/** Adds one to the 64-bit invocation counter in the last 8 bytes of a GCM nonce (RFC 5647 §7.1). */
function incrementInvocationCounter(nonce: Buffer): void {
  for (let i = 11; i >= 4; i--) {
    nonce[i] = (nonce[i]! + 1) & 0xff;
    if (nonce[i] !== 0) return;
  }
}

function gcmSealer(cipher: Ssh2GcmCipher): PacketSealer {
  return {
    // The length word is not encrypted (it is the additional data), so the rest fills whole blocks.
    paddingFor: (unpadded) => {
      const padding = 16 - ((unpadded - 4) & 15);
      return padding < 4 ? padding + 16 : padding;
    },
    seal(packet, emit) {
      const gcm = createCipheriv(
        cipher._encSSLName as "aes-128-gcm",
        cipher._encKey,
        cipher._encIV,
      );
      const lengthWord = packet.subarray(0, 4);
      gcm.setAAD(lengthWord);
      const sealed = gcm.update(packet.subarray(4));
      gcm.final();
      emit(Buffer.from(lengthWord), false);
      emit(sealed, true);
      emit(gcm.getAuthTag(), false);
      incrementInvocationCounter(cipher._encIV);
      cipher.outSeqno = (cipher.outSeqno + 1) >>> 0;
    },
  };
}

function streamSealer(cipher: Ssh2StreamCipher): PacketSealer {
  const sequence = Buffer.alloc(4);
  /** The HMAC is set up before the cipher runs, so nothing that can throw comes after the keystream moved on. */
  const startMac = (): Hmac => {
    sequence.writeUInt32BE(cipher.outSeqno, 0);
    return createHmac(cipher._macSSLName, cipher._macKey).update(sequence);
  };
  const finishMac = (hmac: Hmac, ...parts: Uint8Array[]): Buffer => {
    for (const part of parts) hmac.update(part);
    const digest = hmac.digest();
    return digest.length > cipher._macActualLen ? digest.subarray(0, cipher._macActualLen) : digest;
  };
  const aad = cipher._macETM ? 4 : 0;
  return {
    paddingFor: (unpadded) => {
      const padding = 16 - ((unpadded - aad) & 15);
      return padding < 4 ? padding + 16 : padding;
    },
    seal(packet, emit) {
      if (cipher._macETM) {
        // Encrypt-then-MAC: the length word stays clear and the MAC covers the ciphertext.
        const lengthWord = Buffer.from(packet.subarray(0, 4));
        const hmac = startMac();
        const sealed = cipher._cipherInstance.update(packet.subarray(4));
        const tag = finishMac(hmac, lengthWord, sealed);
        emit(lengthWord, false);
        emit(sealed, true);
        emit(tag, false);
      } else {
        const tag = finishMac(startMac(), packet);
        emit(cipher._cipherInstance.update(packet), true);
        emit(tag, false);
      }
      cipher.outSeqno = (cipher.outSeqno + 1) >>> 0;
    },
  };
}

/** Whether detaching a Buffer's ArrayBuffer frees exactly that Buffer's memory and nothing else. */
function ownsWholeArrayBuffer(bytes: Buffer): boolean {
  const buffer = bytes.buffer as ArrayBuffer & { transfer?: unknown; detached?: boolean };
  return (
    bytes.byteOffset === 0 &&
    buffer.byteLength === bytes.length &&
    typeof buffer.transfer === "function" &&
    buffer.detached === false
  );
}

export interface ChannelDataWriter {
  /** Packets sealed here and packets handed to ssh2 (kex under way, unknown cipher); for tests and the bench. */
  readonly counts: { sealed: number; handedToSsh2: number };
}

/**
 * Takes over the channel's data writes when ssh2's internals have the shape
 * this module knows; returns null (and changes nothing) otherwise.
 * `negotiatedCipher` is told the client-to-server cipher name after every key
 * exchange (the cipher objects do not carry it).
 */
export function installChannelDataWriter(
  client: Client,
  socket: Socket,
  channel: ClientChannel,
  negotiatedCipher: () => string,
): ChannelDataWriter | null {
  const known = knownInternals(client, socket, channel);
  if (known === null) return null;
  const { protocol, state } = known;
  const counts = { sealed: 0, handedToSsh2: 0 };
  let packet = Buffer.alloc(0);
  const paddingBytes = new PaddingBytes();
  let sealerFor: unknown;
  /** Sealing failed once (see sendPacket): leave every later packet to ssh2. */
  let broken = false;
  let sealer: PacketSealer | null = null;
  /** Ciphertexts in the socket's queue, oldest first; each is freed once the socket wrote it. */
  const inFlight: Buffer[] = [];
  const written = (error?: Error | null): void => {
    const bytes = inFlight.shift();
    if (bytes && !error && ownsWholeArrayBuffer(bytes)) {
      (bytes.buffer as ArrayBuffer & { transfer(length: number): ArrayBuffer }).transfer(0);
    }
  };
  /** Set once a packet's first piece went to the socket: from then on a failure cannot be undone. */
  let emitted = false;
  const emit = (bytes: Buffer, ownsMemory: boolean): void => {
    emitted = true;
    if (ownsMemory) {
      inFlight.push(bytes);
      socket.write(bytes, written);
    } else {
      socket.write(bytes);
    }
  };

  /** The sealer for the link's current state, or null when this packet must go through ssh2. */
  const currentSealer = (): PacketSealer | null => {
    if (broken) return null;
    if (protocol._kexinit !== undefined || protocol._queue !== undefined) return null;
    if (!socket.writable) return null;
    const cipher = protocol._cipher;
    if (cipher !== sealerFor) {
      sealerFor = cipher;
      const writer = protocol._packetRW.write as object | undefined;
      // ssh2's PacketWriter is the uncompressed one (ZlibPacketWriter compresses).
      const shape =
        writer?.constructor?.name === "PacketWriter"
          ? recognizeCipher(cipher, negotiatedCipher())
          : null;
      sealer = !shape
        ? null
        : shape.kind === "gcm"
          ? gcmSealer(shape.cipher)
          : streamSealer(shape.cipher);
    }
    return sealer && (cipher as { _dead: boolean })._dead === false ? sealer : null;
  };

  const sendPacket = (id: number, data: Buffer, start: number, length: number): void => {
    const seal = currentSealer();
    if (!seal) {
      counts.handedToSsh2++;
      protocol.channelData(id, data.subarray(start, start + length));
      return;
    }
    const unpadded = PACKET_HEAD_BYTES + length;
    const padding = seal.paddingFor(unpadded);
    const total = unpadded + padding;
    if (packet.length < total)
      packet = Buffer.allocUnsafeSlow(
        Math.max(total, 32 * 1024 + PACKET_HEAD_BYTES + MAX_PADDING_BYTES),
      );
    const view = packet.subarray(0, total);
    view.writeUInt32BE(total - 4, 0);
    view[4] = padding;
    view[5] = MESSAGE_CHANNEL_DATA;
    view.writeUInt32BE(id, 6);
    view.writeUInt32BE(length, 10);
    data.copy(view, PACKET_HEAD_BYTES, start, start + length);
    paddingBytes.copyTo(view, unpadded, padding);
    emitted = false;
    try {
      seal.seal(view, emit);
    } catch (error) {
      // Node's crypto refused (nothing of the packet written, no state advanced): ssh2 seals from now on.
      if (emitted) throw error;
      sealerFor = undefined;
      sealer = null;
      broken = true;
      counts.handedToSsh2++;
      protocol.channelData(id, data.subarray(start, start + length));
      return;
    }
    counts.sealed++;
  };

  replaceChannelWrite(state, socket, sendPacket);
  return { counts };
}

/** ssh2's client and channel internals, when they have the shape this module knows; null otherwise. */
function knownInternals(
  client: Client,
  socket: Socket,
  channel: ClientChannel,
): { protocol: Ssh2Protocol; state: Ssh2ChannelState } | null {
  const internals = client as unknown as { _protocol?: Ssh2Protocol; _sock?: unknown };
  const protocol = internals._protocol;
  const state = channel as unknown as Ssh2ChannelState;
  if (
    !protocol ||
    internals._sock !== socket ||
    typeof protocol.channelData !== "function" ||
    typeof protocol._packetRW?.write !== "object" ||
    typeof state._write !== "function" ||
    typeof state.outgoing?.id !== "number" ||
    typeof state.outgoing.window !== "number" ||
    typeof state.outgoing.packetSize !== "number" ||
    !("_waitWindow" in state && "_chunk" in state && "_chunkcb" in state) ||
    typeof (ArrayBuffer.prototype as { transfer?: unknown }).transfer !== "function"
  ) {
    return null;
  }
  return { protocol, state };
}

/** Routes the channel's writes through `sendPacket` (ours), keeping ssh2's window bookkeeping. */
function replaceChannelWrite(
  state: Ssh2ChannelState,
  socket: Socket,
  sendPacket: (id: number, data: Buffer, start: number, length: number) => void,
): void {
  // The same contract as ssh2's Channel#_write: send what the window allows in packets of at most
  // packetSize, park the rest (and the callback) for ssh2's window-adjust handler, which calls _write again.
  state._write = (data, _encoding, callback) => {
    const outgoing = state.outgoing;
    if (outgoing.state !== "open") return;
    let window = outgoing.window;
    let offset = 0;
    socket.cork();
    try {
      while (offset < data.length && window > 0) {
        const length = Math.min(data.length - offset, window, outgoing.packetSize);
        sendPacket(outgoing.id, data, offset, length);
        offset += length;
        window -= length;
      }
    } finally {
      outgoing.window = window;
      socket.uncork();
    }
    if (offset < data.length) {
      if (window === 0) state._waitWindow = true;
      state._chunk = offset > 0 ? data.subarray(offset) : data;
      state._chunkcb = callback;
      return;
    }
    state._chunk = undefined;
    state._chunkcb = undefined;
    callback();
  };
}
