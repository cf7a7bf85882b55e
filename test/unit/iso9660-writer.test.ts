import { strict as assert } from "node:assert";
import { createHash } from "node:crypto";
import { buildIsoImage, IsoWriterError, MAX_DEPTH } from "../../provider/iso9660-writer";

const seedFiles = [
  { path: "user-data", content: "#cloud-config\n" },
  { path: "meta-data", content: "instance-id: a\n" },
];

async function streamToBuffer(stream: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

describe("iso9660-writer", () => {
  it("gives byte-identical images for identical inputs, whatever the input order", () => {
    const a = buildIsoImage({ volumeId: "cidata", files: seedFiles }).toBuffer();
    const b = buildIsoImage({ volumeId: "cidata", files: [...seedFiles].reverse() }).toBuffer();
    assert.ok(a.equals(b));
  });

  it("changes the image when the caller's timestamp changes, and only then", () => {
    const at = (iso: string) =>
      createHash("sha256")
        .update(
          buildIsoImage({
            volumeId: "cidata",
            files: seedFiles,
            timestamp: new Date(iso),
          }).toBuffer(),
        )
        .digest("hex");
    assert.equal(at("2026-01-01T00:00:00Z"), at("2026-01-01T00:00:00Z"));
    assert.notEqual(at("2026-01-01T00:00:00Z"), at("2026-01-02T00:00:00Z"));
  });

  it("announces its exact size before producing bytes, and the stream equals the buffer", async () => {
    const image = buildIsoImage({
      volumeId: "cidata",
      files: [
        ...seedFiles,
        { path: "big", content: Buffer.alloc(3 * 1024 * 1024 + 7, 0x5a) },
        { path: "e", content: "" },
      ],
    });
    assert.equal(image.size % 2048, 0);
    const fromStream = await streamToBuffer(image.toStream());
    assert.equal(fromStream.length, image.size);
    assert.ok(fromStream.equals(image.toBuffer()));
  });

  it("gives the same bytes through chunks(), zeros in the system area and every sector's padding", () => {
    const files = [...seedFiles, { path: "odd", content: Buffer.alloc(2048 + 5, 0x5a) }];
    // Leave freed, non-zero memory behind, where an unzeroed allocation could land.
    for (let i = 0; i < 50; i++) Buffer.allocUnsafe(256 * 1024).fill(0xff);
    const image = buildIsoImage({ volumeId: "cidata", files });
    const buffer = image.toBuffer();
    assert.ok(Buffer.concat([...image.chunks()]).equals(buffer));
    assert.ok(buffer.subarray(0, 16 * 2048).equals(Buffer.alloc(16 * 2048)));
    const odd = buffer.indexOf(Buffer.alloc(2048 + 5, 0x5a));
    assert.ok(odd > 0 && odd % 2048 === 0);
    const padding = buffer.subarray(odd + 2048 + 5, odd + 2 * 2048);
    assert.ok(padding.equals(Buffer.alloc(2048 - 5)));
  });

  it("writes the volume label into both descriptors", () => {
    const buffer = buildIsoImage({ volumeId: "cidata", files: seedFiles }).toBuffer();
    assert.equal(buffer.subarray(16 * 2048 + 1, 16 * 2048 + 6).toString("ascii"), "CD001");
    assert.equal(buffer.subarray(16 * 2048 + 40, 16 * 2048 + 46).toString("ascii"), "cidata");
    assert.equal(
      buffer
        .subarray(17 * 2048 + 40, 17 * 2048 + 52)
        .swap16()
        .toString("utf16le"),
      "cidata",
    );
  });

  const refusals: Array<[string, Parameters<typeof buildIsoImage>[0], RegExp]> = [
    [
      "a duplicate path",
      { files: [seedFiles[0], seedFiles[0]] },
      /files\[1\]\.path: "user-data" appears twice/,
    ],
    [
      "a file that is also a directory",
      {
        files: [
          { path: "a", content: "" },
          { path: "a/b", content: "" },
        ],
      },
      /"a" is a file/,
    ],
    [
      "an empty component",
      { files: [{ path: "a//b", content: "" }] },
      /empty, "\." or "\.\." component/,
    ],
    ["a '..' component", { files: [{ path: "../etc/passwd", content: "" }] }, /"\.\." component/],
    [
      "a name Joliet cannot hold",
      { files: [{ path: "what?", content: "" }] },
      /one of \* \/ : ; \? \\/,
    ],
    [
      "a name longer than 64 characters",
      { files: [{ path: "x".repeat(65), content: "" }] },
      /Joliet allows 64/,
    ],
    [
      "a UTF-8 name over 135 bytes",
      { files: [{ path: "語".repeat(46), content: "" }] },
      /138 bytes in UTF-8/,
    ],
    [
      "a character outside the BMP",
      { files: [{ path: "emoji-😀", content: "" }] },
      /outside the BMP/,
    ],
    [
      "a tree deeper than ISO 9660 allows",
      { files: [{ path: "a/".repeat(MAX_DEPTH) + "f", content: "" }] },
      /allows 8 levels/,
    ],
    [
      "a bad volume label",
      { volumeId: "cidata volume!", files: seedFiles },
      /volumeId .* must be 1-16 characters/,
    ],
    [
      "an invalid timestamp",
      { files: seedFiles, timestamp: new Date("nope") },
      /timestamp must be a valid Date/,
    ],
    [
      "bad permission bits",
      { files: [{ path: "f", content: "", mode: 0o17777 }] },
      /files\[0\]\.mode/,
    ],
  ];
  for (const [what, spec, message] of refusals) {
    it(`refuses ${what} with an error naming the field`, () => {
      assert.throws(
        () => buildIsoImage(spec),
        (error: unknown) => error instanceof IsoWriterError && message.test(error.message),
      );
    });
  }
});
