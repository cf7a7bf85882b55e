/**
 * iso9660-writer against the readers people and cloud-init actually use.
 * Every image is read by isoinfo (primary, Joliet and Rock Ridge trees),
 * xorriso, bsdtar, 7z and blkid; every file must come back byte for byte.
 */
import { strict as assert } from "node:assert";
import { randomBytes } from "node:crypto";
import fc from "fast-check";
import { buildIsoImage, type IsoFile } from "../../provider/iso9660-writer";
import {
  extractWith,
  listWithIsoinfo,
  readFileWithIsoinfo,
  run,
  scratchDir,
  writeImage,
  type ReaderName,
} from "../support/iso-tools";

const READERS: ReaderName[] = ["xorriso", "bsdtar", "7z"];

function expectedFiles(files: IsoFile[]): Map<string, Buffer> {
  return new Map(files.map((file) => [file.path, Buffer.from(file.content as Buffer | string)]));
}

function assertSameFiles(
  actual: Map<string, Buffer>,
  expected: Map<string, Buffer>,
  reader: string,
): void {
  assert.deepEqual(
    [...actual.keys()].sort(),
    [...expected.keys()].sort(),
    `${reader}: file names differ`,
  );
  for (const [path, content] of expected)
    assert.ok(
      actual.get(path)!.equals(content),
      `${reader}: ${path} differs (${actual.get(path)!.length} vs ${content.length} bytes)`,
    );
}

/** Reads one image every way we know and checks it against the input. */
function verifyWithAllReaders(
  files: IsoFile[],
  options: { latin1Only: boolean; directories?: string[] },
): void {
  const scratch = scratchDir("iso-readers");
  try {
    const iso = writeImage(
      scratch.dir,
      buildIsoImage({ volumeId: "cidata", files, directories: options.directories }).toBuffer(),
    );
    const expected = expectedFiles(files);
    for (const reader of READERS) {
      const into = `${scratch.dir}/${reader}`;
      run("mkdir", ["-p", into]);
      assertSameFiles(extractWith(reader, iso, into), expected, reader);
    }
    const sizes = (entries: ReturnType<typeof listWithIsoinfo>): Map<string, number> =>
      new Map(
        entries.filter((entry) => !entry.isDirectory).map((entry) => [entry.path, entry.size]),
      );
    const expectedSizes = new Map([...expected].map(([path, content]) => [path, content.length]));
    assert.deepEqual(sizes(listWithIsoinfo(iso, "-R")), expectedSizes, "isoinfo -R listing");
    if (options.latin1Only)
      assert.deepEqual(sizes(listWithIsoinfo(iso, "-J")), expectedSizes, "isoinfo -J listing");
    const primary = listWithIsoinfo(iso, "").filter((entry) => !entry.isDirectory);
    assert.equal(primary.length, files.length, "isoinfo -l (primary tree) lists every file once");
    assert.ok(
      primary.every((entry) => /^[A-Z0-9_/]+\.[A-Z0-9_]{0,3};1$/.test(entry.path)),
      "primary names are level-1 8.3",
    );
    for (const file of files)
      assert.ok(
        readFileWithIsoinfo(iso, file.path).equals(expected.get(file.path)!),
        `isoinfo -x ${file.path}`,
      );
  } finally {
    scratch.remove();
  }
}

describe("iso9660-writer read back by real ISO readers", function () {
  this.timeout(120_000);

  it("gives every reader a NoCloud seed's files byte for byte, names exactly as given", () => {
    verifyWithAllReaders(
      [
        { path: "user-data", content: "#cloud-config\npackages: [squid]\n" },
        { path: "meta-data", content: "instance-id: proxy-abc\nlocal-hostname: proxy-abc\n" },
        { path: "vendor-data", content: "#!/bin/sh\necho agent\n" },
        { path: "network-config", content: "version: 2\nethernets: {}\n" },
      ],
      { latin1Only: true },
    );
  });

  it("handles subdirectories, empty files and a file of several MiB", () => {
    verifyWithAllReaders(
      [
        { path: "openstack/latest/meta_data.json", content: '{"uuid":"x"}' },
        { path: "openstack/latest/empty-file", content: "" },
        { path: "empty", content: "" },
        { path: "big/blob.bin", content: randomBytes(5 * 1024 * 1024 + 123) },
      ],
      { latin1Only: true, directories: ["an/empty/dir"] },
    );
  });

  it("keeps names outside Latin-1, up to the longest UTF-8 name a Rock Ridge record holds", () => {
    verifyWithAllReaders(
      [
        { path: "données €uro/日本語-ファイル.txt", content: "unicode" },
        { path: "é".repeat(64), content: "two-byte name" },
        { path: "語".repeat(45), content: "three-byte name of exactly 135 bytes" },
        { path: "a.b.c.tar.gz", content: "dots" },
        { path: "UPPER-lower", content: "case" },
        { path: "upper-LOWER", content: "case collides in 8.3" },
      ],
      { latin1Only: false },
    );
  });

  it("labels the volume so blkid (and so cloud-init's NoCloud lookup) finds 'cidata'", () => {
    const scratch = scratchDir("iso-label");
    try {
      const iso = writeImage(
        scratch.dir,
        buildIsoImage({
          volumeId: "cidata",
          files: [{ path: "meta-data", content: "" }],
        }).toBuffer(),
      );
      assert.equal(
        run("blkid", ["-p", "-o", "value", "-s", "LABEL", iso]).toString().trim(),
        "cidata",
      );
      assert.equal(
        run("blkid", ["-p", "-o", "value", "-s", "TYPE", iso]).toString().trim(),
        "iso9660",
      );
      assert.match(
        run("isoinfo", ["-d", "-i", iso]).toString(),
        /Volume id: cidata\n[\s\S]*Joliet with UCS level 3 found[\s\S]*Rock Ridge signatures version 1 found/,
      );
    } finally {
      scratch.remove();
    }
  });

  it("round-trips random file sets through every reader (property)", () => {
    const latin1Letter = fc.constantFrom(
      ..."abcdefghijklmnopqrstuvwxyzABCXYZ0123456789-_.~+=, éüñßÅ".split(""),
    );
    const name = fc
      .array(latin1Letter, { minLength: 1, maxLength: 64 })
      .map((chars) => chars.join(""))
      .filter((n) => n !== "." && n !== ".." && n.trim() === n && !n.endsWith("."));
    const path = fc.array(name, { minLength: 1, maxLength: 4 }).map((parts) => parts.join("/"));
    const content = fc.oneof(
      fc.constant(Buffer.alloc(0)),
      fc.uint8Array({ maxLength: 5000 }).map((bytes) => Buffer.from(bytes)),
      fc.integer({ min: 2040, max: 2060 }).map((size) => randomBytes(size)),
    );
    const fileSet = fc
      .uniqueArray(fc.record({ path, content }), {
        minLength: 1,
        maxLength: 12,
        selector: (file) => file.path.toLowerCase(),
      })
      .filter((files) => {
        // A path cannot be both a file and a directory.
        const paths = new Set(files.map((file) => file.path));
        return files.every(
          (file) =>
            !file.path
              .split("/")
              .some((_, i, parts) => i > 0 && paths.has(parts.slice(0, i).join("/"))),
        );
      });
    fc.assert(
      fc.property(fileSet, (files) => verifyWithAllReaders(files, { latin1Only: true })),
      { numRuns: 25, seed: Number(process.env.PROPERTY_SEED ?? 20261129) },
    );
  });
});
