/**
 * libvirt-rpc-xdr: the libvirt remote protocol in TypeScript. Self-contained
 * (imports nothing else from this project) so it could be published alone.
 *
 * Layers, bottom up: `xdr` (codec) → `xdr-types` (types as values, with
 * their layout) → `protocol` (`constants`, `structs`, `procedures`) →
 * `core` (sans-IO framing and routing) → `stream` (upload/download state
 * machines: `stream-machine`, `upload-stream`, `download-stream`) →
 * `client` (a connection over any Duplex: `handshake`, `outbox`,
 * `pending-call`, `deadlines`).
 */
export * from "./xdr";
export * as XdrTypes from "./xdr-types";
export * from "./errors";
export * from "./protocol";
export * from "./core";
export * from "./stream";
export * from "./client";
export * from "./call-counter";
