/**
 * The guests a lab suite boots, removed by name in its `after` hook whatever
 * happened to the test: a create cut short by a deadline leaves a running
 * qemu that no provider `delete` knows about. Removal goes straight to
 * libvirt with virsh (destroy, undefine with NVRAM, the per-VM overlay and
 * seed volumes) and is then verified: no domain of that name, no volume, no
 * qemu process; anything left fails the hook loudly.
 */
import { execFile } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { promisify } from "node:util";
import { overlayVolumeName, seedVolumeName } from "../../provider/kvm/naming";
import type { LabEnv } from "./lab";

const run = promisify(execFile);

async function virsh(...args: string[]): Promise<string> {
  const { stdout } = await run("virsh", ["-q", "-c", "qemu:///system", ...args], {
    timeout: 60_000,
  });
  return stdout;
}

const lines = (text: string): string[] =>
  text
    .split("\n")
    .map((line) => line.trim().split(/\s+/)[0]!)
    .filter(Boolean);

/** PIDs of qemu processes whose `-name guest=<name>` is one of `names`. */
function qemuProcessesOf(names: Set<string>): number[] {
  const found: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let argv: string[];
    try {
      argv = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
    } catch {
      continue;
    }
    if (!argv[0]?.includes("qemu-system")) continue;
    const guest = /(?:^|,)guest=([^,]+)/.exec(argv[argv.indexOf("-name") + 1] ?? "")?.[1];
    if (guest !== undefined && names.has(guest)) found.push(Number(entry));
  }
  return found;
}

export class LabGuests {
  private readonly names = new Set<string>();

  /** Call as soon as the name is known (after check), before the create that may be cut short. */
  add(...names: string[]): void {
    for (const name of names) this.names.add(name);
  }

  /** Destroys and undefines every recorded guest still there, deletes its volumes, and verifies. */
  async removeAll(lab: LabEnv): Promise<void> {
    if (this.names.size === 0) return;
    const domains = new Set(lines(await virsh("list", "--all", "--name")));
    for (const name of this.names) {
      if (domains.has(name)) {
        await virsh("destroy", name).catch(() => undefined); // "domain is not running" is fine
        await virsh("undefine", name, "--nvram").catch(() => virsh("undefine", name));
      }
      const volumes = new Set(lines(await virsh("vol-list", lab.pool)));
      for (const volume of [overlayVolumeName(name), seedVolumeName(name)])
        if (volumes.has(volume)) await virsh("vol-delete", "--pool", lab.pool, volume);
    }
    const leftDomains = lines(await virsh("list", "--all", "--name")).filter((name) =>
      this.names.has(name),
    );
    const wanted = new Set(
      [...this.names].flatMap((name) => [overlayVolumeName(name), seedVolumeName(name)]),
    );
    const leftVolumes = lines(await virsh("vol-list", lab.pool)).filter((v) => wanted.has(v));
    const leftQemu = qemuProcessesOf(this.names);
    if (leftDomains.length + leftVolumes.length + leftQemu.length > 0)
      throw new Error(
        `lab guests not removed: domains [${leftDomains.join(", ")}], volumes [${leftVolumes.join(", ")}], qemu pids [${leftQemu.join(", ")}]`,
      );
    this.names.clear();
  }
}
