/**
 * The pieces of a cloud-config document our documents share (the members'
 * squid, the gateway VM's): YAML written by hand, because the bytes are part
 * of each VM's identity and must not move with a YAML library's choices.
 */
import type { GuestFileText } from "./prefix-egress";

/** `content: |` body lines, indented under the key. A literal block keeps every character as written. */
const literalBlock = (text: string, indent: string): string =>
  text
    .split("\n")
    .filter((line, index, all) => !(index === all.length - 1 && line === ""))
    .map((line) => (line === "" ? "" : indent + line))
    .join("\n");

/** One `write_files` entry. Deferred: written after packages are installed (see squidCloudConfig). */
export function writeFileEntry(file: GuestFileText, defer: boolean): string[] {
  return [
    `  - path: ${file.path}`,
    `    permissions: "${file.permissions}"`,
    ...(defer ? [`    defer: true`] : []),
    `    content: |`,
    ...(file.content === "" ? [] : [literalBlock(file.content, "      ")]),
  ];
}

/** A `runcmd` entry: a YAML flow list, an argument quoted when YAML would read it otherwise. */
export const runcmdEntry = (argv: readonly string[]): string =>
  `  - [${argv.map((arg) => (/^[A-Za-z0-9_./=-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, "''")}'`)).join(", ")}]`;
