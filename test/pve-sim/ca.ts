import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** A private CA and a server certificate it signed, for 127.0.0.1, ::1 and localhost. */
export interface SimulatorTls {
  caCertPem: string;
  serverCertPem: string;
  serverKeyPem: string;
}

let cached: SimulatorTls | undefined;

/**
 * Generates the TLS material with the openssl CLI (no new dependency). Done
 * once per process: key generation is the slowest part of starting a simulator.
 * The files live in a temporary directory removed right after reading.
 */
export function simulatorTls(): SimulatorTls {
  if (cached !== undefined) return cached;
  const dir = mkdtempSync(join(tmpdir(), "pve-sim-ca-"));
  try {
    const run = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
    const ecKey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    run(
      "req",
      "-x509",
      ...ecKey,
      "-keyout",
      "ca.key",
      "-out",
      "ca.pem",
      "-days",
      "3",
      "-subj",
      "/CN=pve-sim private test CA",
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign",
    );
    run("req", ...ecKey, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=pve-sim");
    writeFileSync(
      join(dir, "server.ext"),
      "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n",
    );
    run(
      "x509",
      "-req",
      "-in",
      "server.csr",
      "-CA",
      "ca.pem",
      "-CAkey",
      "ca.key",
      "-CAcreateserial",
      "-out",
      "server.pem",
      "-days",
      "3",
      "-extfile",
      "server.ext",
    );
    cached = {
      caCertPem: readFileSync(join(dir, "ca.pem"), "utf8"),
      serverCertPem: readFileSync(join(dir, "server.pem"), "utf8"),
      serverKeyPem: readFileSync(join(dir, "server.key"), "utf8"),
    };
    return cached;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
