/**
 * SSH key pairs for tests that run ssh2's own server and our client.
 *
 * ssh2 1.17's `utils.generateKeyPairSync("ed25519")` now and then writes an
 * OpenSSH private key its own `parseKey` refuses ("Malformed OpenSSH private
 * key": 22 of 5000 here): the key's 32 bytes lost a leading zero byte, and
 * ssh-keygen refuses that file too, so keys users make are not affected. A
 * test that got one failed as "not an OpenSSH or PEM private key", which
 * looked like a flake under load. Here a pair is kept only once ssh2 reads
 * both halves back.
 */
import { utils } from "ssh2";

type KeyType = "ed25519" | "ecdsa";

export function sshKeyPair(type: KeyType = "ed25519"): { private: string; public: string } {
  for (let attempt = 0; attempt < 20; attempt++) {
    const pair =
      type === "ecdsa"
        ? utils.generateKeyPairSync("ecdsa", { bits: 256 })
        : utils.generateKeyPairSync("ed25519");
    if (
      !(utils.parseKey(pair.private) instanceof Error) &&
      !(utils.parseKey(pair.public) instanceof Error)
    )
      return pair;
  }
  throw new Error(`ssh2 made no ${type} key pair it can read back in 20 attempts`);
}
