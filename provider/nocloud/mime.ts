/**
 * The smallest MIME multipart writer cloud-init needs, plus the part-type
 * sniffing cloud-init itself does. Used only for vendor-data: the user's
 * user-data is never wrapped, parsed or rewritten.
 */
import { createHash } from "node:crypto";
import { gunzipSync } from "node:zlib";

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
  const bodies = parts.map(encodePart);
  let boundary = `===egress-proxies-${digest.digest("hex").slice(0, 24)}==`;
  // Checked against what is written (a gzip part goes in decompressed).
  while (bodies.some((body) => body.includes(boundary))) boundary = `=${boundary}=`;

  const chunks: Buffer[] = [
    Buffer.from(
      `MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="${boundary}"\n\n`,
      "ascii",
    ),
  ];
  for (const body of bodies) {
    chunks.push(Buffer.from(`--${boundary}\n`, "ascii"));
    chunks.push(body);
    // The newline before a delimiter belongs to the delimiter, so the payload's own bytes stay intact.
    chunks.push(Buffer.from("\n", "ascii"));
  }
  chunks.push(Buffer.from(`--${boundary}--\n`, "ascii"));
  return Buffer.concat(chunks);
}

/**
 * A gzip part goes in decompressed. cloud-init does decompress a gzip part,
 * but it puts the text into a new part without a charset, from which its
 * handlers get every non-ASCII character back mangled: `\u6771` for 東, a
 * lone 0xFC byte for ü (cloudinit/user_data.py, `_process_msg`, the
 * `was_compressed` branch; Python's email package encodes such a payload as
 * raw-unicode-escape). Decompressed here and carried as base64, the same text
 * reaches the handlers intact. A gzip vendor-data document on its own (no
 * agent script) takes another path in cloud-init and is stored as given. A
 * corrupt stream is kept as given, so cloud-init reports it as it would.
 */
function decompressedGzip(payload: Buffer): Buffer {
  if (payload.length < 2 || payload[0] !== 0x1f || payload[1] !== 0x8b) return payload;
  try {
    return gunzipSync(payload);
  } catch {
    return payload;
  }
}

function encodePart(part: MimePart): Buffer {
  const payload = decompressedGzip(part.payload);
  const sniffed = sniffPayload(payload);
  // A MIME message is already a valid body part: its own headers become the part's headers.
  if (sniffed.kind === "mime") return payload;
  const disposition = `Content-Disposition: attachment; filename="${part.filename.replace(/["\\\r\n]/g, "_")}"`;
  if (isPlainAscii(payload)) {
    const header = `Content-Type: ${sniffed.contentType}; charset="us-ascii"\nContent-Transfer-Encoding: 7bit\n${disposition}\n\n`;
    return Buffer.concat([Buffer.from(header, "ascii"), payload]);
  }
  const header = `Content-Type: ${sniffed.contentType}\nContent-Transfer-Encoding: base64\n${disposition}\n\n`;
  const base64 = payload.toString("base64").replace(/.{76}/g, "$&\n");
  return Buffer.from(header + base64, "ascii");
}
