/**
 * Volume upload and download as explicit state machines.
 *
 * A libvirt stream is a call (REPLY OK) followed by STREAM packets that carry
 * the call's serial. There is no flow-control window: the only backpressure is
 * the transport's. Every event that can happen (the call's reply, a data or
 * control packet from the daemon, the local source or sink producing data,
 * ending or failing, the transport draining, the connection dying, the
 * caller's deadline or abort) is a method here, and each method looks at the
 * current phase to decide. Every phase has an exit for every failure, so no
 * combination can leave a caller waiting forever: that is the bug this shape
 * exists to avoid.
 *
 *   upload:   awaiting-reply → sending → finishing → done
 *                  │             │          │
 *                  │             └→ aborting┘ (source failed: tell the daemon, wait briefly)
 *                  └──────────────── any → failed (daemon error, link lost, deadline, abort)
 *   download: awaiting-reply → receiving → finishing → done   (any → failed)
 */
export type {
  DownloadPhase,
  StreamMachineOptions,
  StreamPort,
  UploadPhase,
} from "./stream-machine";
export { fileUploadSource, type ReadIntoSource } from "./upload-source";
export { UPLOAD_FRAME_BODY_BYTES, UploadMachine } from "./upload-stream";
export { DownloadMachine } from "./download-stream";
