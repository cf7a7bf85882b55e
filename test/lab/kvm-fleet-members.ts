/**
 * The stored state of a fleet of KvmProxy members (kvm-fleet.ts) as the
 * engine holds it, and one refresh of them through the dynamic-provider
 * server: what the scale bench and the shared-listing engine test both do.
 */
import type { OwnerIdentity } from "../../provider/common/mark";
import { hostLabel } from "../../provider/kvm/naming";
import {
  captureResourceInputs,
  urnOf,
  CONSUMER_IDENTITY,
  type ConsumerProject,
  type DynamicProviderServer,
  type Props,
} from "../engine/harness";
import type { StoredMember } from "../engine/refresh-as-engine";
import { labConnection } from "./kvm-support";
import type { LabEnv } from "./lab";
import type { FleetDomain } from "./kvm-fleet";

export interface FleetTemplate {
  type: string;
  inputs: Props;
}

/**
 * One member's inputs as the pool's program registers them, captured once:
 * every member differs only in its name and owner. `socketPath` is the tap's,
 * so the host's count includes every call the provider makes.
 */
export async function captureFleetTemplate(
  project: ConsumerProject,
  lab: LabEnv,
  socketPath: string,
): Promise<FleetTemplate> {
  const captured = await captureResourceInputs(project, "KvmProxy", "fleet-template", {
    connection: labConnection(lab),
    socketPath,
    pool: lab.pool,
    network: { bridge: lab.bridge },
    domainType: "qemu",
    memoryMiB: 256,
    vcpus: 1,
    firmware: "bios",
    startOnBoot: false,
    // Never fetched: a read does not look at the image.
    image: { url: "http://image.invalid/proxy.qcow2", sha256: "0".repeat(64) },
    userData: "#cloud-config\nruncmd: [echo fleet]\n",
    readiness: { mode: "none" },
    vmName: "fleet-template",
  });
  return { type: captured.type, inputs: captured.inputs };
}

export const fleetOwner = (resource: string): OwnerIdentity => ({
  project: CONSUMER_IDENTITY.project,
  stack: CONSUMER_IDENTITY.stack,
  resource,
});

/**
 * Each domain as state records it after its create: the checked inputs and
 * the outputs read needs to find it (its UUID, its creation time). The first
 * refresh fills in the rest, as `pulumi refresh` after `up` would.
 */
export async function fleetMembers(
  server: DynamicProviderServer,
  template: FleetTemplate,
  domains: readonly FleetDomain[],
): Promise<StoredMember[]> {
  return Promise.all(
    domains.map(async (domain) => {
      const urn = urnOf(CONSUMER_IDENTITY, template.type, domain.name);
      const news = { ...template.inputs, vmName: domain.name, owner: fleetOwner(domain.name) };
      const checked = await server.check(urn, {}, news);
      if (checked.failures.length > 0)
        throw new Error(`${domain.name}: check failed: ${JSON.stringify(checked.failures)}`);
      return {
        urn,
        id: `hosts/${hostLabel(template.inputs.connection as { host: string; port: number })}/domains/${domain.name}`,
        inputs: checked.inputs,
        outputs: {
          ...checked.inputs,
          createdAt: domain.createdAt,
          libvirtUuid: domain.uuid,
        },
      };
    }),
  );
}

/** The members as a refresh left them: its replies become the stored state. */
export const refreshedMembers = (
  members: readonly StoredMember[],
  replies: ReadonlyArray<{ id: string; properties: Props; inputs: Props }>,
): StoredMember[] =>
  members.map((member, index) => ({
    urn: member.urn,
    id: replies[index]!.id,
    outputs: replies[index]!.properties,
    inputs: replies[index]!.inputs,
  }));
