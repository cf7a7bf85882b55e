/**
 * `doctor --fix`: only the safe, standard set-up a distribution's own tools
 * would do — define, build, start and autostart a `dir` pool `default` at
 * /var/lib/libvirt/images (what virt-install and virt-manager create on first
 * use), start or autostart an existing pool `default`, start and autostart
 * the network `default` the packages define. Nothing is installed, no other
 * name is touched, nothing is removed. Returns what it did, in words.
 */
import { errorClassOf } from "../../provider/common/errors";
import { safeErrorMessage } from "../../provider/common/redact";
import type { LibvirtHost } from "../../provider/kvm/host";
import type { Finding, SafeFix } from "../../provider/kvm/preflight";

function defaultPoolXml(path: string): string {
  return `<pool type="dir"><name>default</name><target><path>${path}</path></target></pool>`;
}

async function apply(host: LibvirtHost, fix: SafeFix): Promise<string> {
  switch (fix.kind) {
    case "create-default-pool":
      await host.definePool("default", defaultPoolXml(fix.path));
      return `defined, built, started and autostarted the dir pool default at ${fix.path}`;
    case "start-pool":
    case "autostart-pool": {
      const pool = await host.findPool(fix.pool);
      if (pool === undefined) return `pool ${fix.pool} vanished; nothing done`;
      await host.startPool(pool);
      return `started and autostarted the pool ${fix.pool}`;
    }
    case "start-network":
    case "autostart-network": {
      const net = await host.findNetwork(fix.network);
      if (net === undefined) return `network ${fix.network} vanished; nothing done`;
      await host.startNetwork(net);
      return `started and autostarted the network ${fix.network}`;
    }
  }
}

/**
 * Applies the safe fix of every failed or warned finding that has one, in
 * order. A fix the host refuses (say, another pool already uses the path) is
 * reported in words and the others still run; a dead link ends the run.
 */
export async function applySafeFixes(
  host: LibvirtHost,
  findings: readonly Finding[],
): Promise<string[]> {
  const done: string[] = [];
  for (const finding of findings) {
    if (finding.safeFix === undefined || finding.status === "ok") continue;
    try {
      done.push(await apply(host, finding.safeFix));
    } catch (error) {
      if (errorClassOf(error) === "Transient") throw error;
      done.push(`could not ${finding.safeFix.kind.replace(/-/g, " ")}: ${safeErrorMessage(error)}`);
    }
  }
  return done;
}
