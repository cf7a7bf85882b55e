import assert from "node:assert/strict";
import { errors as undiciErrors } from "undici";
import { NotFoundError, PermanentError, TransientError } from "../../../provider/common/errors";
import {
  classifyImageFetchError,
  classifyImageHttpStatus,
  classifyLibvirtError,
} from "../../../provider/kvm/classify";
import { ImageSourceRefusedError } from "../../../provider/kvm/image-source-policy";
import {
  ErrorCode,
  LibvirtAbortedError,
  LibvirtError,
  LibvirtStreamEndpointError,
  LibvirtTimeoutError,
  LibvirtTransportError,
} from "../../../provider/libvirt-rpc-xdr";
import {
  SshAuthError,
  SshConfigError,
  SshConnectError,
  SshHostKeyError,
} from "../../../provider/ssh";

const daemon = (code: number, message = "x") =>
  new LibvirtError("proc", {
    code,
    domain: 10,
    message,
    level: 2,
    dom: null,
    str1: null,
    str2: null,
    str3: null,
    int1: 0,
    int2: 0,
    net: null,
  });

describe("classifyLibvirtError", () => {
  const table: [string, unknown, "NotFound" | "Transient" | "Permanent"][] = [
    ["no domain", daemon(ErrorCode.NO_DOMAIN), "NotFound"],
    ["no volume", daemon(ErrorCode.NO_STORAGE_VOL), "NotFound"],
    ["no metadata element", daemon(ErrorCode.NO_DOMAIN_METADATA), "NotFound"],
    ["no pool (a config mistake)", daemon(ErrorCode.NO_STORAGE_POOL), "Permanent"],
    ["bad XML", daemon(ErrorCode.XML_ERROR), "Permanent"],
    ["unsupported config", daemon(ErrorCode.CONFIG_UNSUPPORTED), "Permanent"],
    ["access denied", daemon(ErrorCode.ACCESS_DENIED), "Permanent"],
    ["operation invalid", daemon(ErrorCode.OPERATION_INVALID), "Permanent"],
    [
      "volume still held by a cancelled stream",
      daemon(
        ErrorCode.OPERATION_INVALID,
        "Requested operation is not valid: volume 'v' is still in use.",
      ),
      "Transient",
    ],
    [
      "domain exists",
      daemon(ErrorCode.OPERATION_FAILED, "domain 'x' already exists with uuid"),
      "Permanent",
    ],
    ["unknown procedure", daemon(ErrorCode.RPC, "unknown procedure: 9999"), "Permanent"],
    ["agent unresponsive", daemon(ErrorCode.AGENT_UNRESPONSIVE), "Transient"],
    ["agent unsynced", daemon(ErrorCode.AGENT_UNSYNCED), "Transient"],
    ["busy", daemon(ErrorCode.RESOURCE_BUSY), "Transient"],
    [
      "pool refresh racing an upload",
      daemon(ErrorCode.INTERNAL_ERROR, "pool 'lab' has asynchronous jobs running."),
      "Transient",
    ],
    ["other internal error", daemon(ErrorCode.INTERNAL_ERROR, "wrong nlmsg len"), "Permanent"],
    ["authentication required", daemon(ErrorCode.RPC, "authentication required"), "Permanent"],
    ["link lost", new LibvirtTransportError("closed", "x"), "Transient"],
    [
      "local socket refused this user (not in group libvirt)",
      new LibvirtTransportError("io", "x", {
        cause: Object.assign(new Error("connect EACCES"), { code: "EACCES" }),
      }),
      "Permanent",
    ],
    [
      "local socket missing (libvirtd restarting)",
      new LibvirtTransportError("io", "x", {
        cause: Object.assign(new Error("connect ENOENT"), { code: "ENOENT" }),
      }),
      "Transient",
    ],
    ["deadline", new LibvirtTimeoutError("proc", 10), "Transient"],
    ["caller abort", new LibvirtAbortedError("proc"), "Transient"],
    [
      "source failed",
      new LibvirtStreamEndpointError("up", "source", { cause: new Error("ECONNRESET") }),
      "Transient",
    ],
    [
      "source failed with a permanent cause",
      new LibvirtStreamEndpointError("up", "source", {
        cause: new PermanentError("image sha256 mismatch"),
      }),
      "Permanent",
    ],
    ["ssh unreachable", new SshConnectError("x"), "Transient"],
    [
      "ssh host key revoked",
      new SshHostKeyError("revoked", "h", 22, "SHA256:x", "ssh-ed25519"),
      "Permanent",
    ],
    ["ssh auth", new SshAuthError("x"), "Permanent"],
    ["ssh config", new SshConfigError("x"), "Permanent"],
    ["anything unclassified", new Error("?"), "Permanent"],
  ];
  for (const [what, error, expected] of table) {
    it(`${what} → ${expected}`, () => {
      const classified = classifyLibvirtError(error, {
        operation: "create",
        resource: "domain vm1",
      });
      assert.equal(classified.errorClass, expected);
      assert.equal(classified.cause, error);
      assert.match(classified.message, /^create domain vm1: /);
    });
  }

  it("passes an already classified error through unchanged", () => {
    const error = new NotFoundError("gone");
    assert.equal(classifyLibvirtError(error), error);
  });
});

const systemError = (code: string, message = `connect ${code} 127.0.0.1:9`) =>
  Object.assign(new Error(message), { code });

describe("classifyImageFetchError", () => {
  const url = "https://images.example/debian.qcow2";
  const table: [string, unknown, "Transient" | "Permanent"][] = [
    [
      "a redirect the policy refused",
      new ImageSourceRefusedError("image.url x was redirected to file:///etc/passwd"),
      "Permanent",
    ],
    ["connection refused (server restarting)", systemError("ECONNREFUSED"), "Transient"],
    ["connection reset", systemError("ECONNRESET"), "Transient"],
    ["no route", systemError("EHOSTUNREACH"), "Transient"],
    ["resolver busy", systemError("EAI_AGAIN"), "Transient"],
    ["name does not resolve (resolver or VPN may be down)", systemError("ENOTFOUND"), "Transient"],
    ["connect timeout", new undiciErrors.ConnectTimeoutError(), "Transient"],
    ["headers timeout", new undiciErrors.HeadersTimeoutError(), "Transient"],
    ["body timeout", new undiciErrors.BodyTimeoutError(), "Transient"],
    ["socket closed mid-response", new undiciErrors.SocketError("other side closed"), "Transient"],
    ["request aborted", new undiciErrors.RequestAbortedError(), "Transient"],
    ["a response cut inside its headers", systemError("HPE_INVALID_CONSTANT"), "Transient"],
    ["expired certificate", systemError("CERT_HAS_EXPIRED"), "Permanent"],
    ["self-signed certificate", systemError("DEPTH_ZERO_SELF_SIGNED_CERT"), "Permanent"],
    ["untrusted issuer", systemError("UNABLE_TO_VERIFY_LEAF_SIGNATURE"), "Permanent"],
    ["certificate for another name", systemError("ERR_TLS_CERT_ALTNAME_INVALID"), "Permanent"],
    ["https to a plain http port", systemError("ERR_SSL_WRONG_VERSION_NUMBER"), "Permanent"],
    ["an argument undici refuses", new undiciErrors.InvalidArgumentError("bad"), "Permanent"],
    ["headers too large", new undiciErrors.HeadersOverflowError(), "Permanent"],
    ["anything unclassified", new Error("?"), "Permanent"],
  ];
  for (const [what, error, expected] of table) {
    it(`${what} → ${expected}`, () => {
      const classified = classifyImageFetchError(error, url);
      assert.equal(classified.errorClass, expected);
      assert.equal(classified.cause, error);
      assert.match(classified.message, /image\.url/);
    });
  }

  it("passes an already classified error through unchanged", () => {
    const error = new TransientError("image.url x did not answer within 10 ms");
    assert.equal(classifyImageFetchError(error, url), error);
  });

  it("never shows URL credentials, neither from image.url nor from the cause", () => {
    const classified = classifyImageFetchError(
      systemError("ECONNRESET", "reset while talking to http://bob:hunter22@mirror.example/x"),
      "http://alice:s3cret-pw@mirror.example/x",
    );
    assert.equal(classified.errorClass, "Transient");
    assert.doesNotMatch(classified.message, /s3cret-pw|hunter22|alice|bob/);
  });
});

describe("classifyImageHttpStatus", () => {
  const table: [number, "NotFound" | "Transient" | "Permanent"][] = [
    [404, "NotFound"],
    [410, "NotFound"],
    [429, "Transient"],
    [500, "Transient"],
    [503, "Transient"],
    [401, "Permanent"],
    [403, "Permanent"],
    [300, "Permanent"],
    [304, "Permanent"],
  ];
  for (const [status, expected] of table) {
    it(`HTTP ${status} → ${expected}`, () => {
      const classified = classifyImageHttpStatus(status, "https://images.example/x.qcow2");
      assert.equal(classified.errorClass, expected);
      assert.match(
        classified.message,
        new RegExp(`image\\.url https://images\\.example/x\\.qcow2 answered HTTP ${status}`),
      );
    });
  }

  it("names where a redirect led, without its query (signed CDN URLs carry tokens there)", () => {
    const classified = classifyImageHttpStatus(
      403,
      "https://images.example/x.qcow2",
      new URL("https://cdn.example/blob/x.qcow2?X-Amz-Signature=abcdef0123"),
    );
    assert.match(classified.message, /redirected to https:\/\/cdn\.example\/blob\/x\.qcow2\?…/);
    assert.doesNotMatch(classified.message, /abcdef0123/);
  });
});
