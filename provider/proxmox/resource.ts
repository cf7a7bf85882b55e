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
import { proxmoxProxyInputsSchema } from "./schema";
import type { EgressProblem } from "../common/egress-recheck";

/**
 * The provider Pulumi serializes into state: the implementation module itself,
 * which the closure serializer emits as one `require` of this package (about
 * 300 bytes per copy where seven wrapper functions took 2000, stored in both
 * inputs and outputs of every member), so no credential or live handle ends
 * up in the closure.
 *
 * FROZEN: every ProxmoxProxy's state stores this closure, which requires
 * `egress-proxies/dist/provider/proxmox/provider.js`; the dynamic-provider server
 * calls configure, check, diff, create, read, update and delete on it, and the
 * closures stored by earlier releases call remove, and deleteProxy. delete and refresh
 * run that stored code. Moving the module or renaming an export needs a shim
 * at the old path (docs/frozen-api.md; test/engine/frozen-api.test.ts).
 */
const proxmoxProvider: pulumi.dynamic.ResourceProvider = implementation;

export interface ProxmoxProxyArgs extends IpFamilyArgs {
  /** API URL, e.g. https://pve.example:8006. Else config egress-proxies:proxmoxEndpoint or PROXMOX_VE_ENDPOINT. */
  apiEndpoint?: pulumi.Input<string>;
  /** `user@realm!tokenid=secret`, stored as a secret. Else config egress-proxies:proxmoxApiToken or PROXMOX_VE_API_TOKEN. */
  apiToken?: pulumi.Input<string>;
  /** PEM of the CA that signed the API certificate. Else config egress-proxies:proxmoxCaCert or PROXMOX_VE_CA_CERT (PEM or file). */
  caCertPem?: pulumi.Input<string>;
  /** Skip TLS verification (explicit opt-out). */
  insecure?: pulumi.Input<boolean>;
  /** The Proxmox node the VM runs on. */
  node: pulumi.Input<string>;
  /** The template to full-clone (see docs/proxmox.md for how to prepare it). */
  templateVmid: pulumi.Input<number>;
  /** Storage for the VM's disk (must support images), e.g. local-lvm. */
  diskStorage: pulumi.Input<string>;
  /** Directory storage for the per-VM NoCloud seed ISOs (ISO content only). */
  seedStorage: pulumi.Input<string>;
  /** VMIDs this package may use; each VM prefers one derived from its name. Default 20000–29999. */
  vmidRange?: pulumi.Input<{ first: pulumi.Input<number>; last: pulumi.Input<number> }>;
  /** Fixed VM name (a DNS label); generated from the resource name when unset. */
  vmName?: pulumi.Input<string>;
  cores?: pulumi.Input<number>;
  memoryMiB?: pulumi.Input<number>;
  /** Absolute boot disk size; unset keeps the template's; never smaller than it. */
  diskGiB?: pulumi.Input<number>;
  /** Rewrites net0's bridge (the clone's MAC is kept). */
  bridge?: pulumi.Input<string>;
  /** 1–4094; rewrites net0 with tag=. */
  vlanTag?: pulumi.Input<number>;
  /** Proxmox tags (folded to lower case); `egress-proxies` is always added. */
  tags?: pulumi.Input<pulumi.Input<string>[]>;
  /** cloud-init user-data, any format, byte for byte; stored as a secret. */
  userData?: pulumi.Input<string>;
  /** Extra vendor-data, any format; stored as a secret. */
  vendorData?: pulumi.Input<string>;
  /** Files the user-data writes, delivered in place when they change (docs/day2.md, "Upgrades in place"); a secret. */
  guestFiles?: GuestFilesArgs;
  /** Install qemu-guest-agent via a vendor-data script (default true). */
  installGuestAgent?: pulumi.Input<boolean>;
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
  /** Start the VM when the node boots (PVE's `onboot`; default true); drift shows on refresh, `up` heals it. */
  startOnBoot?: pulumi.Input<boolean>;
  /**
   * Keep the VM running (default true): a refresh that finds it stopped
   * reports `running: false`, and the next `up` starts it again in place and
   * waits for readiness (and the egress check). false leaves a new VM stopped
   * and stops a running one (`qm stop`); it stays defined.
   */
  running?: pulumi.Input<boolean>;
  readiness?: pulumi.Input<{
    mode?: pulumi.Input<"port" | "address" | "none">;
    port?: pulumi.Input<number>;
    /** With "port": also wait for a request without credentials to be answered 407 (the proxy's own configuration, not a package default). */
    authRequired?: pulumi.Input<boolean>;
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

/** One egress proxy VM on a Proxmox VE node, cloned from a template through the REST API. */
export class ProxmoxProxy extends pulumi.dynamic.Resource {
  declare readonly vmName: pulumi.Output<string>;
  declare readonly vmid: pulumi.Output<number>;
  declare readonly node: pulumi.Output<string>;
  declare readonly host: pulumi.Output<string>;
  declare readonly ip: pulumi.Output<string | null>;
  declare readonly mac: pulumi.Output<string | null>;
  declare readonly state: pulumi.Output<string>;
  /** http://ip:port of the proxy once its address is known. */
  declare readonly endpoint: pulumi.Output<string | null>;
  declare readonly seedVolume: pulumi.Output<string>;
  declare readonly seedSha256: pulumi.Output<string>;
  declare readonly createdAt: pulumi.Output<string>;
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
   * Adopts an existing proxy VM by id (`nodes/<node>/qemu/<vmid>`) into this
   * stack as a read-only resource: read refuses a VM without this stack's
   * ownership mark and reports what Proxmox says (name, state, address, cores,
   * memory, net0, disk, tags). Pulumi reads it again on every `up` and never
   * changes or deletes it. Credentials come from `args`, config or the
   * environment (see docs/proxmox.md). Needs @pulumi/pulumi >= 3.268 in the stack.
   */
  static get(
    name: string,
    id: pulumi.Input<pulumi.ID>,
    args: Partial<ProxmoxProxyArgs> = {},
    opts: pulumi.CustomResourceOptions = {},
  ): ProxmoxProxy {
    return new ProxmoxProxy(name, args as ProxmoxProxyArgs, { ...opts, id });
  }

  constructor(name: string, args: ProxmoxProxyArgs, opts: pulumi.CustomResourceOptions = {}) {
    super(
      proxmoxProvider,
      name,
      resourceProps(name, args, implementation.PROXMOX_OUTPUT_KEYS),
      resourceOptions(opts, Object.keys(proxmoxProxyInputsSchema.shape)),
      // FROZEN: type token pulumi-nodejs:dynamic/egress-proxies:ProxmoxProxy; a rename replaces every VM.
      "egress-proxies",
      "ProxmoxProxy",
    );
  }
}
