/**
 * One HTTP request through a forward proxy, the way crawlers use it: an
 * absolute-form `GET http://target/ HTTP/1.1` sent to the proxy (not a
 * CONNECT tunnel, which squid allows only to TLS ports by default).
 */
import { request } from "node:http";

export interface ProxyProbeResult {
  status: number;
  body: string;
  /** squid's X-Squid-Error header on its own error pages, e.g. "ERR_CONNECT_FAIL 111". */
  squidError?: string;
}

/** Basic-auth credentials for the proxy itself (sent as Proxy-Authorization, never logged). */
export interface ProxyCredentials {
  user: string;
  password: string;
}

export function proxyAuthorization(credentials: ProxyCredentials): string {
  return `Basic ${Buffer.from(`${credentials.user}:${credentials.password}`).toString("base64")}`;
}

export function fetchThroughProxy(
  proxy: { host: string; port: number },
  targetUrl: string,
  timeoutMs: number,
  credentials?: ProxyCredentials,
): Promise<ProxyProbeResult> {
  const target = new URL(targetUrl);
  if (target.protocol !== "http:")
    return Promise.reject(
      new Error(`only http:// targets can be probed through a proxy, not ${target.protocol}`),
    );
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: proxy.host,
        port: proxy.port,
        method: "GET",
        path: target.toString(),
        headers: {
          host: target.host,
          ...(credentials === undefined
            ? {}
            : { "proxy-authorization": proxyAuthorization(credentials) }),
        },
        timeout: timeoutMs,
      },
      (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on("data", (chunk: Buffer) => {
          // Only the start of the body matters for a probe.
          if (size < 65536) chunks.push(chunk);
          size += chunk.length;
        });
        res.on("end", () =>
          resolve({
            status: res.statusCode ?? 0,
            body: Buffer.concat(chunks).toString("utf8"),
            squidError: headerText(res.headers["x-squid-error"]),
          }),
        );
        res.on("error", reject);
      },
    );
    req.on("timeout", () =>
      req.destroy(
        new Error(`no answer from proxy ${proxy.host}:${proxy.port} within ${timeoutMs} ms`),
      ),
    );
    req.on("error", reject);
    req.end();
  });
}

const headerText = (value: string | string[] | undefined): string | undefined =>
  Array.isArray(value) ? value.join(", ") : value;
