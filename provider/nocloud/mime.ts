/**
 * The smallest MIME multipart writer cloud-init needs, plus the part-type
 * sniffing cloud-init itself does. Used only for vendor-data: the user's
 * user-data is never wrapped, parsed or rewritten.
 */
import { createHash } from "node:crypto";

/** cloud-init's own prefix table (cloudinit.handlers.INCLUSION_TYPES_MAP); longest match wins. */
const PREFIX_TYPES: ReadonlyArray<[string, string]> = [
  ["#include-once", "text/x-include-once-url"],
  ["#include", "text/x-include-url"],
  ["#!", "text/x-shellscript"],
  ["#cloud-config-archive", "text/cloud-config-archive"],
  ["#cloud-config-jsonp", "text/cloud-config-jsonp"],
  ["#cloud-config", "text/cloud-config"],
  ["#part-handler", "text/part-handler"],
  ["#cloud-boothook", "text/cloud-boothook"],
  ["## template: jinja", "text/jinja2"],
];

export type PartKind = { kind: "mime" } | { kind: "typed"; contentType: string };

/** What cloud-init will take a payload for. MIME messages are recognised as cloud-init does: the header in the first 4096 bytes. */
export function sniffPayload(payload: Buffer): PartKind {
  if (payload.length >= 2 && payload[0] === 0x1f && payload[1] === 0x8b)
    return { kind: "typed", contentType: "application/gzip" };
  const head = payload.subarray(0, 4096).toString("latin1");
  if (head.toLowerCase().includes("mime-version:") && /^content-type:/im.test(head))
    return { kind: "mime" };
  const found = [...PREFIX_TYPES]
    .sort((a, b) => b[0].length - a[0].length)
    .find(([prefix]) => head.startsWith(prefix));
  // text/plain makes cloud-init sniff it again and warn when nothing handles it: visible, not dropped.
  return { kind: "typed", contentType: found ? found[1] : "text/plain" };
}

export interface MimePart {
  payload: Buffer;
  /** Shown as the part's filename; cloud-init names the script it writes after it. */
  filename: string;
}

const isPlainAscii = (payload: Buffer): boolean =>
  payload.every((byte) => byte === 0x0a || byte === 0x09 || (byte >= 0x20 && byte < 0x7f));

/**
 * A multipart/mixed message whose headers open the document (cloud-init looks
 * for MIME-Version in the first 4096 bytes). Deterministic: the boundary is
 * derived from the parts, so equal inputs give equal bytes.
 */
export function buildMultipart(parts: readonly MimePart[]): Buffer {
  const digest = createHash("sha256");
  for (const part of parts) digest.update(part.payload);
  let boundary = `===egress-proxies-${digest.digest("hex").slice(0, 24)}==`;
  while (parts.some((part) => part.payload.includes(boundary))) boundary = `=${boundary}=`;

  const chunks: Buffer[] = [
    Buffer.from(
      `MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="${boundary}"\n\n`,
      "ascii",
    ),
  ];
  for (const part of parts) {
    chunks.push(Buffer.from(`--${boundary}\n`, "ascii"));
    chunks.push(encodePart(part));
    // The newline before a delimiter belongs to the delimiter, so the payload's own bytes stay intact.
    chunks.push(Buffer.from("\n", "ascii"));
  }
  chunks.push(Buffer.from(`--${boundary}--\n`, "ascii"));
  return Buffer.concat(chunks);
}

function encodePart(part: MimePart): Buffer {
  const sniffed = sniffPayload(part.payload);
  // A MIME message is already a valid body part: its own headers become the part's headers.
  if (sniffed.kind === "mime") return part.payload;
  const disposition = `Content-Disposition: attachment; filename="${part.filename.replace(/["\\\r\n]/g, "_")}"`;
  if (isPlainAscii(part.payload)) {
    const header = `Content-Type: ${sniffed.contentType}; charset="us-ascii"\nContent-Transfer-Encoding: 7bit\n${disposition}\n\n`;
    return Buffer.concat([Buffer.from(header, "ascii"), part.payload]);
  }
  const header = `Content-Type: ${sniffed.contentType}\nContent-Transfer-Encoding: base64\n${disposition}\n\n`;
  const base64 = part.payload.toString("base64").replace(/.{76}/g, "$&\n");
  return Buffer.from(header + base64, "ascii");
}
