/**
 * One upload in a process of its own, so its peak RSS is the upload's and not
 * the benchmark runner's: `node libvirt-upload-child.js <env.json> <file> <volume>`.
 * Prints one JSON line: {"ms": connect + upload time, "maxRssMb": peak RSS}.
 */
import { createReadStream, readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { Procedures } from "../../provider/libvirt-rpc-xdr";
import { openLibvirtOverSsh } from "../../provider/ssh";
import { labSshTarget } from "../lab/ssh-helpers";
import type { LabEnv } from "../lab/lab";

async function main(): Promise<void> {
  const [envFile, file, volumeName] = process.argv.slice(2);
  if (!envFile || !file || !volumeName)
    throw new Error("usage: libvirt-upload-child <env.json> <file> <volume>");
  const lab = JSON.parse(readFileSync(envFile, "utf8")) as LabEnv;
  const started = performance.now();
  const conn = await openLibvirtOverSsh(labSshTarget(lab), { handshakeTimeoutMs: 10_000 });
  const pool = await conn.call(Procedures.storagePoolLookupByName, { name: lab.pool });
  const vol = await conn.call(Procedures.storageVolLookupByName, { pool, name: volumeName });
  await conn.upload({ vol }, createReadStream(file, { highWaterMark: 1024 * 1024 }), {
    timeoutMs: 300_000,
  });
  const ms = performance.now() - started;
  await conn.close();
  // resourceUsage().maxRSS is in KiB.
  console.log(JSON.stringify({ ms, maxRssMb: process.resourceUsage().maxRSS / 1024 }));
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
