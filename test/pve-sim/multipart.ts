/** One part of a multipart/form-data body, in the order it was sent. */
export interface FormPart {
  name: string;
  fileName?: string;
  data: Buffer;
}

/**
 * Splits a multipart/form-data body. Strict on purpose: the simulator must
 * notice a client that gets the framing wrong, the way pveproxy does.
 */
export function parseMultipart(body: Buffer, contentType: string): FormPart[] {
  const match = /boundary=(?:"([^"]+)"|([^;]+))/i.exec(contentType);
  if (match === null) throw new Error("multipart body without boundary");
  const boundary = Buffer.from(`--${match[1] ?? match[2]}`);
  const parts: FormPart[] = [];
  let position = body.indexOf(boundary);
  if (position < 0) throw new Error("multipart boundary not found");
  for (;;) {
    position += boundary.length;
    if (body.subarray(position, position + 2).toString() === "--") break;
    if (body.subarray(position, position + 2).toString() !== "\r\n")
      throw new Error("malformed multipart boundary line");
    position += 2;
    const headerEnd = body.indexOf("\r\n\r\n", position);
    if (headerEnd < 0) throw new Error("multipart part without header end");
    const headers = body.subarray(position, headerEnd).toString("utf8");
    const next = body.indexOf(Buffer.concat([Buffer.from("\r\n"), boundary]), headerEnd + 4);
    if (next < 0) throw new Error("multipart part not terminated");
    const disposition = /content-disposition:\s*form-data;([^\r\n]*)/i.exec(headers);
    if (disposition === null) throw new Error("multipart part without Content-Disposition");
    const name = /\bname="([^"]*)"/i.exec(disposition[1])?.[1];
    if (name === undefined) throw new Error("multipart part without name");
    const fileName = /\bfilename="([^"]*)"/i.exec(disposition[1])?.[1];
    parts.push({
      name,
      ...(fileName === undefined ? {} : { fileName }),
      data: body.subarray(headerEnd + 4, next),
    });
    position = next + 2;
  }
  return parts;
}
