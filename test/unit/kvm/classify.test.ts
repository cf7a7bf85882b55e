import assert from "node:assert/strict";
import { NotFoundError, PermanentError } from "../../../provider/common/errors";
import { classifyLibvirtError } from "../../../provider/kvm/classify";
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
