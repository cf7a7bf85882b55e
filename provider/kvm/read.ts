/** KvmProxy read: the domain as libvirt reports it, drift, damage, the egress re-check, and adoption by `.get`. */
import type * as pulumi from "@pulumi/pulumi";
import { Deadline } from "../common/deadline";
import { plainJson as plain } from "../common/check";
import { ADOPTED_KEY } from "../common/diff";
import { PermanentError } from "../common/errors";
import { deadlineFor, inputsOnly, outputsOnly, stepsWithin } from "../common/lifecycle";
import { isIncompleteCreate } from "../common/partial-create";
import { rotationDue } from "../common/egress-recheck";
import { recheckOnRead } from "../common/recheck-on-read";
import { isGoneForGood } from "../common/gone-hosts";
import { replacementReason, withReplacementReason } from "../common/replacement";
import type { DomainHandle } from "../libvirt-rpc-xdr";
import { familiesOf, proxyEndpoint } from "../common/ip-families";
import { refreshedAddresses } from "./addresses";
import { guestViewOfDomain } from "./guest-files";
import { openHost, type HostSession } from "./connect";
import { domainGoneReason, missingVolumes, missingVolumesReason, perVmVolumesLeft } from "./damage";
import { parseDomainXml, type DomainDescription } from "./domain-xml";
import { describeState, uuidBytesOf, type LibvirtHost } from "./host";
import { uuidKey, type DomainListing, type ListedDomain } from "./host-listings";
import { kvmResourceId, legacyHostLabel, macAddressFor, parseKvmResourceId } from "./naming";
import { observedInputs } from "./observed";
import { adoptedCreation } from "./adoption";
import {
  HostTarget,
  OUTPUT_KEYS,
  Props,
  hostNamesOf,
  hostTargetOf,
  requireOurs,
  uuidText,
} from "./steps";

/**
 * Refresh and `.get`. The domain is found by its identity (the libvirt UUID in
 * state, so a domain renamed by hand is still ours; the name only for `.get`
 * and for state from before the UUID was recorded), must carry this stack's
 * mark, and is reported as the host defines it: vCPUs, memory, disk size,
 * network, firmware, MAC, name. Those come back as `inputs` too, so refresh
 * shows the drift and the next `up` proposes what the change table says.
 */
export async function read(id: string, props: Props): Promise<pulumi.dynamic.ReadResult> {
  const target = hostTargetOf(props);
  const { host: idHost } = parseKvmResourceId(id); // a malformed id is refused before any connection
  // `.get` passes the user's arguments only: no output of ours has been recorded yet.
  const adopting = props.createdAt === undefined;
  // A host gone for good is not asked: state stays as recorded, for delete to give up on.
  if (!adopting && isGoneForGood(hostNamesOf(idHost, target))) return { id, props };
  const deadline = deadlineFor(target.timeouts, "read");
  return stepsWithin(deadline)("read", () => readWithin(id, props, target, adopting, deadline));
}

async function readWithin(
  id: string,
  props: Props,
  target: HostTarget,
  adopting: boolean,
  deadline: Deadline,
): Promise<pulumi.dynamic.ReadResult> {
  const { host: idHost, vmName } = parseKvmResourceId(id);
  const session = await openHost(target, deadline);
  // An id from before IPv6 labels were bracketed names the same host: it stays as it is in state.
  const legacyId = idHost !== session.label && idHost === legacyHostLabel(target.connection);
  if (adopting && idHost !== session.label && !legacyId)
    throw new PermanentError(
      `id ${JSON.stringify(id)} names host ${idHost}, but the connection reaches ${session.label}; pass the connection of that host or use the id hosts/${session.label}/domains/${vmName}`,
    );
  // The host's listing (shared by this refresh's Reads) answers identity, state and autostart.
  const listed = listedDomainOf(await session.host.domainListing(), props, vmName);
  // Listed but undefined since the listing was asked: gone, as if the listing had said so.
  const xml = listed && (await session.host.definedXmlIfAny(listed.handle));
  if (listed === undefined || xml === undefined)
    return adopting ? {} : goneDomain(session, id, props, target.pool, vmName);
  const { handle, autostart } = listed;
  const description = parseDomainXml(xml);
  const what = `domain ${description.name} on ${session.label}`;
  const mark = requireOurs(description.mark, target, what, adopting);
  // Independent questions: asked together, one round trip.
  const [diskBytes, state, missing] = await Promise.all([
    diskCapacityOf(session.host, description),
    listed.state === undefined
      ? session.host.state(handle).then((answer) => answer.state)
      : describeState(listed.state),
    missingVolumes(session.host, description),
  ]);
  const mac = description.mac ?? macAddressFor(description.name);
  const families = familiesOf(target);
  const { ip, ipv6 } = await refreshedAddresses(
    state,
    mac,
    (source) => session.host.interfaces(handle, source),
    props,
    { ...families, ...(target.ipv6 === undefined ? {} : { settings: target.ipv6 }) },
  );
  const recheck = await recheckOnRead(
    target,
    { serving: state === "running", address: ip, ...(families.ipv6 ? { ipv6 } : {}) },
    props,
    deadline,
    {
      name: description.name,
      view: (port, within) => guestViewOfDomain(session.host, handle, port, within),
    },
  );
  const rotation = rotationDue(target, mark.createdAt, recheck.finding);
  const observed: Props = {
    ...observedInputs(inputsOnly(props, OUTPUT_KEYS), {
      description,
      diskBytes,
      autostart,
      state,
    }),
    // Adopting: what the host cannot report comes from the mark (adoption.ts), when it says.
    ...(adopting ? { ...adoptedCreation(mark), [ADOPTED_KEY]: true } : {}),
    ...outputsOnly(props, OUTPUT_KEYS),
    host: session.label,
    state,
    mac,
    ip,
    endpoint: ip ? proxyEndpoint(ip, target.readiness.port) : null,
    // Only a proxy that takes IPv6 has the output: an IPv4-only one's stay as they were.
    ...(families.ipv6 ? { ipv6Address: ipv6 } : {}),
    createdAt: mark.createdAt,
    libvirtUuid: uuidText(handle.uuid),
    ...recheck.outputs,
    ...(rotation === undefined ? {} : { rotation }),
  };
  // A disk or seed gone replaces the VM; a reason an earlier update recorded stays until then.
  const outputs = withReplacementReason(
    observed,
    missing.length > 0 ? missingVolumesReason(missing) : replacementReason(props),
  );
  return {
    id: kvmResourceId(legacyId ? idHost : session.label, description.name),
    props: plain(outputs),
    inputs: plain(inputsOnly(outputs, OUTPUT_KEYS)),
  };
}

/** Identity: the UUID recorded at create; the name for `.get` and for state written before it. */
export function findDomainOf(
  host: LibvirtHost,
  props: Props,
  vmName: string,
): Promise<DomainHandle | undefined> {
  return typeof props.libvirtUuid === "string" && props.libvirtUuid !== ""
    ? host.findDomainByUuid(props.libvirtUuid)
    : host.findDomain(vmName);
}

/** The same identity as findDomainOf, answered from the host's domain listing. */
function listedDomainOf(
  listing: DomainListing,
  props: Props,
  vmName: string,
): ListedDomain | undefined {
  return typeof props.libvirtUuid === "string" && props.libvirtUuid !== ""
    ? listing.byUuid.get(uuidKey(uuidBytesOf(props.libvirtUuid)))
    : listing.byName.get(vmName);
}

/** The capacity of the domain's disk volume (the overlay), or undefined when it cannot be found. */
async function diskCapacityOf(
  host: LibvirtHost,
  description: DomainDescription,
): Promise<bigint | undefined> {
  const disk = description.volumes.find((volume) => volume.device === "disk");
  if (disk === undefined || !(await host.volumeListed(disk.pool, disk.volume))) return undefined;
  return host.volumeCapacityNamed(disk.pool, disk.volume);
}

/**
 * The domain is gone. With nothing of it left, Pulumi drops it from state and
 * the next `up` creates it again. Volumes left behind keep it in state, so a
 * refresh never turns them into leftovers that state does not name: a partial
 * create as it was (destroy removes them), a complete one marked for
 * replacement (whose delete removes them before the new VM is made).
 */
async function goneDomain(
  session: HostSession,
  id: string,
  props: Props,
  poolName: string,
  vmName: string,
): Promise<pulumi.dynamic.ReadResult> {
  const left = await perVmVolumesLeft(session.host, poolName, vmName);
  if (left.length === 0) return {};
  if (isIncompleteCreate(props)) return { id, props };
  const outputs = withReplacementReason(
    {
      ...props,
      running: false,
      state: "stopped",
      ip: null,
      endpoint: null,
      ...(props.ipv6Address === undefined ? {} : { ipv6Address: null }),
    },
    domainGoneReason(vmName, left),
  );
  return { id, props: plain(outputs), inputs: plain(inputsOnly(outputs, OUTPUT_KEYS)) };
}
