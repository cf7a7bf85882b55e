/**
 * The SSH ciphers we offer, and what a link negotiated.
 *
 * ssh2 encrypts either in its optional native binding or, when that is
 * missing (no compiler at install time, a prebuilt image, and on Node 24/26
 * it fails to load: "Module did not self-register"), in JavaScript through
 * Node's crypto. Measured there per MiB sent (Node 26, 32 KiB SSH packets,
 * this project's 2-core lab machine with AES-NI and SHA-NI):
 * aes128-gcm@openssh.com 0.5–0.7 ms, aes128-ctr + hmac-sha2-256-etm
 * 1.2–1.3 ms (an HMAC per packet), chacha20-poly1305 slower still (two
 * cipher contexts and Poly1305 in WebAssembly per packet). So without the
 * binding AES-GCM goes first, CTR next, ChaCha20-Poly1305 last.
 *
 * We only reorder ssh2's own default list: we never offer a cipher it would
 * not (nothing weaker) and never drop one (a host that allows only CTR or
 * only ChaCha20-Poly1305 still connects). The server picks the first of our
 * list it allows, so its policy (sshd_config `Ciphers`) still decides what is
 * permitted. Host key algorithms are a separate list, pinned by known_hosts.
 */
import type { NegotiatedAlgorithms } from "ssh2";
import { ssh2File } from "./ssh2-parts";

export interface Ssh2CryptoFacts {
  /** ssh2's default cipher list, in its order (already filtered to what Node's OpenSSL has). */
  defaultCiphers: readonly string[];
  /** Whether ssh2's native crypto binding loaded. */
  nativeBinding: boolean;
}

/** The order in which ciphers cost the JavaScript fallback least, cheapest first. */
function jsFallbackRank(cipher: string): number {
  if (/gcm/.test(cipher)) return 0;
  if (/chacha20/.test(cipher)) return 2;
  return 1;
}

/**
 * The cipher list to offer: ssh2's defaults as they are when its binding
 * loaded (its order is tuned for the binding), else the same names with
 * AES-GCM first and ChaCha20-Poly1305 last, each group in ssh2's order.
 */
export function cipherOffer(facts: Ssh2CryptoFacts): string[] {
  const defaults = [...facts.defaultCiphers];
  if (facts.nativeBinding) return defaults;
  // Array.prototype.sort is stable, so ties keep ssh2's order.
  return defaults.sort((a, b) => jsFallbackRank(a) - jsFallbackRank(b));
}

let facts: Ssh2CryptoFacts | null | undefined;

/**
 * What ssh2 itself decided at load time, read from its modules; `null` when
 * this ssh2 does not expose it (then we leave its defaults alone).
 */
export function ssh2CryptoFacts(): Ssh2CryptoFacts | null {
  if (facts !== undefined) return facts;
  facts = null;
  try {
    const constants = ssh2File("./protocol/constants.js") as { DEFAULT_CIPHER?: unknown };
    const crypto = ssh2File("./protocol/crypto.js") as { bindingAvailable?: unknown };
    const list = constants.DEFAULT_CIPHER;
    if (
      Array.isArray(list) &&
      list.length > 0 &&
      list.every((name) => typeof name === "string") &&
      typeof crypto.bindingAvailable === "boolean"
    ) {
      facts = { defaultCiphers: list as string[], nativeBinding: crypto.bindingAvailable };
    }
  } catch {
    // Another ssh2 layout: keep its defaults.
  }
  return facts;
}

/** What an SSH link runs with (no keys, nothing secret). */
export interface SshLinkAlgorithms {
  kex: string;
  hostKey: string;
  /** Client to server: the direction an upload's bytes take. */
  cipher: string;
  /** "implicit" for AEAD ciphers (AES-GCM, ChaCha20-Poly1305), whose tag is the MAC. */
  mac: string;
  serverCipher: string;
  serverMac: string;
  /** Whether ssh2's native crypto binding did the encryption; null when unknown. */
  nativeBinding: boolean | null;
}

export function linkAlgorithms(
  negotiated: NegotiatedAlgorithms,
  nativeBinding: boolean | null,
): SshLinkAlgorithms {
  const mac = (name: string | undefined): string => (name ? name : "implicit");
  return {
    kex: negotiated.kex,
    hostKey: negotiated.serverHostKey,
    cipher: negotiated.cs.cipher,
    mac: mac(negotiated.cs.mac),
    serverCipher: negotiated.sc.cipher,
    serverMac: mac(negotiated.sc.mac),
    nativeBinding,
  };
}
