/**
 * The gateway's user-name conventions, the ones crawler tools already speak:
 * `<user>`, `<user>-session-<id>`, `<user>-host-<label>`, and both suffixes in
 * either order. The name is read as hyphen-separated words; the words
 * `session` and `host` open a suffix, which runs to the next such word. So a
 * user, a session id or a label may contain hyphens, but never the word
 * `session` or `host` on its own: the validators below refuse those, because
 * the engine's ACLs (squid-gateway.ts) could not tell where a part ends.
 */

/** The word that opens a session suffix: every request of `<user>-session-<id>` leaves through one member. */
export const SESSION_WORD = "session";
/** The word that opens a pin: `<user>-host-<label>` goes only to members that carry the label. */
export const HOST_WORD = "host";
const SUFFIX_WORDS = new Set([SESSION_WORD, HOST_WORD]);

/** A gateway user's own name: what its password is stored under. */
const USER_NAME = /^[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*$/;
/** A label a member carries (its backend's name, or one the backend declares): lower-case DNS-label words. */
const LABEL = /^[a-z0-9]+(-[a-z0-9]+)*$/;
/** A session id: letters, digits, '_', '.' and inner hyphens, as tools generate them. */
const SESSION_ID = /^[A-Za-z0-9_.]+(-[A-Za-z0-9_.]+)*$/;
const MAX_USER_NAME = 64;
const MAX_LABEL = 63;

/** What a client's user name asks for. */
export interface GatewayUserName {
  /** The user whose password is checked. */
  user: string;
  /** The session id, when the name carries one. */
  session?: string;
  /** The label the request is pinned to, when the name carries one. */
  host?: string;
}

/**
 * Reads a client's user name; undefined for a name the conventions cannot
 * read (a suffix word with nothing after it, a suffix given twice).
 */
export function parseGatewayUserName(name: string): GatewayUserName | undefined {
  const words = name.split("-");
  const firstSuffix = words.findIndex((word) => SUFFIX_WORDS.has(word));
  const userWords = firstSuffix === -1 ? words : words.slice(0, firstSuffix);
  if (userWords.length === 0 || userWords.some((word) => word === "")) return undefined;
  const parsed: GatewayUserName = { user: userWords.join("-") };
  let index = firstSuffix === -1 ? words.length : firstSuffix;
  while (index < words.length) {
    const keyword = words[index]!;
    let end = index + 1;
    while (end < words.length && !SUFFIX_WORDS.has(words[end]!)) end++;
    const value = words.slice(index + 1, end).join("-");
    if (value === "" || words.slice(index + 1, end).some((word) => word === "")) return undefined;
    if (keyword === SESSION_WORD) {
      if (parsed.session !== undefined) return undefined;
      parsed.session = value;
    } else {
      if (parsed.host !== undefined) return undefined;
      parsed.host = value;
    }
    index = end;
  }
  return parsed;
}

/** The name a client gives for a session (and, optionally, a pin): what docs and tests build. */
export function gatewayUserName(
  user: string,
  ask: { session?: string; host?: string } = {},
): string {
  return [
    user,
    ...(ask.host === undefined ? [] : [HOST_WORD, ask.host]),
    ...(ask.session === undefined ? [] : [SESSION_WORD, ask.session]),
  ].join("-");
}

const containsSuffixWord = (name: string): boolean =>
  name.split("-").some((word) => SUFFIX_WORDS.has(word));

/** Problems with a gateway user's own name, naming the field and the fix; empty when fine. */
export function gatewayUserNameProblems(name: unknown, field: string): string[] {
  if (typeof name !== "string" || !USER_NAME.test(name) || name.length > MAX_USER_NAME)
    return [
      `${field} must be 1-${MAX_USER_NAME} letters, digits, '_' or '.', in words joined by single hyphens, e.g. "crawler" or "team-a"`,
    ];
  if (containsSuffixWord(name))
    return [
      `${field} ${JSON.stringify(name)} contains the word "${SESSION_WORD}" or "${HOST_WORD}", which open a session or a pin in a client's user name; choose a name without them, e.g. "${name.replace(/(^|-)(session|host)(?=-|$)/g, "$1$2s")}"`,
    ];
  return [];
}

/** Problems with a gateway's users' names: each one the conventions can read back, none given twice. */
export function gatewayUserListProblems(names: readonly unknown[], field: string): string[] {
  return names.flatMap((name, index) => [
    ...gatewayUserNameProblems(name, `${field}[${index}].name`),
    ...(names.indexOf(name) === index
      ? []
      : [`${field}[${index}].name ${JSON.stringify(name)} is given twice; list each user once`]),
  ]);
}

/** Problems with a label members carry (a backend's name or a label it declares); empty when fine. */
export function gatewayLabelProblems(label: unknown, field: string): string[] {
  if (typeof label !== "string" || !LABEL.test(label) || label.length > MAX_LABEL)
    return [
      `${field} must be lower-case letters and digits in words joined by single hyphens (at most ${MAX_LABEL}), e.g. "kvm1" or "country-de"`,
    ];
  if (containsSuffixWord(label))
    return [
      `${field} ${JSON.stringify(label)} contains the word "${SESSION_WORD}" or "${HOST_WORD}"; a client's "-${HOST_WORD}-<label>" could not be told apart from a suffix, so rename it`,
    ];
  return [];
}

/** Whether a client's session id is one the conventions read back whole. */
export const isGatewaySessionId = (id: string): boolean =>
  SESSION_ID.test(id) && !containsSuffixWord(id);
