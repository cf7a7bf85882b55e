import { strict as assert } from "node:assert";
import { createHash } from "node:crypto";
import { gzipSync } from "node:zlib";
import { PermanentError } from "../../provider/common/errors";
import { buildMultipart, buildNoCloudSeed, sniffPayload } from "../../provider/nocloud";

describe("NoCloud seed builder", () => {
  it("gives the same seed (and sha256) for the same inputs, a different one when user-data changes", () => {
    const a = buildNoCloudSeed({ vmName: "proxy-1", userData: "#cloud-config\n" });
    const b = buildNoCloudSeed({ vmName: "proxy-1", userData: Buffer.from("#cloud-config\n") });
    const c = buildNoCloudSeed({ vmName: "proxy-1", userData: "#cloud-config\n " });
    assert.equal(a.sha256, b.sha256);
    assert.notEqual(a.sha256, c.sha256);
    assert.match(a.sha256, /^[0-9a-f]{64}$/);
    assert.equal(a.image.size, a.image.toBuffer().length);
    // seedSha256 is an output: it must stay the sha256 of the ISO's bytes however it is computed.
    assert.equal(a.sha256, createHash("sha256").update(a.image.toBuffer()).digest("hex"));
  });

  it("refuses a VM name that is not a DNS label, naming the field", () => {
    assert.throws(
      () => buildNoCloudSeed({ vmName: "Proxy 1" }),
      (error: unknown) =>
        error instanceof PermanentError &&
        /^vmName "Proxy 1" must be a DNS label/.test(error.message),
    );
  });

  it("always writes user-data and meta-data, as NoCloud requires both", () => {
    const seed = buildNoCloudSeed({ vmName: "proxy-2", installGuestAgent: false });
    assert.deepEqual([...seed.files.keys()].sort(), ["meta-data", "user-data"]);
    assert.equal(seed.files.get("user-data")!.length, 0);
  });

  it("picks a multipart boundary that no part contains", () => {
    const first = buildMultipart([{ payload: Buffer.from("#!/bin/sh\n"), filename: "a" }]);
    const boundary = /boundary="([^"]+)"/.exec(first.toString())![1];
    const hostile = Buffer.from(`#!/bin/sh\necho --${boundary}\n`);
    const second = buildMultipart([{ payload: hostile, filename: "a" }]);
    const secondBoundary = /boundary="([^"]+)"/.exec(second.toString())![1];
    assert.ok(!hostile.includes(secondBoundary));
  });

  it("writes a gzip part decompressed, typed by its text, base64 when it is not ASCII", () => {
    const text = "#cloud-config\nbootcmd: [echo 'Grüße']\n";
    const message = buildMultipart([
      { payload: Buffer.from("#!/bin/sh\n"), filename: "agent" },
      { payload: gzipSync(Buffer.from(text)), filename: "vendor-data" },
    ]).toString("latin1");
    const part = message.split(/\n--=*egress-proxies-[0-9a-f]+=*\n?/)[2]!;
    const [headers, body] = part.split("\n\n");
    assert.match(
      headers!,
      /^Content-Type: text\/cloud-config\nContent-Transfer-Encoding: base64\n/,
    );
    assert.equal(Buffer.from(body!, "base64").toString("utf8"), text);
    assert.ok(!message.includes("application/gzip"));
  });

  it("keeps a part that only looks like gzip as given, typed application/gzip", () => {
    const corrupt = Buffer.from([0x1f, 0x8b, 0x08, 0x00, 0x01, 0x02]);
    const message = buildMultipart([{ payload: corrupt, filename: "vendor-data" }]);
    assert.match(message.toString("latin1"), /Content-Type: application\/gzip\n/);
    assert.ok(message.toString("latin1").includes(corrupt.toString("base64")));
  });

  it("sniffs part types with cloud-init's prefixes, longest first", () => {
    const typeOf = (text: string) => sniffPayload(Buffer.from(text));
    assert.deepEqual(typeOf("#cloud-config-archive\n"), {
      kind: "typed",
      contentType: "text/cloud-config-archive",
    });
    assert.deepEqual(typeOf("#include-once\n"), {
      kind: "typed",
      contentType: "text/x-include-once-url",
    });
    assert.deepEqual(typeOf("## template: jinja\n"), { kind: "typed", contentType: "text/jinja2" });
    assert.deepEqual(typeOf("MIME-Version: 1.0\nContent-Type: multipart/mixed\n"), {
      kind: "mime",
    });
    assert.deepEqual(sniffPayload(Buffer.from([0x1f, 0x8b, 8])), {
      kind: "typed",
      contentType: "application/gzip",
    });
    assert.deepEqual(typeOf("hello"), { kind: "typed", contentType: "text/plain" });
  });
});
