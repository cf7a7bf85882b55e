/**
 * Where each proxy of a pool goes. Pure and separately tested, like awsx's
 * subnet distributor: the component only declares what this decides.
 *
 * Stability is the point. Each proxy is named `<backend>-<index>` with
 * indices counted per backend, and the weighted split hands out proxies one
 * at a time (Sainte-Laguë), so the split for N+1 proxies is the split for N
 * plus one. Growing or shrinking `count` therefore adds or removes proxies at
 * the end of some backend's list and never renames, so never replaces, one
 * that stays.
 */

export interface PlacementBackend {
  /** Unique in the pool; part of every child's resource name. */
  name: string;
  /** Share of the weighted split; default 1. */
  weight?: number;
  /** A fixed number of proxies on this backend; it then takes no part in the weighted split. */
  count?: number;
  /** The most proxies this backend can hold (a static backend: the URLs it lists); no limit when unset. */
  capacity?: number;
}

export interface PlacedProxy {
  backend: string;
  /** 0-based, counted per backend. */
  index: number;
  /** `<backend>-<index>`: the stable part of the child resource name. */
  key: string;
}

export class PlacementError extends Error {}

const BACKEND_NAME = /^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$/;

/** Problems with a placement request, each naming the field and the fix. */
export function placementProblems(
  backends: readonly PlacementBackend[],
  count: number | undefined,
): string[] {
  const problems: string[] = [];
  if (backends.length === 0)
    problems.push("backends must list at least one backend (a KVM host, a Proxmox node, …)");
  const seen = new Set<string>();
  backends.forEach((backend, index) => {
    const field = `backends[${index}]`;
    if (!BACKEND_NAME.test(backend.name))
      problems.push(
        `${field}.name ${JSON.stringify(backend.name)} must be a short DNS label (lower-case letters, digits, '-', at most 32 characters), e.g. "kvm1"`,
      );
    if (seen.has(backend.name))
      problems.push(
        `${field}.name ${JSON.stringify(backend.name)} is used twice; names must be unique`,
      );
    seen.add(backend.name);
    if (backend.weight !== undefined && !(Number.isFinite(backend.weight) && backend.weight > 0))
      problems.push(`${field}.weight must be a number above 0, e.g. 2 for twice the share`);
    if (
      backend.count !== undefined &&
      !(Number.isInteger(backend.count) && backend.count >= 0 && backend.count <= 1000)
    )
      problems.push(`${field}.count must be a whole number from 0 to 1000`);
    else if (
      backend.count !== undefined &&
      backend.capacity !== undefined &&
      backend.count > backend.capacity
    )
      problems.push(
        `${field}.count is ${backend.count} but that backend has only ${backend.capacity} ${backend.capacity === 1 ? "proxy" : "proxies"}; lower its count or list more`,
      );
  });
  const fixed = backends.reduce((sum, backend) => sum + (backend.count ?? 0), 0);
  const weighted = backends.filter((backend) => backend.count === undefined);
  if (count === undefined) {
    if (weighted.length > 0 && backends.length > 0)
      problems.push(
        `count is required when a backend has no count of its own (${weighted.map((b) => b.name).join(", ")}); set count, or give every backend a count`,
      );
  } else if (!(Number.isInteger(count) && count >= 0 && count <= 1000)) {
    problems.push("count must be a whole number from 0 to 1000");
  } else if (weighted.length === 0 && count !== fixed) {
    problems.push(
      `count is ${count} but the backends' counts add up to ${fixed}; drop count or make them agree`,
    );
  } else if (count < fixed) {
    problems.push(
      `count is ${count} but backends with a fixed count already take ${fixed}; raise count or lower those counts`,
    );
  } else if (weighted.every((backend) => backend.capacity !== undefined)) {
    const room = weighted.reduce((sum, backend) => sum + (backend.capacity ?? 0), 0);
    if (count - fixed > room)
      problems.push(
        `count is ${count} but the backends hold at most ${fixed + room} proxies (${weighted.map((b) => `${b.name}: ${b.capacity}`).join(", ")}); lower count or list more proxies`,
      );
  }
  return problems;
}

/**
 * How many proxies each backend gets: fixed counts as given, the rest split by
 * weight with Sainte-Laguë's sequential rule (ties go to the backend listed
 * first). House-monotone: one more proxy in total never takes one away.
 */
export function proxiesPerBackend(
  backends: readonly PlacementBackend[],
  count: number | undefined,
): Map<string, number> {
  const problems = placementProblems(backends, count);
  if (problems.length > 0) throw new PlacementError(problems.join("; "));
  const perBackend = new Map(backends.map((backend) => [backend.name, backend.count ?? 0]));
  const weighted = backends.filter((backend) => backend.count === undefined);
  const fixed = backends.reduce((sum, backend) => sum + (backend.count ?? 0), 0);
  for (let remaining = (count ?? fixed) - fixed; remaining > 0; remaining--) {
    let best = weighted[0];
    let bestPriority = -1;
    for (const backend of weighted) {
      if (backend.capacity !== undefined && perBackend.get(backend.name)! >= backend.capacity)
        continue; // full: the next backend by weight takes the proxy
      const priority = (backend.weight ?? 1) / (2 * perBackend.get(backend.name)! + 1);
      if (priority > bestPriority) {
        best = backend;
        bestPriority = priority;
      }
    }
    perBackend.set(best.name, perBackend.get(best.name)! + 1);
  }
  return perBackend;
}

/** Every proxy of the pool, backend by backend in the order given. */
export function placeProxies(
  backends: readonly PlacementBackend[],
  count: number | undefined,
): PlacedProxy[] {
  const perBackend = proxiesPerBackend(backends, count);
  return backends.flatMap((backend) =>
    Array.from({ length: perBackend.get(backend.name)! }, (_, index) => ({
      backend: backend.name,
      index,
      key: `${backend.name}-${index}`,
    })),
  );
}
