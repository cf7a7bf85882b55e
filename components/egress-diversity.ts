/**
 * Egress diversity: a pool is worth as many networks as it has distinct
 * egress addresses. Two proxies behind one NAT address add capacity, not
 * diversity. Pure functions; the pool turns them into an output, a warning
 * in `pulumi up`, or (requireDistinctEgress) an error before publishing.
 */
import { isYounger } from "../provider/common/egress-rotation";
import { rotateEgressEntry } from "../provider/common/exit-address";

/** One egress address and the proxies (pool keys, `<backend>-<index>`) behind it. */
export interface EgressGroup {
  address: string;
  proxies: string[];
}

/** Groups proxies by the address their egress check saw; proxies without one are left out. */
export function groupByEgress(
  proxies: readonly { name: string; egressIp: string | null | undefined }[],
): EgressGroup[] {
  const groups = new Map<string, string[]>();
  for (const proxy of proxies) {
    if (proxy.egressIp === null || proxy.egressIp === undefined) continue;
    const members = groups.get(proxy.egressIp) ?? [];
    members.push(proxy.name);
    groups.set(proxy.egressIp, members);
  }
  return [...groups.entries()]
    .map(([address, members]) => ({ address, proxies: [...members].sort() }))
    .sort((a, b) => b.proxies.length - a.proxies.length || a.address.localeCompare(b.address));
}

/** The groups with more than one proxy. */
export const sharedEgress = (groups: readonly EgressGroup[]): EgressGroup[] =>
  groups.filter((group) => group.proxies.length > 1);

/** One sentence naming every shared address and its proxies, or undefined when all differ. */
export function sharedEgressMessage(
  poolName: string,
  groups: readonly EgressGroup[],
): string | undefined {
  const shared = sharedEgress(groups);
  if (shared.length === 0) return undefined;
  const proxies = groups.reduce((total, group) => total + group.proxies.length, 0);
  const list = shared.map((group) => `${group.address} (${group.proxies.join(", ")})`).join("; ");
  return `EgressProxyPool ${poolName}: ${proxies} proxies leave from ${groups.length} distinct egress address${groups.length === 1 ? "" : "es"}; shared: ${list}. Proxies behind one address add capacity, not diversity (see docs/egress.md)`;
}

/**
 * The members to rotate so that every address is left by one proxy: all but
 * the first (by key) of each shared group. The pool names them when
 * requireDistinctEgress refuses a pool, and `egress-proxies check` prints the
 * same change: a collision is the pool's finding, since only the pool sees
 * every member, and a resource's plan cannot depend on its siblings' outputs
 * without serializing their creates.
 */
export function membersToRotate(groups: readonly EgressGroup[]): string[] {
  return sharedEgress(groups).flatMap((group) => group.proxies.slice(1));
}

/** A `rotate` text for a change suggested at `at`: the time to the minute (see rotateChange). */
export function rotationText(at: Date): string {
  return `${at.toISOString().slice(0, 16)}Z`;
}

/**
 * The pool argument that rotates `members` at the next `up`. The text is the time to the minute, not
 * the date: a date changes nothing for a member already rotated that day, and the same collision found
 * again would be answered with the same no-op. With the pool's `current` entries, a text equal to one
 * of them gets a suffix so that it always differs.
 */
export function rotateChange(
  members: readonly string[],
  at = new Date(),
  current: Readonly<Record<string, string>> = {},
): string {
  const base = rotationText(at);
  const textFor = (member: string): string => {
    let text = base;
    for (let n = 2; current[member] === text; n += 1) text = `${base}-${n}`;
    return text;
  };
  return `rotate: { ${members.map((member) => `"${member}": "${textFor(member)}"`).join(", ")} }`;
}

/** What the pool does about shared exit addresses: the groups, and a warning or a refusal. */
export interface EgressVerdict {
  groups: EgressGroup[];
  warning?: string;
  refusal?: string;
}

/**
 * The pool's verdict on its members' exit addresses. With `onCollision:
 * "rotate"` a shared address is the provider's to act on (the younger member
 * is replaced at the next `up --refresh`, provider/common/collision-rotation.ts):
 * a warning says which; only a member made anew for that address that still
 * leaves from it (one NAT for the network) ends the hope: then as without it.
 * `entries[i]` are the exit-address entries `proxies[i]` was made with.
 */
export function egressVerdict(
  poolName: string,
  options: {
    requireDistinct: boolean;
    onCollision: "fail" | "rotate";
    rotate?: Record<string, string>;
  },
  proxies: readonly {
    name: string;
    egressIp: string | null | undefined;
    createdAt?: string | null;
  }[],
  entries: readonly (Record<string, string> | null | undefined)[] = [],
): EgressVerdict {
  const groups = groupByEgress(proxies);
  const message = sharedEgressMessage(poolName, groups);
  if (message === undefined) return { groups };
  const refuse = (why: string) =>
    options.requireDistinct
      ? { groups, refusal: `${message}. ${why}` }
      : { groups, warning: `${message}. ${why}` };
  if (options.onCollision !== "rotate")
    return options.requireDistinct
      ? refuse(
          `requireDistinctEgress is true, so nothing is published: place the proxies on different networks, drop requireDistinctEgress, or replace the later members with ${rotateChange(membersToRotate(groups), new Date(), options.rotate)} (a VM member only; a new VM may get a new exit address), or set onCollision: "rotate"`,
        )
      : { groups, warning: message };
  const byName = new Map(
    proxies.map((proxy, index) => [proxy.name, { proxy, made: entries[index] }]),
  );
  const younger: string[] = [];
  const stuck: string[] = [];
  for (const group of sharedEgress(groups)) {
    const members = group.proxies.map((name) => ({
      name,
      createdAt: byName.get(name)?.proxy.createdAt,
    }));
    const oldest = members.reduce((a, b) => (isYounger(a, b) ? b : a));
    for (const member of members.filter((each) => each !== oldest)) {
      const madeFor = rotateEgressEntry(byName.get(member.name)?.made, group.address) !== undefined;
      (madeFor ? stuck : younger).push(member.name);
    }
  }
  if (stuck.length > 0)
    return refuse(
      `onCollision is "rotate", but ${stuck.join(", ")} ${stuck.length === 1 ? "was" : "were"} made anew for that and still ${stuck.length === 1 ? "leaves" : "leave"} from the same address: the network gives its VMs one exit address, and rotation cannot separate them; place the proxies on different networks${options.requireDistinct ? " or drop requireDistinctEgress" : ""}`,
    );
  return {
    groups,
    warning: `${message}. onCollision is "rotate": the next \`pulumi up --refresh\` replaces ${younger.join(", ")} (the younger of each pair, within maxUnavailable)`,
  };
}
