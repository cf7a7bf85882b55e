/**
 * How the provider reaches libvirtd: over SSH (ssh2, socket forward, known_hosts,
 * keepalives) or the local unix socket, and a per-host connection pool.
 */
export * from "./address";
export * from "./errors";
export * from "./known-hosts";
export * from "./auth";
export * from "./local";
export * from "./transport";
export * from "./ciphers";
export * from "./jump";
export * from "./pool";
