/**
 * libvirt-rpc-xdr: the libvirt remote protocol in TypeScript. Self-contained
 * (imports nothing else from this project) so it could be published alone.
 *
 * Layers, bottom up: `xdr` (codec) → `xdr-types` (types as values, with
 * their layout) → `protocol` (numbers and structs) →
 * `core` (sans-IO framing and routing) → `stream` (upload/download state
 * machines) → `client` (a connection over any Duplex).
 */
export * from "./xdr";
export * as XdrTypes from "./xdr-types";
export * from "./errors";
export * from "./protocol";
export * from "./core";
export * from "./stream";
export * from "./client";
