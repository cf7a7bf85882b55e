/**
 * Jump hosts (OpenSSH's ProxyJump): the hypervisor is reached through one or
 * more SSH hosts in turn, each logged into with its own user, credentials and
 * host-key check, each opening a TCP forward to the next. What a hop is and
 * how OpenSSH's one-line form reads; the dialling is transport.ts's.
 */
import type { SshCredentials } from "./auth";
import { SshConfigError } from "./errors";

/** One hop: who to log in as where, and how its host key is checked. */
export interface SshHop extends SshCredentials {
  host: string;
  /** Default 22. */
  port?: number;
  username: string;
  /** known_hosts content. Wins over `knownHostsFile`. */
  knownHosts?: string;
  /** known_hosts file; default ~/.ssh/known_hosts. */
  knownHostsFile?: string;
  /** INSECURE: accept any host key from this hop. */
  insecureSkipHostKeyVerification?: boolean;
}

/** A hop as OpenSSH's ProxyJump writes it, before defaults: `[user@]host[:port]`. */
export interface ProxyJumpHop {
  host: string;
  port?: number;
  user?: string;
}

/**
 * `[user@]host[:port][,[user@]host[:port]...]`, as `ssh -J` and ProxyJump take
 * it; an IPv6 host in brackets (`user@[2001:db8::1]:22`). `field` names the
 * input in errors. ssh:// URLs and `none` are not taken: they mean nothing here.
 */
export function parseProxyJump(text: string, field: string): ProxyJumpHop[] {
  const example = `e.g. "admin@bastion.example:22" or "jump1,admin@[2001:db8::1]:2222"`;
  const hops = text.split(",").map((part) => part.trim());
  if (text.trim() === "" || hops.some((hop) => hop === ""))
    throw new SshConfigError(`${field} must list jump hosts separated by commas, ${example}`);
  return hops.map((hop, index) => {
    const match = /^(?:([^@\s]+)@)?(\[[0-9A-Fa-f:.]+\]|[^\s:@[\]]+)(?::(\d+))?$/.exec(hop);
    const where = hops.length > 1 ? `${field} hop ${index + 1} (${JSON.stringify(hop)})` : field;
    if (match === null)
      throw new SshConfigError(
        `${where} is not [user@]host[:port] (an IPv6 address in brackets), ${example}`,
      );
    const [, user, host, portText] = match;
    const port = portText === undefined ? undefined : Number(portText);
    if (port !== undefined && (port < 1 || port > 65535))
      throw new SshConfigError(`${where}: port ${portText} is not between 1 and 65535`);
    return {
      host: host!.replace(/^\[(.*)\]$/, "$1"),
      ...(port === undefined ? {} : { port }),
      ...(user === undefined ? {} : { user }),
    };
  });
}

/** How a hop is named in messages: `jump host 1 of 2 (admin@bastion:22)`. */
export function describeHop(index: number, count: number, where: string): string {
  return count === 1 ? `jump host ${where}` : `jump host ${index + 1} of ${count} (${where})`;
}
