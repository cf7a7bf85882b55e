import * as pulumi from "@pulumi/pulumi";
import {
  resourceOptions,
  resourceProps,
  type EgressCheckArgs,
  type GuestFilesArgs,
  type IpFamilyArgs,
  type TimeoutsArgs,
} from "../common/resource-props";
import * as implementation from "./provider";
import { kvmProxyInputsSchema } from "./schema";
import type { EgressProblem } from "../common/egress-recheck";

/**
 * The provider Pulumi serializes into state: the implementation module itself,
 * which the closure serializer emits as one `require` of this package (about
 * 300 bytes per copy where seven wrapper functions took 2000, stored in both
 * inputs and outputs of every member), so no credential or live handle ends
 * up in the closure.
 *
 * FROZEN: every KvmProxy's state stores this closure, which requires
 * `egress-proxies/dist/provider/kvm/provider.js`; the dynamic-provider server
 * calls configure, check, diff, create, read, update and delete on it, and the
 * closures stored by earlier releases call remove. delete and refresh
 * run that stored code. Moving the module or renaming an export needs a shim
 * at the old path (docs/frozen-api.md; test/engine/frozen-api.test.ts).
 */
const kvmProvider: pulumi.dynamic.ResourceProvider = implementation;

/** How to reach the hypervisor over SSH, in the shape @pulumi/command uses. */
export interface KvmConnectionArgs {
  host: pulumi.Input<string>;
  /** Default 22. */
  port?: pulumi.Input<number>;
  /** Default "root"; the user must be in the host's libvirt group. */
  user?: pulumi.Input<string>;
  /** The key's text (stored as a secret). Else SSH_AUTH_SOCK, else ~/.ssh/id_*. */
  privateKey?: pulumi.Input<string>;
  /** The key's passphrase (stored as a secret). */
  passphrase?: pulumi.Input<string>;
  /** known_hosts content; else ~/.ssh/known_hosts is read. */
  knownHosts?: pulumi.Input<string>;
  /** Skip host-key verification. Insecure: anyone on the path can impersonate the host. */
  insecureIgnoreHostKey?: pulumi.Input<boolean>;
  agentSocket?: pulumi.Input<string>;
  dialTimeoutSeconds?: pulumi.Input<number>;
}

export interface KvmProxyArgs extends IpFamilyArgs {
  /** The hypervisor over SSH; without it, the libvirt daemon of the machine running Pulumi. */
  connection?: pulumi.Input<KvmConnectionArgs>;
  /** libvirt's socket on the host. Default /var/run/libvirt/libvirt-sock. */
  socketPath?: pulumi.Input<string>;
  /** Storage pool for the base image, the overlay and the seed. Default "default". */
  pool?: pulumi.Input<string>;
  /** A host bridge ({ bridge: "br0" }: the VM sits on your LAN) or a libvirt network ({ name: "default" }, the default). */
  network?: pulumi.Input<{ bridge: pulumi.Input<string> } | { name: pulumi.Input<string> }>;
  /** Fixed VM name (a DNS label); generated from the resource name when unset. */
  vmName?: pulumi.Input<string>;
  vcpus?: pulumi.Input<number>;
  memoryMiB?: pulumi.Input<number>;
  /** Disk size; never smaller than the image's virtual size. Default 10. */
  diskGiB?: pulumi.Input<number>;
  /** Default "uefi" (Secure Boot off); "bios" for images without an EFI partition. */
  firmware?: pulumi.Input<"uefi" | "bios">;
  /** Default "kvm"; "qemu" emulates the CPU on hosts without /dev/kvm (slow). */
  domainType?: pulumi.Input<"kvm" | "qemu">;
  cpuMode?: pulumi.Input<
    "host-passthrough" | "host-model" | "maximum" | { model: pulumi.Input<string> }
  >;
  /**
   * The cloud image: https URL (http needs sha256), optional sha256, qcow2
   * (default) or raw, and maxMiB, the most its download may bring (default
   * 8192; a download that cannot fit in the pool is refused before it starts).
   */
  image: pulumi.Input<{
    url: pulumi.Input<string>;
    sha256?: pulumi.Input<string>;
    format?: pulumi.Input<"qcow2" | "raw">;
    maxMiB?: pulumi.Input<number>;
  }>;
  /** cloud-init user-data, any format, byte for byte; stored as a secret. */
  userData?: pulumi.Input<string>;
  /** Binary user-data (e.g. gzip) as base64; stored as a secret. */
  userDataBase64?: pulumi.Input<string>;
  /** Extra vendor-data, any format; travels beside the guest-agent script; stored as a secret. */
  vendorData?: pulumi.Input<string>;
  /** Files the user-data writes, delivered in place when they change (docs/day2.md, "Upgrades in place"); a secret. */
  guestFiles?: GuestFilesArgs;
  /** Install qemu-guest-agent with a vendor-data script (default true); the address comes from it. */
  installGuestAgent?: pulumi.Input<boolean>;
  /** NoCloud network-config (v1 or v2); stored as a secret. */
  networkConfig?: pulumi.Input<string>;
  /** Any text; a new value replaces the VM, created before the old one goes (EgressProxyPool's `rotate`). */
  rotation?: pulumi.Input<string>;
  /**
   * Exit address -> any text: the VM whose recorded exit address (`egressIp`
   * or `egressIpv6`) has an entry it was not created with is replaced, the old
   * one deleted first (check cannot rename it); changing the text rotates again.
   * EgressProxyPool's `rotate` with an address as key. docs/day2.md.
   */
  rotateEgress?: pulumi.Input<Record<string, pulumi.Input<string>>>;
  /**
   * Resources that share a `group` (EgressProxyPool sets the pool's name)
   * are restarted, replaced or deleted at most `maxUnavailable` at a time in
   * one deployment; the others are deferred to the next `up` with a warning
   * (a delete waits its turn). A member that carried traffic stays up
   * `drainSeconds` (default 0) before its VM is deleted, unless the group's
   * program is gone (`pulumi destroy`). Changing it touches no VM.
   * docs/day2.md.
   */
  disruptionBudget?: pulumi.Input<{
    group: pulumi.Input<string>;
    maxUnavailable: pulumi.Input<number>;
    drainSeconds?: pulumi.Input<number>;
  }>;
  /**
   * Re-check the proxy on every refresh that finds it running: its port, then
   * `egressCheck` through it (3 tries, each capped as at create). A proxy that
   * does not answer is recorded in `egressProblem` and the next `up` restarts
   * it in place, then replaces it if it still does not answer; a new exit
   * address is accepted. Default off; EgressProxyPool turns it on. docs/day2.md.
   */
  egressRecheck?: pulumi.Input<boolean>;
  /** A refresh that finds the VM older than this many days reports it for replacement (created before the old one goes). */
  rotateAfterDays?: pulumi.Input<number>;
  /**
   * Start the VM when the host boots (libvirt autostart; default true). Refresh
   * reports the host's flag, so a flag changed by hand shows as drift and the
   * next `up` sets it back, in place.
   */
  startOnBoot?: pulumi.Input<boolean>;
  /**
   * Keep the VM running (default true). A refresh that finds it stopped,
   * shut off or crashed reports `running: false`, and the next `up` starts it
   * again in place and waits for readiness (and the egress check). false
   * defines the VM without starting it at create, and shuts a running one
   * down (ACPI, then hard after a minute) at update; it stays defined.
   */
  running?: pulumi.Input<boolean>;
  /** When create is done: "port" (default: the proxy port answers), "address" or "none". */
  readiness?: pulumi.Input<{
    mode?: pulumi.Input<"port" | "address" | "none">;
    port?: pulumi.Input<number>;
    /** With "port": also wait for a request without credentials to be answered 407 (the proxy's own configuration, not a package default). */
    authRequired?: pulumi.Input<boolean>;
    probeUrl?: pulumi.Input<string>;
  }>;
  /**
   * Optional: once ready, fetch `url` through the proxy (with `proxyAuth`) and
   * record the address the target saw as `egressIp`; no address is a
   * readiness failure. `url` answers with the caller's address as plain text
   * or JSON (`field`, default ip/origin/address/query). Stored as a secret.
   */
  egressCheck?: EgressCheckArgs;
  /** Our own timeouts (Pulumi ignores customTimeouts for dynamic resources). */
  timeouts?: TimeoutsArgs;
}

/** One egress proxy VM on a libvirt/KVM host, reached over SSH or the local libvirt socket. */
export class KvmProxy extends pulumi.dynamic.Resource {
  declare readonly vmName: pulumi.Output<string>;
  /** The host as it appears in the id: `host`, `host:port`, or `local`. */
  declare readonly host: pulumi.Output<string>;
  declare readonly ip: pulumi.Output<string | null>;
  declare readonly mac: pulumi.Output<string>;
  /** running | paused | suspended | stopped | shutting-down | crashed | unknown */
  declare readonly state: pulumi.Output<string>;
  /** http://ip:port of the proxy once its address is known. */
  declare readonly endpoint: pulumi.Output<string | null>;
  /** The cached base image volume the VM's overlay backs onto. */
  declare readonly imageVolume: pulumi.Output<string>;
  declare readonly seedSha256: pulumi.Output<string>;
  declare readonly createdAt: pulumi.Output<string>;
  declare readonly libvirtUuid: pulumi.Output<string>;
  /** The address targets see through this proxy, from `egressCheck` at create; null without one. */
  declare readonly egressIp: pulumi.Output<string | null>;
  /** The exit-address entries this VM was made or last updated with (the loop guard of rotation by address). */
  declare readonly rotateEgress: pulumi.Output<Record<string, string> | null | undefined>;
  /** With "ipv6" in ipFamilies: the VM's global IPv6 address (undefined for an IPv4-only proxy). */
  declare readonly ipv6Address: pulumi.Output<string | null | undefined>;
  /** With "ipv6" in ipFamilies and egressCheck.ipv6Url: the IPv6 address targets see through this proxy. */
  declare readonly egressIpv6: pulumi.Output<string | null | undefined>;
  /** With egressCheck.ipv6Prefix (a prefix spread over the proxy): the distinct exit addresses its IPv6 samples saw. */
  declare readonly egressIpv6Distinct: pulumi.Output<number | null | undefined>;
  /** When readiness (and the egress check) passed at create, ISO 8601; null if nothing was checked. */
  declare readonly checkedAt: pulumi.Output<string | null>;
  /**
   * What the last egress re-check found wrong; null when it passed or none ran.
   * kind "unanswered": the proxy gave no answer; "egress": it answered without an address.
   */
  declare readonly egressProblem: pulumi.Output<EgressProblem | null>;

  /**
   * Adopts an existing proxy VM by id (`hosts/<host>/domains/<vmName>`, with
   * `local` as the host for the local socket) into this stack as a read-only
   * resource: read finds it on the host that `args.connection` reaches (or the
   * provider config's), refuses a domain without this stack's ownership mark,
   * and reports what the host says (state, address, vCPUs, memory, disk,
   * network). Pulumi reads it again on every `up` and never changes or deletes
   * it. Needs @pulumi/pulumi >= 3.268 in the stack (see docs/kvm.md).
   */
  static get(
    name: string,
    id: pulumi.Input<pulumi.ID>,
    args: Partial<KvmProxyArgs> = {},
    opts: pulumi.CustomResourceOptions = {},
  ): KvmProxy {
    return new KvmProxy(name, args as KvmProxyArgs, { ...opts, id });
  }

  constructor(name: string, args: KvmProxyArgs, opts: pulumi.CustomResourceOptions = {}) {
    super(
      kvmProvider,
      name,
      resourceProps(name, args, implementation.KVM_OUTPUT_KEYS),
      resourceOptions(opts, Object.keys(kvmProxyInputsSchema.shape)),
      // FROZEN: type token pulumi-nodejs:dynamic/egress-proxies:KvmProxy; a rename replaces every VM.
      "egress-proxies",
      "KvmProxy",
    );
  }
}
