/**
 * Turns a list of files into the tree the writer lays out: directories with
 * their children, each entry carrying the three names a reader may show
 * (ISO 9660 level 1, Joliet, Rock Ridge). Pure: no sector numbers yet.
 */
import { IsoWriterError } from "./errors";

export interface IsoFile {
  /** Slash-separated path inside the image, e.g. "user-data" or "openstack/latest/meta_data.json". */
  path: string;
  content: Uint8Array | string;
  /** POSIX permission bits shown by Rock Ridge readers; default 0o444. */
  mode?: number;
}

export interface FileNode {
  kind: "file";
  name: string;
  isoName: string;
  content: Uint8Array;
  mode: number;
  /** Assigned by the allocator. */
  extent: number;
}

export interface DirNode {
  kind: "dir";
  name: string;
  isoName: string;
  parent: DirNode | undefined;
  children: Array<FileNode | DirNode>;
  depth: number;
}

/** Joliet's standard limit; longer names need a non-standard extension some readers reject. */
export const MAX_NAME_LENGTH = 64;
/**
 * Rock Ridge NM entries must fit in the 255-byte directory record: libarchive
 * (bsdtar) ignores a name placed in a continuation area, so longer UTF-8 names
 * are refused rather than shown wrongly by some readers.
 */
export const MAX_NAME_UTF8_BYTES = 135;
/** ISO 9660 allows 8 directory levels; beyond that some readers refuse the tree. */
export const MAX_DEPTH = 8;
/** The sizes in directory records are 32-bit. */
const MAX_FILE_SIZE = 0xffffffff;

// Control characters are exactly what this must match.
// eslint-disable-next-line no-control-regex
const JOLIET_FORBIDDEN = /[\u0000-\u001f*/:;?\\]/;

export function buildTree(files: readonly IsoFile[], directories: readonly string[] = []): DirNode {
  const root: DirNode = {
    kind: "dir",
    name: "",
    isoName: "\u0000",
    parent: undefined,
    children: [],
    depth: 1,
  };
  const seen = new Map<string, "file" | "dir">();

  const ensureDir = (components: string[], fieldForErrors: string): DirNode => {
    let dir = root;
    for (let i = 0; i < components.length; i++) {
      const key = components.slice(0, i + 1).join("/");
      if (seen.get(key) === "file")
        throw new IsoWriterError(
          `${fieldForErrors}: "${key}" is a file, so it cannot also be a directory`,
        );
      let next = dir.children.find(
        (child): child is DirNode => child.kind === "dir" && child.name === components[i],
      );
      if (!next) {
        if (dir.depth + 1 > MAX_DEPTH)
          throw new IsoWriterError(
            `${fieldForErrors}: "${key}" would be directory level ${dir.depth + 1}; ISO 9660 allows ${MAX_DEPTH} levels including the root`,
          );
        next = {
          kind: "dir",
          name: components[i],
          isoName: "",
          parent: dir,
          children: [],
          depth: dir.depth + 1,
        };
        dir.children.push(next);
        seen.set(key, "dir");
      }
      dir = next;
    }
    return dir;
  };

  directories.forEach((path, index) => {
    const field = `directories[${index}]`;
    ensureDir(splitPath(path, field), field);
  });

  files.forEach((file, index) => {
    const field = `files[${index}].path`;
    const components = splitPath(file.path, field);
    const name = components[components.length - 1];
    const key = components.join("/");
    if (seen.has(key))
      throw new IsoWriterError(`${field}: "${key}" appears twice; give each file one path`);
    const content =
      typeof file.content === "string" ? Buffer.from(file.content, "utf8") : file.content;
    if (content.byteLength > MAX_FILE_SIZE)
      throw new IsoWriterError(
        `files[${index}] ("${key}") is ${content.byteLength} bytes; ISO 9660 files stop at 4 GiB - 1`,
      );
    const mode = file.mode ?? 0o444;
    if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777)
      throw new IsoWriterError(`files[${index}].mode must be permission bits between 0 and 0o7777`);
    const parent = ensureDir(components.slice(0, -1), field);
    seen.set(key, "file");
    parent.children.push({ kind: "file", name, isoName: "", content, mode, extent: 0 });
  });

  assignIsoNames(root);
  return root;
}

function splitPath(path: string, field: string): string[] {
  if (typeof path !== "string" || path.length === 0)
    throw new IsoWriterError(`${field} must be a non-empty path`);
  const components = path.replace(/^\/+/, "").split("/");
  for (const component of components) {
    if (component === "" || component === "." || component === "..")
      throw new IsoWriterError(
        `${field} "${path}" has an empty, "." or ".." component; use plain names joined by "/"`,
      );
    if (component.length > MAX_NAME_LENGTH)
      throw new IsoWriterError(
        `${field}: name "${component.slice(0, 20)}…" is ${component.length} characters; Joliet allows ${MAX_NAME_LENGTH}`,
      );
    const utf8Length = Buffer.byteLength(component, "utf8");
    if (utf8Length > MAX_NAME_UTF8_BYTES)
      throw new IsoWriterError(
        `${field}: name "${component.slice(0, 20)}…" is ${utf8Length} bytes in UTF-8; Rock Ridge names are limited to ${MAX_NAME_UTF8_BYTES} here, so shorten it`,
      );
    if (JOLIET_FORBIDDEN.test(component))
      throw new IsoWriterError(
        `${field}: name ${JSON.stringify(component)} contains a control character or one of * / : ; ? \\, which Joliet cannot store`,
      );
    if (/[\ud800-\udfff]/.test(component))
      throw new IsoWriterError(
        `${field}: name ${JSON.stringify(component)} has characters outside the BMP, which Joliet (UCS-2) cannot store`,
      );
  }
  return components;
}

/**
 * ISO 9660 level-1 identifiers (8.3, upper case, d-characters). Readers that
 * ignore both extensions see these; they only need to be unique and stable, so
 * collisions get a numeric tail decided in name order (deterministic).
 */
function assignIsoNames(dir: DirNode): void {
  const used = new Set<string>();
  const ordered = [...dir.children].sort((a, b) =>
    a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
  );
  for (const child of ordered) {
    child.isoName = uniqueIsoName(child, used);
    used.add(child.isoName);
    if (child.kind === "dir") assignIsoNames(child);
  }
}

function toDCharacters(text: string): string {
  return text.toUpperCase().replace(/[^A-Z0-9_]/g, "_");
}

function uniqueIsoName(node: FileNode | DirNode, used: Set<string>): string {
  const dot = node.kind === "file" ? node.name.lastIndexOf(".") : -1;
  const stem = toDCharacters(dot > 0 ? node.name.slice(0, dot) : node.name) || "_";
  const extension = dot > 0 ? toDCharacters(node.name.slice(dot + 1)).slice(0, 3) : "";
  const compose = (base: string): string => (node.kind === "dir" ? base : `${base}.${extension}`); // version ";1" is added when records are written
  let candidate = compose(stem.slice(0, 8));
  for (let counter = 1; used.has(candidate); counter++) {
    const tail = String(counter);
    candidate = compose(stem.slice(0, 8 - tail.length) + tail);
  }
  return candidate;
}

/** Directories in breadth-first order: the order path tables must list them in. */
export function directoriesInPathTableOrder(
  root: DirNode,
  sortKey: (dir: DirNode) => Buffer,
): DirNode[] {
  const ordered: DirNode[] = [root];
  for (let i = 0; i < ordered.length; i++) {
    const subdirs = ordered[i].children.filter((child): child is DirNode => child.kind === "dir");
    subdirs.sort((a, b) => Buffer.compare(sortKey(a), sortKey(b)));
    ordered.push(...subdirs);
  }
  return ordered;
}

export function filesInOrder(root: DirNode): FileNode[] {
  const files: FileNode[] = [];
  const walk = (dir: DirNode): void => {
    const children = [...dir.children].sort((a, b) =>
      a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
    );
    for (const child of children) {
      if (child.kind === "file") files.push(child);
      else walk(child);
    }
  };
  walk(root);
  return files;
}
