/**
 * A fleet of ProxmoxProxy members spread over simulated nodes
 * (test/pve-sim/simulator.ts, one simulator per node, each its own API
 * endpoint, as standalone nodes or a cluster reached by each node's address
 * are), to be refreshed through the dynamic-provider server: the scale bench
 * (test/bench/scale.ts) times it, the engine test of issue 32
 * (proxmox-scale.test.ts) checks what its Reads find and ask.
 *
 * Building a thousand VMs through Create would take most of the bench's
 * budget and measure nothing it reports, so the fleet is made the cheap way:
 * one real Create per node (through the server, with the inputs the pool
 * gives a member, read back from the pool's own program under mocks), then
 * the other members as copies of that node's VM in the simulator's state: the
 * same config with the member's own name, VMID, MAC, boot disk and seed ISO,
 * and the state a create would have recorded for it (its inputs from the
 * server's own Check, so each has its autonamed vmName). Only the refresh is
 * measured, and every Read must find its member as recorded (running, same
 * VM, no drift, nothing to replace), or the suite fails rather than time a
 * failure.
 *
 * The members' Read is the hypervisor's part only (readiness "address", no
 * egress re-check): the re-check's probe through each proxy is what the
 * StaticProxy half measures (scale-static.ts).
 */
import type { PveSimulator } from "../pve-sim/simulator";
import { PveSimulator as Simulator } from "../pve-sim/simulator";
import { proxmoxMacFor } from "../../provider/proxmox/vm-config";
import { seedVolumeId } from "../../provider/proxmox/seed";
import { REPLACE_BECAUSE_KEY } from "../../provider/common/replacement";
import {
  CONSUMER_IDENTITY,
  DynamicProviderServer,
  urnOf,
  type ConsumerProject,
  type Props,
} from "./harness";
import type { StoredMember } from "./refresh-as-engine";

/** How many nodes the scale bench spreads its fleet over. */
export const NODES = 4;
/** What one PVE API request costs on a LAN (pveproxy's answer time; pve.ts uses the same). */
export const PVE_LATENCY_MS = 20;
const TYPE = "pulumi-nodejs:dynamic/egress-proxies:ProxmoxProxy";

/** The guest address the simulated agent reports for a VMID (what the member's `ip` records). */
const guestAddressOf = (vmid: number): string =>
  `10.${Math.floor(vmid / 62_500) % 250}.${Math.floor(vmid / 250) % 250}.${(vmid % 250) + 2}`;

export interface ProxmoxFleet {
  sims: PveSimulator[];
  /** The provider config a server is configured with (the API token). */
  config: Record<string, string>;
  /** Grows the fleet to `count` members (VMs in the simulators, state to read them with). */
  growTo(count: number): Promise<StoredMember[]>;
  stop(): Promise<void>;
}

/**
 * Starts the node simulators and creates one member per node through a
 * server; `memberInputs` are a member's inputs as the pool registered them.
 */
export async function startProxmoxFleet(
  project: ConsumerProject,
  memberInputs: Props,
  nodes: number = NODES,
): Promise<ProxmoxFleet> {
  const sims: PveSimulator[] = [];
  const setup = { server: undefined as DynamicProviderServer | undefined };
  const stop = async () => {
    await setup.server?.stop();
    for (const sim of sims) {
      await sim.settle();
      await sim.close();
    }
  };
  try {
    for (let node = 1; node <= nodes; node++) {
      const sim = new Simulator({
        node: `pve${node}`,
        latencyMs: PVE_LATENCY_MS,
        agentDelayMs: 20,
        guestAddress: guestAddressOf,
      });
      await sim.listen();
      sims.push(sim);
    }
    const config = { "egress-proxies:proxmoxApiToken": sims[0]!.tokenFor() };
    const server = await DynamicProviderServer.start(project);
    setup.server = server;
    await server.configure(config);
    const templates = await Promise.all(
      sims.map((sim) => createTemplateMember(server, sim, memberInputs)),
    );
    const members: StoredMember[] = [];
    const growTo = async (count: number): Promise<StoredMember[]> => {
      for (let index = members.length; index < count; index++) {
        const node = index % nodes;
        members.push(await copyMember(server, sims[node]!, templates[node]!, index));
      }
      return members.slice(0, count);
    };
    return { sims, config, growTo, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

interface TemplateMember {
  news: Props;
  outputs: Props;
  vmid: number;
}

/** The inputs a pool member on `sim`'s node has, pointed at the simulator. */
function inputsOnNode(sim: PveSimulator, memberInputs: Props, name: string): Props {
  return {
    ...memberInputs,
    apiEndpoint: sim.endpoint,
    caCertPem: sim.caCertPem,
    node: sim.node,
    templateVmid: 9000,
    diskStorage: "local-lvm",
    seedStorage: "seeds",
    readiness: { mode: "address" },
    egressRecheck: false,
    timeouts: { createSeconds: 120, readySeconds: 60, deleteSeconds: 60 },
    owner: { ...CONSUMER_IDENTITY, resource: name },
  };
}

async function createTemplateMember(
  server: DynamicProviderServer,
  sim: PveSimulator,
  memberInputs: Props,
): Promise<TemplateMember> {
  const name = `scale-template-${sim.node}`;
  const urn = urnOf(CONSUMER_IDENTITY, TYPE, name);
  const news = inputsOnNode(sim, memberInputs, name);
  const checked = await server.check(urn, {}, news);
  if (checked.failures.length > 0) throw new Error(JSON.stringify(checked.failures));
  const created = await server.create(urn, checked.inputs);
  return { news, outputs: created.properties, vmid: Number(created.properties.vmid) };
}

/**
 * Member `index` on `sim`'s node: its inputs from the server's Check (its own
 * autonamed vmName), its VM a copy of the template's in the simulator's
 * state, its outputs what a create of it would have recorded.
 */
async function copyMember(
  server: DynamicProviderServer,
  sim: PveSimulator,
  template: TemplateMember,
  index: number,
): Promise<StoredMember> {
  const name = `scale-${index}`;
  const urn = urnOf(CONSUMER_IDENTITY, TYPE, name);
  const checked = await server.check(
    urn,
    {},
    { ...template.news, owner: { ...CONSUMER_IDENTITY, resource: name } },
  );
  if (checked.failures.length > 0) throw new Error(JSON.stringify(checked.failures));
  const inputs = checked.inputs;
  const vmName = String(inputs.vmName);
  const vmid = freeVmid(sim, 21_000 + index);
  const mac = proxmoxMacFor(vmName);
  const seedVolume = seedVolumeId("seeds", vmName);
  copyVm(sim, template, { vmid, vmName, mac, seedVolume, resource: name });
  const ip = guestAddressOf(vmid);
  const outputs: Props = {
    ...template.outputs,
    ...inputs,
    vmid,
    mac,
    seedVolume,
    ip,
    endpoint: `http://${ip}:3128`,
  };
  return { urn, id: `nodes/${sim.node}/qemu/${vmid}`, outputs, inputs };
}

function freeVmid(sim: PveSimulator, wanted: number): number {
  let vmid = wanted;
  while (sim.vms.has(vmid)) vmid += 5_000;
  return vmid;
}

/** The template's VM again under the member's identity, with its disk and seed on the storages. */
function copyVm(
  sim: PveSimulator,
  template: TemplateMember,
  member: { vmid: number; vmName: string; mac: string; seedVolume: string; resource: string },
): void {
  const original = sim.vms.get(template.vmid)!;
  const templateName = String(template.outputs.vmName);
  const config = { ...original.config };
  config.name = member.vmName;
  config.net0 = config.net0!.replace(
    /=([0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5})/,
    `=${member.mac.toUpperCase()}`,
  );
  config.scsi0 = `local-lvm:vm-${member.vmid}-disk-0,size=3G`;
  config.ide2 = `${member.seedVolume},media=cdrom`;
  config.description = config
    .description!.split(templateName)
    .join(member.vmName)
    .replace(/^resource=.*$/m, `resource=${member.resource}`);
  sim.vms.set(member.vmid, { ...original, vmid: member.vmid, config });
  const seeds = sim.storages.get("seeds")!;
  const templateSeed = String(template.outputs.seedVolume);
  seeds.files.set(member.seedVolume, seeds.files.get(templateSeed)!);
  sim.storages.get("local-lvm")!.files.set(`local-lvm:vm-${member.vmid}-disk-0`, Buffer.alloc(0));
}

/** Why a reply is not the member as recorded, or undefined when it is. */
export function proxmoxReadProblem(
  member: StoredMember,
  reply: { id: string; properties: Props },
): string | undefined {
  const props = reply.properties;
  if (reply.id !== member.id) return `id ${reply.id}`;
  if (props.state !== "running") return `state ${String(props.state)}`;
  if (props[REPLACE_BECAUSE_KEY] !== undefined)
    return `replace: ${String(props[REPLACE_BECAUSE_KEY])}`;
  for (const key of ["vmName", "vmid", "mac", "ip", "seedVolume", "createdAt"])
    if (props[key] !== member.outputs[key])
      return `${key} ${JSON.stringify(props[key])} ≠ ${JSON.stringify(member.outputs[key])}`;
  return undefined;
}
