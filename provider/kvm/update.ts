/** KvmProxy update: what changes in place (autostart, power, guest files), a resumed create, and the egress heal. */
import { Deadline } from "../common/deadline";
import { plainJson as plain } from "../common/check";
import { PermanentError } from "../common/errors";
import { carriedOutputs, continueCreate, deadlineFor, stepsWithin } from "../common/lifecycle";
import { isIncompleteCreate } from "../common/partial-create";
import { egressAtReadiness } from "../common/egress";
import { restartAdmitted } from "../common/disruption-rules";
import { EgressHealFailedError, needsEgressRestart } from "../common/egress-recheck";
import {
  deliverGuestFiles,
  documentKept,
  guestFilesToDeliver,
  type GuestFiles,
} from "../common/guest-files";
import { ReplaceOnNextUpError } from "../common/replacement";
import { openHost } from "./connect";
import { parseDomainXml } from "./domain-xml";
import { parseKvmResourceId } from "./naming";
import { anyInPlaceChange, inPlaceChanges, stopDomain, type InPlaceChanges } from "./power";
import { readyAfterRestart } from "./ready";
import { type KvmProxyInputs } from "./schema";
import {
  CARRIED_KEYS,
  Props,
  checkedInputs,
  endpointOf,
  ipv6Output,
  progressLog,
  requireOurs,
  toError,
} from "./steps";
import { create } from "./create";
import { findDomainOf } from "./read";
import { guestChannelOf } from "./guest-files";

/**
 * In-place changes only. Credentials, readiness and timeouts touch no VM;
 * startOnBoot sets libvirt's autostart, and running starts a VM a refresh
 * found stopped (or shuts it down) — see power.ts. A partial create in state
 * is the exception: the engine calls update on it at the next `up`, and update
 * continues the create (same host and name, so the same id).
 */
export async function update(id: string, olds: Props, news: Props): Promise<{ outs: Props }> {
  if (isIncompleteCreate(olds)) return continueCreate(id, news, create);
  const inputs = checkedInputs(news);
  const outs = carriedOutputs(olds, inputs, CARRIED_KEYS);
  const files = guestFilesToDeliver(olds, inputs);
  const changes = {
    ...inPlaceChanges(olds, inputs),
    restart: needsEgressRestart(olds, inputs) && restartAdmitted(news),
    guestFiles: inputs.running ? files : undefined,
  };
  // A VM left stopped gets its files when it runs again: state keeps what it has until then.
  if (!inputs.running && files !== undefined) Object.assign(outs, documentKept(olds));
  if (!anyInPlaceChange(changes) && !changes.restart && changes.guestFiles === undefined)
    return { outs };
  const deadline = deadlineFor(inputs.timeouts, "create");
  // Started again but never ready: stored running and marked, so the next up replaces it.
  const replaceOnNextUp = (reason: string, cause: Error) =>
    new ReplaceOnNextUpError(id, plain({ ...outs, state: "running" }), reason, cause, news);
  const live = await stepsWithin(deadline, progressLog)("update", () =>
    applyOnHost(id, olds, inputs, changes, deadline, replaceOnNextUp),
  ).catch((error: unknown) => {
    if (!changes.restart) throw error;
    // The re-check's restart did not heal it, ready or not: its rule replaces the VM new-VM-first at
    // the next refresh + up (egress-recheck.ts), gentler than the delete-first repair (replacement.ts).
    const cause = error instanceof ReplaceOnNextUpError ? (error.cause ?? error) : error;
    throw new EgressHealFailedError(id, outs, toError(cause), news);
  });
  return { outs: plain({ ...outs, ...live }) };
}

/**
 * The in-place changes on the domain found by its identity, after checking
 * the mark: autostart, and power. A VM started again is waited for like a new
 * one (readiness, then the egress check), so its outputs say what is true now.
 */
async function applyOnHost(
  id: string,
  olds: Props,
  inputs: KvmProxyInputs,
  changes: InPlaceChanges & { restart: boolean; guestFiles: GuestFiles | undefined },
  deadline: Deadline,
  replaceOnNextUp: (reason: string, cause: Error) => Error,
): Promise<Props> {
  const session = await openHost(inputs, deadline);
  const { vmName } = parseKvmResourceId(id);
  const handle = await findDomainOf(session.host, olds, vmName);
  if (handle === undefined)
    throw new PermanentError(
      `domain ${vmName} on ${session.label} is gone; run \`pulumi up --refresh\` to create it again`,
    );
  const description = parseDomainXml(await session.host.definedXml(handle));
  requireOurs(description.mark, inputs, `domain ${description.name} on ${session.label}`);
  if (changes.startOnBoot) await session.host.setAutostart(handle, inputs.startOnBoot);
  const power =
    changes.running || changes.restart
      ? await powerOnHost(session, handle, vmName, inputs, changes, deadline, replaceOnNextUp)
      : {};
  if (changes.guestFiles !== undefined && power.state !== "stopped") {
    progressLog(
      `KvmProxy ${vmName}: delivering ${changes.guestFiles.files.length} guest file(s) in place`,
    );
    await deliverGuestFiles(
      guestChannelOf(session.host, handle, deadline),
      changes.guestFiles,
      `domain ${vmName} on ${session.label}`,
    );
  }
  return power;
}

/** Power: shut down for running: false, or start (after a shutdown, for a restart) and wait like a new VM. */
async function powerOnHost(
  session: Awaited<ReturnType<typeof openHost>>,
  handle: NonNullable<Awaited<ReturnType<typeof findDomainOf>>>,
  vmName: string,
  inputs: KvmProxyInputs,
  changes: InPlaceChanges & { restart: boolean },
  deadline: Deadline,
  replaceOnNextUp: (reason: string, cause: Error) => Error,
): Promise<Props> {
  if (!inputs.running) {
    progressLog(`KvmProxy ${vmName}: shutting down (running: false)`);
    await stopDomain(session.host, handle, deadline);
    return { state: "stopped", ip: null, endpoint: null };
  }
  if (changes.restart) {
    // squid does not answer on a running VM: ACPI shutdown first (a hung guest is destroyed after the
    // grace, power.ts), then a start, as for `running: false` and back.
    progressLog(`KvmProxy ${vmName}: restarting it (refresh found its proxy not answering)`);
    await stopDomain(session.host, handle, deadline);
  } else progressLog(`KvmProxy ${vmName}: starting it again (refresh found it not running)`);
  await session.host.startDomain(handle);
  const ready = await readyAfterRestart(session.host, handle, inputs, deadline, replaceOnNextUp);
  const ip = ready?.ip ?? null;
  const ipv6 = ipv6Output(inputs, ready);
  const egress = await egressAtReadiness(ip, inputs, deadline, ipv6?.ipv6Address);
  const endpoint = ip ? endpointOf(ip, inputs) : null;
  return { state: "running", ip, endpoint, ...ipv6, ...egress, egressProblem: null };
}
