/**
 * An exit address as the `rotateEgress` input takes it: one canonical text
 * per address, and the input's schema. Pure; apart from the rotation rule
 * (egress-rotation.ts) so that the input schemas need not import a diff rule.
 */
import { isIP } from "node:net";
import { z } from "zod";

/** An exit address as one text per address: IPv6 compressed and lower-case, IPv4 as written; undefined: not an address. */
export function canonicalAddress(text: string): string | undefined {
  const family = isIP(text);
  if (family === 4) return text;
  // The URL serializer prints an IPv6 literal in its one canonical form (RFC 5952).
  if (family === 6) return new URL(`http://[${text}]/`).hostname.slice(1, -1);
  return undefined;
}

/** The entry `map` (a `rotateEgress` map) holds for `address` under any spelling of either, or undefined. */
export function rotateEgressEntry(map: unknown, address: unknown): string | undefined {
  if (typeof map !== "object" || map === null || typeof address !== "string") return undefined;
  const wanted = canonicalAddress(address);
  if (wanted === undefined) return undefined;
  for (const [key, text] of Object.entries(map as Record<string, unknown>))
    if (typeof text === "string" && canonicalAddress(key) === wanted) return text;
  return undefined;
}

export const rotateEgressSchema = z
  .record(
    z.string().refine((key) => canonicalAddress(key) !== undefined, {
      error: 'rotateEgress keys must be IPv4 or IPv6 exit addresses, e.g. "203.0.113.9"',
    }),
    z
      .string({ error: 'rotateEgress values must be texts, e.g. "burned-2026-12-04"' })
      .min(1, {
        error: 'rotateEgress values must be texts of 1 to 200 characters, e.g. "burned-2026-12-04"',
      })
      .max(200, { error: "rotateEgress values must be at most 200 characters" }),
    {
      error:
        'rotateEgress must map exit addresses (IPv4 or IPv6) to texts, e.g. { "203.0.113.9": "burned-2026-12-04" }',
    },
  )
  .optional();
