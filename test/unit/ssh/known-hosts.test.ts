import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import {
  SshHostKeyError,
  entryMatchesHost,
  fingerprintOf,
  hashKnownHostsName,
  isNoCommonHostKeyType,
  bareHost,
  bracketedHost,
  hostAndPort,
  knownHostsName,
  parseKnownHosts,
  pinnedHostKeyAlgorithms,
  pinnedKeyTypes,
  verifyHostKey,
} from "../../../provider/ssh";

/** A syntactically valid public key blob of a given type (random key bytes). */
function blob(type: string): Buffer {
  const name = Buffer.from(type);
  const header = Buffer.alloc(4);
  header.writeUInt32BE(name.length);
  return Buffer.concat([header, name, randomBytes(32)]);
}
const line = (hosts: string, key: Buffer, marker = "") =>
  `${marker ? marker + " " : ""}${hosts} ${key.subarray(4, 4 + key.readUInt32BE(0)).toString()} ${key.toString("base64")}`;

describe("known_hosts", () => {
  const ed = blob("ssh-ed25519");
  const rsa = blob("ssh-rsa");
  const ecdsa = blob("ecdsa-sha2-nistp256");

  it("names hosts as OpenSSH does: bare on port 22, [host]:port otherwise", () => {
    assert.equal(knownHostsName("h", 22), "h");
    assert.equal(knownHostsName("h", 2222), "[h]:2222");
    for (const host of ["2001:DB8::10", "[2001:db8::10]", "2001:db8:0:0:0:0:0:10"]) {
      assert.equal(knownHostsName(host, 22), "2001:db8::10");
      assert.equal(knownHostsName(host, 2222), "[2001:db8::10]:2222");
    }
  });

  it("writes host and port the way URLs and OpenSSH do: IPv6 literals bracketed", () => {
    assert.equal(hostAndPort("kvm1.lan", 22), "kvm1.lan:22");
    assert.equal(hostAndPort("::1", 2222), "[::1]:2222");
    assert.equal(hostAndPort("[::1]", 2222), "[::1]:2222");
    assert.equal(bareHost("[fe80::1%eth0]"), "fe80::1%eth0");
    assert.equal(bracketedHost("2001:db8::10"), "[2001:db8::10]");
    assert.equal(bracketedHost("kvm1.lan"), "kvm1.lan");
  });

  it("parses markers, comments and several keys per host; skips malformed lines", () => {
    const entries = parseKnownHosts(
      [
        "# comment",
        "",
        line("a,b", ed),
        line("a", rsa),
        line("*", ecdsa, "@revoked"),
        line("ca", ed, "@cert-authority"),
        "broken-line-without-key",
        `a ssh-ed25519 ${rsa.toString("base64")}`, // type does not match the blob
        line("x", ed, "@unknown-marker"),
      ].join("\n"),
    );
    assert.deepEqual(
      entries.map((e) => [e.marker, e.patterns.join(","), e.keyType]),
      [
        [undefined, "a,b", "ssh-ed25519"],
        [undefined, "a", "ssh-rsa"],
        ["revoked", "*", "ecdsa-sha2-nistp256"],
        ["cert-authority", "ca", "ssh-ed25519"],
      ],
    );
  });

  it("matches hashed names, wildcards and negations", () => {
    const hashed = hashKnownHostsName("[10.0.0.1]:2222", randomBytes(20));
    const [entry] = parseKnownHosts(line(hashed, ed));
    assert.ok(entryMatchesHost(entry!, "[10.0.0.1]:2222"));
    assert.ok(!entryMatchesHost(entry!, "10.0.0.1"));
    const [wild] = parseKnownHosts(line("*.lab.example,!bad.lab.example,[h?]:22", ed));
    assert.ok(entryMatchesHost(wild!, "kvm1.lab.example"));
    assert.ok(!entryMatchesHost(wild!, "bad.lab.example"));
    assert.ok(entryMatchesHost(wild!, "[h1]:22"));
    assert.ok(!entryMatchesHost(wild!, "lab.example"));
  });

  it("verifies a pinned key, and tells mismatch, revoked and unknown apart", () => {
    const entries = parseKnownHosts(
      [line("[h]:2222", ed), line("[h]:2222", rsa), line("*", ecdsa, "@revoked")].join("\n"),
    );
    const ok = verifyHostKey(entries, "h", 2222, rsa);
    assert.ok(ok.ok);
    assert.equal(ok.fingerprint, fingerprintOf(rsa));
    const mismatch = verifyHostKey(entries, "h", 2222, blob("ssh-ed25519"));
    assert.ok(!mismatch.ok && mismatch.error.problem === "mismatch");
    assert.match(mismatch.ok ? "" : mismatch.error.message, /\[h\]:2222.*SHA256:/);
    const revoked = verifyHostKey(entries, "h", 2222, ecdsa);
    assert.ok(!revoked.ok && revoked.error.problem === "revoked");
    const unknown = verifyHostKey(entries, "h", 22, ed);
    assert.ok(
      !unknown.ok &&
        unknown.error instanceof SshHostKeyError &&
        unknown.error.problem === "unknown",
    );
  });

  it("a revoked key stays revoked even when a plain line pins it", () => {
    const entries = parseKnownHosts([line("h", ed), line("h", ed, "@revoked")].join("\n"));
    const verdict = verifyHostKey(entries, "h", 22, ed);
    assert.ok(!verdict.ok && verdict.error.problem === "revoked");
  });

  it("offers exactly the host-key algorithms pinned for the host", () => {
    const entries = parseKnownHosts(
      [
        line("[h]:2222", rsa),
        line("[h]:2222", ecdsa),
        line("other", ed),
        line("[h]:2222", ed, "@revoked"),
      ].join("\n"),
    );
    assert.deepEqual(pinnedHostKeyAlgorithms(entries, "h", 2222), [
      "rsa-sha2-512",
      "rsa-sha2-256",
      "ssh-rsa",
      "ecdsa-sha2-nistp256",
    ]);
    assert.equal(pinnedHostKeyAlgorithms(entries, "nobody", 22), undefined);
    assert.deepEqual(pinnedKeyTypes(entries, "h", 2222), ["ssh-rsa", "ecdsa-sha2-nistp256"]);
    assert.deepEqual(pinnedKeyTypes(entries, "nobody", 22), []);
  });

  it("a host offering none of the pinned key types is a host-key error that names the types and the fix", () => {
    assert.ok(isNoCommonHostKeyType(new Error("Handshake failed: no matching host key format")));
    assert.ok(!isNoCommonHostKeyType(new Error("Handshake failed: no matching C->S cipher")));
    const error = new SshHostKeyError("type-not-offered", "kvm1.lan", 2222, "", "", [
      "ssh-ed25519",
      "ssh-rsa",
    ]);
    assert.equal(
      error.message,
      "ssh host [kvm1.lan]:2222 offers no host key of a type known_hosts pins for it " +
        "(ssh-ed25519, ssh-rsa); if its host keys were replaced, confirm the new key with the host's " +
        "owner and replace its known_hosts line (ssh-keyscan -p 2222 kvm1.lan shows what it offers now)",
    );
  });

  it("matches host names case-insensitively, hashed ones too (ssh lowercases before hashing)", () => {
    const hashed = hashKnownHostsName("kvm1.lab.example", randomBytes(20));
    const entries = parseKnownHosts([line(hashed, ed), line("KVM2.lab.example", rsa)].join("\n"));
    assert.ok(verifyHostKey(entries, "KVM1.Lab.Example", 22, ed).ok);
    assert.ok(verifyHostKey(entries, "kvm2.LAB.example", 22, rsa).ok);
  });

  it("computes OpenSSH's SHA256 fingerprint format", () => {
    assert.match(fingerprintOf(ed), /^SHA256:[A-Za-z0-9+/]{43}$/);
  });
});
