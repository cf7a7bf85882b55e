import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { inspect } from "node:util";
import fc from "fast-check";
import {
  NotFoundError,
  PermanentError,
  TransientError,
  errorClassOf,
  withContext,
} from "../../provider/common/errors";
import {
  createMark,
  ageSinceMs,
  MARK_TIME_EXAMPLE,
  markAgeMs,
  markFromFields,
  markFromText,
  markToFields,
  markToText,
  parseMarkTime,
  ownershipOf,
} from "../../provider/common/mark";
import {
  base32,
  deriveVmName,
  newVmName,
  vmNameProblem,
  vmNamePrefix,
} from "../../provider/common/names";
import {
  REDACTED,
  SecretValue,
  redactText,
  redactUrl,
  safeErrorMessage,
} from "../../provider/common/redact";
import { packageVersion } from "../../provider/common/version";
import { engineAddressOfThisProcess } from "../../provider/common/engine-log";

describe("error taxonomy", () => {
  it("prefixes the operation and resource and keeps the cause", () => {
    const cause = new Error("socket hang up");
    const error = new TransientError("connection lost", {
      operation: "create",
      resource: "domain vm-1",
      cause,
    });
    assert.equal(error.message, "create domain vm-1: connection lost");
    assert.equal(error.detail, "connection lost");
    assert.equal(error.cause, cause);
    assert.equal(errorClassOf(error), "Transient");
  });

  it("keeps the class when context is added, and never lets an unclassified error become retryable", () => {
    assert.equal(
      errorClassOf(withContext(new NotFoundError("gone"), { operation: "read" })),
      "NotFound",
    );
    assert.equal(
      errorClassOf(withContext(new TransientError("busy"), { operation: "read" })),
      "Transient",
    );
    assert.equal(
      errorClassOf(withContext(new Error("what is this"), { operation: "read" })),
      "Permanent",
    );
    assert.equal(errorClassOf(withContext("a string", {})), "Permanent");
    assert.equal(errorClassOf(new Error("plain")), undefined);
    assert.ok(new PermanentError("x") instanceof Error);
  });
});

describe("VM names", () => {
  it("are DNS labels of at most 63 characters for any resource name (property)", () => {
    fc.assert(
      fc.property(
        fc.string({ maxLength: 200 }),
        fc.uint8Array({ minLength: 1, maxLength: 32 }),
        (resource, entropy) => {
          const name = deriveVmName(resource, entropy);
          assert.equal(vmNameProblem(name), undefined, name);
        },
      ),
      { numRuns: 500 },
    );
  });

  it("are deterministic for the same entropy and differ for fresh ones", () => {
    const entropy = Buffer.from("seed");
    assert.equal(deriveVmName("My Proxy", entropy), deriveVmName("My Proxy", entropy));
    assert.match(deriveVmName("My Proxy", entropy), /^my-proxy-[a-z2-7]{10}$/);
    const fresh = new Set(Array.from({ length: 1000 }, () => newVmName("p")));
    assert.equal(fresh.size, 1000);
  });

  it("fall back to a readable prefix when the resource name has no usable character", () => {
    assert.equal(vmNamePrefix("___"), "proxy");
    assert.equal(vmNamePrefix("x".repeat(100)).length, 52);
  });

  it("encode base32 as RFC 4648 does (lower case, no padding)", () => {
    assert.equal(base32(Buffer.from("foobar")), "mzxw6ytboi");
    assert.equal(base32(Buffer.from("f")), "my");
  });

  it("explain what is wrong with a user-chosen name", () => {
    assert.match(vmNameProblem("Proxy_1")!, /DNS label/);
    assert.match(vmNameProblem("a".repeat(64))!, /at most 63/);
    assert.match(vmNameProblem("")!, /empty/);
    assert.equal(vmNameProblem("proxy-1"), undefined);
  });
});

describe("ownership mark", () => {
  const owner = { project: "crawl", stack: "prod", resource: "proxy-0" };
  const mark = createMark(owner, new Date("2026-11-01T10:00:00Z"));

  it("round-trips through fields and through description text with other text around it", () => {
    assert.deepEqual(markFromFields(markToFields(mark)), { kind: "marked", mark });
    const description = `Managed by the crawl team\n\n${markToText(mark)}\n`;
    assert.deepEqual(markFromText(description), { kind: "marked", mark });
  });

  it("carries creation fields after the frozen ones, and a mark written before them still parses", () => {
    const creation = { templateVmid: "9000", vmidRange: "20000-29999", diskStorage: "a b=c" };
    const withCreation = createMark(owner, new Date("2026-11-01T10:00:00Z"), creation);
    assert.deepEqual(withCreation.creation, creation);
    const text = markToText(withCreation);
    // The frozen block comes first, unchanged: older readers stop at what they know.
    assert.ok(text.startsWith(markToText(mark)), text);
    assert.deepEqual(markFromText(`note\n${text}\n\nmore`), { kind: "marked", mark: withCreation });
    assert.deepEqual(markFromFields(markToFields(withCreation)), {
      kind: "marked",
      mark: withCreation,
    });
    // The old form (this test's `mark`, and the frozen-api fixture) has no creation at all.
    const old = markFromText(markToText(mark));
    assert.equal(old.kind === "marked" && "creation" in old.mark, false);
    // A creation field can neither overwrite a frozen field nor break the text form.
    assert.throws(() => createMark(owner, new Date(), { stack: "other" }), /creation field/);
    assert.throws(() => createMark(owner, new Date(), { "a-b": "x" }), /creation field/);
  });

  it("cannot be forged through a resource name with newlines or '='", () => {
    const tricky = createMark(
      { ...owner, resource: "x\nstack=other\n[egress-proxies]" },
      new Date(0),
    );
    const reading = markFromText(markToText(tricky));
    assert.equal(reading.kind, "marked");
    assert.equal(reading.kind === "marked" && reading.mark.owner.stack, "prod");
  });

  it("tells ours, foreign, unmarked and corrupt apart", () => {
    assert.equal(
      ownershipOf({ kind: "marked", mark }, { project: "crawl", stack: "prod" }),
      "ours",
    );
    assert.equal(
      ownershipOf({ kind: "marked", mark }, { project: "crawl", stack: "dev" }),
      "foreign",
    );
    assert.equal(ownershipOf(markFromText("just a VM"), owner), "unmarked");
    assert.equal(ownershipOf(markFromText("[egress-proxies]\nmanaged=yes"), owner), "corrupt");
    assert.equal(
      ownershipOf(
        markFromFields({
          managed: "true",
          project: "p",
          stack: "s",
          resource: "r",
          createdAt: "soon",
        }),
        owner,
      ),
      "corrupt",
    );
  });

  it("has no age when the creation time is in the future or unreadable", () => {
    const now = new Date("2026-11-01T11:00:00Z");
    assert.equal(markAgeMs(mark, now), 3_600_000);
    assert.equal(markAgeMs({ ...mark, createdAt: "2027-01-01T00:00:00Z" }, now), undefined);
    assert.equal(markAgeMs({ ...mark, createdAt: "garbage" }, now), undefined);
  });

  it("reads a creation time only in the form it writes: Date.parse's guesses give no age", () => {
    const now = new Date("2026-11-01T11:00:00.000Z");
    assert.equal(parseMarkTime(mark.createdAt), Date.parse("2026-11-01T10:00:00Z"));
    assert.equal(parseMarkTime(MARK_TIME_EXAMPLE), Date.UTC(2026, 0, 31, 12));
    for (const unreadable of [
      "1", // Date.parse: 2001-01-01
      "2001",
      "12/31/2020",
      "Sun, 01 Nov 2026 10:00:00 GMT",
      "2026-11-01",
      "2026-11-01T10:00:00Z", // no milliseconds
      "2026-11-01T10:00:00.000+01:00",
      "2026-11-01 10:00:00.000Z",
      "2026-11-01t10:00:00.000z",
      "2026-02-30T10:00:00.000Z", // Date.parse: March 2nd
      "2026-11-01T24:00:00.000Z",
      "+002026-11-01T10:00:00.000Z",
      " 2026-11-01T10:00:00.000Z",
      "",
    ]) {
      assert.equal(parseMarkTime(unreadable), undefined, unreadable);
      assert.equal(markAgeMs({ ...mark, createdAt: unreadable }, now), undefined, unreadable);
    }
    assert.equal(ageSinceMs(undefined, now), undefined);
    assert.equal(ageSinceMs(mark.createdAt, now), 3_600_000);
  });

  it("records the package version, which matches package.json", () => {
    const pkg = JSON.parse(readFileSync(join(__dirname, "../../../package.json"), "utf8"));
    assert.equal(packageVersion, pkg.version);
    assert.equal(mark.packageVersion, pkg.version);
  });
});

describe("redaction", () => {
  it("removes URL userinfo and keeps the rest", () => {
    assert.equal(
      redactUrl("https://user:hunter22@images.example/debian.qcow2?x=1"),
      `https://${REDACTED}@images.example/debian.qcow2?x=1`,
    );
    assert.equal(
      redactUrl("https://images.example/debian.qcow2"),
      "https://images.example/debian.qcow2",
    );
    assert.equal(redactText("fetch http://u:p@h/x failed"), `fetch http://${REDACTED}@h/x failed`);
  });

  it("removes known secrets, PEM keys, PVE tokens and authorization headers", () => {
    const key =
      "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----";
    const text = `key ${key} token PVEAPIToken=root@pam!ci=1234-abcd Authorization: Bearer xyz.abc password s3cr3t-pass`;
    const out = redactText(text, ["s3cr3t-pass"]);
    for (const leaked of ["b3BlbnNzaC1rZXktdjEAAAAA", "1234-abcd", "xyz.abc", "s3cr3t-pass"])
      assert.ok(!out.includes(leaked), out);
    assert.ok(out.includes("PVEAPIToken=[redacted]"));
  });

  it("keeps a SecretValue out of String, JSON and inspect", () => {
    const secret = new SecretValue("hunter22");
    assert.equal(String(secret), REDACTED);
    assert.equal(JSON.stringify({ secret }), `{"secret":"${REDACTED}"}`);
    assert.ok(!inspect({ secret }).includes("hunter22"));
    assert.equal(secret.reveal(), "hunter22");
  });

  it("makes error messages safe to show", () => {
    assert.equal(
      safeErrorMessage(new Error("login as admin:pw1234 failed"), ["pw1234"]),
      `login as admin:${REDACTED} failed`,
    );
  });
});

describe("engine log", () => {
  it("finds the engine address only in Pulumi's dynamic-provider process", () => {
    assert.equal(
      engineAddressOfThisProcess([
        "node",
        "/p/node_modules/@pulumi/pulumi/cmd/dynamic-provider",
        "127.0.0.1:41235",
      ]),
      "127.0.0.1:41235",
    );
    assert.equal(
      engineAddressOfThisProcess([
        "node",
        "/p/node_modules/@pulumi/pulumi/cmd/dynamic-provider/index.js",
        "127.0.0.1:9",
      ]),
      "127.0.0.1:9",
    );
    assert.equal(engineAddressOfThisProcess(["node", "/usr/bin/mocha", "127.0.0.1:9"]), undefined);
    assert.equal(
      engineAddressOfThisProcess(["node", "/x/cmd/dynamic-provider", "--flag"]),
      undefined,
    );
  });
});
