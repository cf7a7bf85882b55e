/**
 * One round of the exporter's EndpointSlice writing: read the member list
 * the pool published (the Secret, through the API: the mounted copy lags by
 * a kubelet sync, longer than a drain), read the Service (the slices' owner,
 * and its labels), and apply each slice that differs from what the member
 * list and the last check say. Server-side apply under the exporter's own
 * field manager, forced: the slices are the exporter's alone
 * (endpointslice.ts says why), so a conflict could only be a stray writer's.
 */
import { parseSliceMembers, SLICE_MEMBERS_KEY } from "../../components/slice-members";
import {
  desiredSlices,
  FIELD_MANAGER,
  sliceNeedsApply,
  type LiveSlice,
  type ServiceRef,
  type SliceApply,
} from "./endpointslice";
import { callApi, reasonOf, type KubernetesApi } from "./kube-api";
import type { CheckReport } from "./report";

/** What one round did, for the exporter's log and tests. */
export type SliceRound =
  | { kind: "unchanged" }
  | {
      kind: "written";
      slices: { name: string; ready: number; notReady: number; unknown: number }[];
    }
  | { kind: "failed"; reason: string };

class RoundError extends Error {}

async function getJson<T>(api: KubernetesApi, path: string, what: string): Promise<T | undefined> {
  const answer = await callApi(api, "GET", path);
  if (answer.status === 404) return undefined;
  if (answer.status !== 200) throw new RoundError(`reading ${what}: ${reasonOf(answer)}`);
  return JSON.parse(answer.body) as T;
}

export async function writeSlices(
  api: KubernetesApi,
  ref: ServiceRef,
  report: CheckReport | undefined,
): Promise<SliceRound> {
  const core = `/api/v1/namespaces/${ref.namespace}`;
  const slicesPath = `/apis/discovery.k8s.io/v1/namespaces/${ref.namespace}/endpointslices`;
  const secretName = `Secret ${ref.namespace}/${ref.name}`;
  try {
    const secret = await getJson<{ data?: Record<string, string> }>(
      api,
      `${core}/secrets/${ref.name}`,
      secretName,
    );
    const encoded = secret?.data?.[SLICE_MEMBERS_KEY];
    if (encoded === undefined)
      throw new RoundError(
        `${secretName} has no ${SLICE_MEMBERS_KEY} (not published yet, or by a pool older than this exporter); the slices are left as they are`,
      );
    const members = parseSliceMembers(
      Buffer.from(encoded, "base64").toString("utf8"),
      `${secretName} ${SLICE_MEMBERS_KEY}`,
    );
    const service = await getJson<{ metadata?: { uid?: string; labels?: Record<string, string> } }>(
      api,
      `${core}/services/${ref.name}`,
      `Service ${ref.namespace}/${ref.name}`,
    );
    const uid = service?.metadata?.uid;
    if (uid === undefined)
      throw new RoundError(
        `Service ${ref.namespace}/${ref.name} is not there: no slice is written for it`,
      );
    const labels = service?.metadata?.labels ?? {};
    const wanted = desiredSlices({ ...ref, uid, labels }, members, report);
    // A pool that dropped IPv6 keeps its IPv6 slice, emptied, until the Service goes.
    const emptied =
      wanted.ipv6 ?? desiredSlices({ ...ref, uid, labels }, { ...members, ipv6: [] }, report).ipv6!;
    const written: Extract<SliceRound, { kind: "written" }>["slices"] = [];
    for (const [desired, createIfMissing] of [
      [wanted.ipv4, true],
      [emptied, wanted.ipv6 !== undefined],
    ] as [SliceApply, boolean][]) {
      const path = `${slicesPath}/${desired.metadata.name}`;
      const live = await getJson<LiveSlice>(
        api,
        path,
        `EndpointSlice ${ref.namespace}/${desired.metadata.name}`,
      );
      if ((live === undefined && !createIfMissing) || !sliceNeedsApply(live, desired)) continue;
      const applied = await callApi(
        api,
        "PATCH",
        `${path}?fieldManager=${FIELD_MANAGER}&force=true`,
        { contentType: "application/apply-patch+yaml", text: JSON.stringify(desired) },
      );
      if (applied.status !== 200 && applied.status !== 201)
        throw new RoundError(
          `applying EndpointSlice ${ref.namespace}/${desired.metadata.name}: ${reasonOf(applied)}`,
        );
      const ready = (value: boolean | undefined) =>
        desired.endpoints.filter((endpoint) => endpoint.conditions.ready === value).length;
      written.push({
        name: desired.metadata.name,
        ready: ready(true),
        notReady: ready(false),
        unknown: ready(undefined),
      });
    }
    return written.length === 0 ? { kind: "unchanged" } : { kind: "written", slices: written };
  } catch (error) {
    // One round's failure is logged; the next round starts from what is there.
    return { kind: "failed", reason: (error as Error).message };
  }
}

/** The log lines of a round; none for a round that changed nothing. */
export function describeSliceRound(ref: ServiceRef, round: SliceRound): string[] {
  switch (round.kind) {
    case "unchanged":
      return [];
    case "written":
      return round.slices.map(
        (slice) =>
          `EndpointSlice ${ref.namespace}/${slice.name} written: ${slice.ready} ready, ${slice.notReady} not ready, ${slice.unknown} not checked yet`,
      );
    case "failed":
      return [round.reason];
  }
}
