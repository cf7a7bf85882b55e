/**
 * SHA-512-crypt (`$6$`, Ulrich Drepper's "Unix crypt using SHA-256 and
 * SHA-512"), the hash glibc's crypt(3) checks and squid's basic_ncsa_auth
 * accepts. The pool puts only this hash on the VM and in state: the password
 * itself never leaves the secret it came in.
 */
import { createHash, createHmac } from "node:crypto";

const CRYPT_ALPHABET = "./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const DEFAULT_ROUNDS = 5000;
const MAX_SALT_LENGTH = 16;

/** The order in which the final digest's bytes are written, three at a time (the spec's table). */
const BYTE_TRIPLES: ReadonlyArray<[number, number, number]> = [
  [0, 21, 42],
  [22, 43, 1],
  [44, 2, 23],
  [3, 24, 45],
  [25, 46, 4],
  [47, 5, 26],
  [6, 27, 48],
  [28, 49, 7],
  [50, 8, 29],
  [9, 30, 51],
  [31, 52, 10],
  [53, 11, 32],
  [12, 33, 54],
  [34, 55, 13],
  [56, 14, 35],
  [15, 36, 57],
  [37, 58, 16],
  [59, 17, 38],
  [18, 39, 60],
  [40, 61, 19],
  [62, 20, 41],
];

const sha512 = (...parts: Buffer[]): Buffer => {
  const hash = createHash("sha512");
  for (const part of parts) hash.update(part);
  return hash.digest();
};

/** `length` bytes of `block` repeated (the spec's "sequence P" and "sequence S"). */
const repeatTo = (block: Buffer, length: number): Buffer => {
  const out = Buffer.alloc(length);
  for (let offset = 0; offset < length; offset += block.length) block.copy(out, offset);
  return out;
};

function encode24(b2: number, b1: number, b0: number, characters: number): string {
  let word = (b2 << 16) | (b1 << 8) | b0;
  let out = "";
  for (let i = 0; i < characters; i++) {
    out += CRYPT_ALPHABET[word & 0x3f];
    word >>>= 6;
  }
  return out;
}

/** `$6$<salt>$<hash>` for `password`; `salt` uses the crypt alphabet, at most 16 characters. */
export function sha512Crypt(password: string, salt: string): string {
  if (
    salt.length === 0 ||
    salt.length > MAX_SALT_LENGTH ||
    ![...salt].every((c) => CRYPT_ALPHABET.includes(c))
  )
    throw new Error("sha512Crypt: the salt must be 1-16 characters of [./0-9A-Za-z]");
  const key = Buffer.from(password, "utf8");
  const saltBytes = Buffer.from(salt, "ascii");

  const alternate = sha512(key, saltBytes, key);
  const first = createHash("sha512").update(key).update(saltBytes);
  first.update(repeatTo(alternate, key.length));
  for (let bits = key.length; bits > 0; bits >>= 1) first.update(bits & 1 ? alternate : key);
  let digest = first.digest();

  const keySequence = repeatTo(sha512(...Array<Buffer>(key.length).fill(key)), key.length);
  const saltSequence = repeatTo(
    sha512(...Array<Buffer>(16 + digest[0]).fill(saltBytes)),
    saltBytes.length,
  );

  for (let round = 0; round < DEFAULT_ROUNDS; round++) {
    const step = createHash("sha512");
    step.update(round % 2 === 1 ? keySequence : digest);
    if (round % 3 !== 0) step.update(saltSequence);
    if (round % 7 !== 0) step.update(keySequence);
    step.update(round % 2 === 1 ? digest : keySequence);
    digest = step.digest();
  }

  let encoded = "";
  for (const [b2, b1, b0] of BYTE_TRIPLES)
    encoded += encode24(digest[b2], digest[b1], digest[b0], 4);
  encoded += encode24(0, 0, digest[63], 2);
  return `$6$${salt}$${encoded}`;
}

/**
 * A salt derived from the credentials, not drawn at random: the same user and
 * password give the same cloud-init document on every `pulumi up`, so an
 * unchanged password never looks like a change that replaces every VM.
 */
function deterministicSalt(user: string, password: string): string {
  const digest = createHmac("sha256", password)
    .update(`egress-proxies basic-auth ${user}`)
    .digest();
  let salt = "";
  for (let i = 0; i < MAX_SALT_LENGTH; i++) salt += CRYPT_ALPHABET[digest[i] & 0x3f];
  return salt;
}

/** The htpasswd line squid's basic_ncsa_auth reads. */
export function htpasswdLine(user: string, password: string): string {
  return `${user}:${sha512Crypt(password, deterministicSalt(user, password))}`;
}
