/**
 * The libvirt remote protocol's numbers and structs for the procedures this
 * project uses, written from libvirt's `remote_protocol.x`, `qemu_protocol.x`,
 * `virnetprotocol.x` and `virkeepaliveprotocol.x`, in three parts: the
 * numbers (`constants.ts`), the shared structs (`structs.ts`) and the
 * procedure table (`procedures.ts`). A unit test parses copies of those `.x`
 * files (test/data/libvirt/) and compares every number and layout with them.
 */
export * from "./constants";
export * from "./structs";
export * from "./procedures";
