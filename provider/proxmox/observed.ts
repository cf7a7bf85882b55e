/**
 * What refresh and `.get` report about a Proxmox VM: its config in the terms
 * of ProxmoxProxy's inputs. A VM changed by hand then shows as drift, and the
 * next `up` proposes what the change table says (diff.ts). Pure.
 */
import { MARK_TAG } from "../common/mark";
import { normalizeTags } from "./schema";
import { bootDisk, diskSizeBytes, GIB, parseNetDevice } from "./vm-config";

type Props = Record<string, unknown>;
type VmConfig = Record<string, string | undefined>;

/** PVE's defaults for a config without the key. */
const DEFAULT_CORES = 1;
const DEFAULT_MEMORY_MIB = 512;

/**
 * The previous inputs with what the VM's config says: name, cores, memory,
 * tags, and net0's bridge and VLAN tag and the boot disk's size. The last
 * three are optional inputs ("as cloned" when unset): they are reported when
 * the inputs set them, or, adopting, when the mark says the creating program
 * set them (`asClonedSet`, adoption.ts); otherwise the template's own bridge
 * or size would read as drift forever.
 */
export function observedInputs(
  previous: Props,
  config: VmConfig,
  asClonedSet: ReadonlySet<string> = new Set(),
): Props {
  const observed: Props = {
    ...previous,
    vmName: config.name ?? previous.vmName,
    cores: wholeNumberOf(config.cores) ?? DEFAULT_CORES,
    // PVE 8.1+ may write memory as a property string ("current=2048").
    memoryMiB:
      wholeNumberOf(/^(?:current=)?(\d+)/.exec(config.memory ?? "")?.[1]) ?? DEFAULT_MEMORY_MIB,
    tags: tagsOf(config.tags, asList(previous.tags).includes(MARK_TAG)),
    // PVE's default for a config without onboot is off.
    startOnBoot: config.onboot !== undefined && /^1$/.test(config.onboot.trim()),
  };
  const reports = (key: string) => asClonedSet.has(key) || previous[key] !== undefined;
  // One the creating program set and the VM no longer has is null, not missing: an adopted
  // state compares only the values it holds (common/diff.ts), and this is one.
  const report = (key: string, value: unknown) =>
    value === undefined && asClonedSet.has(key)
      ? (observed[key] = null)
      : setOrDelete(observed, key, value);
  const net0 = config.net0 === undefined ? undefined : parseNetDevice(config.net0);
  const options = new Map(net0?.options ?? []);
  if (reports("bridge")) report("bridge", options.get("bridge"));
  if (reports("vlanTag")) report("vlanTag", wholeNumberOf(options.get("tag")));
  if (reports("diskGiB")) {
    const disk = bootDisk(config);
    const bytes = disk === undefined ? undefined : diskSizeBytes(config[disk]);
    report("diskGiB", bytes === undefined ? undefined : gibOf(bytes));
  }
  return observed;
}

/**
 * The user's tags as ProxmoxProxy keeps them: folded, sorted, without our mark
 * tag (always added), unless the user listed that one too.
 */
export function tagsOf(value: string | undefined, userListsMarkTag = false): string[] {
  const tags = (value ?? "").split(/[;,\s]+/).filter((tag) => tag !== "");
  return normalizeTags(tags).filter((tag) => userListsMarkTag || tag !== MARK_TAG);
}

const asList = (value: unknown): unknown[] => (Array.isArray(value) ? value : []);

/** Whole GiB as a whole number; any other size keeps its fraction (3 places). */
function gibOf(bytes: number): number {
  return Number.isInteger(bytes / GIB) ? bytes / GIB : Math.round((bytes / GIB) * 1000) / 1000;
}

function wholeNumberOf(value: string | undefined): number | undefined {
  if (value === undefined || !/^\d+$/.test(value.trim())) return undefined;
  return Number(value);
}

function setOrDelete(props: Props, key: string, value: unknown): void {
  if (value === undefined) delete props[key];
  else props[key] = value;
}
