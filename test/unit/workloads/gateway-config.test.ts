/**
 * The gateway's pure pieces: the user-name conventions (read back whole for
 * every name the validators accept, in either suffix order), the squid
 * configuration's determinism and its rules per member, and which of the
 * pool's members the gateway routes to.
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { gatewayMembers } from "../../../components/gateway";
import type { ProxyDetails } from "../../../components/proxy-details";
import { gatewaySquidConfig, type GatewaySettings } from "../../../workloads/gateway/squid-gateway";
import {
  gatewayLabelProblems,
  gatewayUserListProblems,
  gatewayUserName,
  gatewayUserNameProblems,
  isGatewaySessionId,
  parseGatewayUserName,
} from "../../../workloads/gateway/user-names";

const word = fc.stringMatching(/^[a-z0-9]{1,8}$/).filter((w) => w !== "session" && w !== "host");
const dashed = fc.array(word, { minLength: 1, maxLength: 3 }).map((words) => words.join("-"));

describe("gateway user names", () => {
  it("read back whole: user, session and pin, in either order, for every name the validators accept", () => {
    fc.assert(
      fc.property(
        dashed,
        fc.option(dashed),
        fc.option(dashed),
        fc.boolean(),
        (user, session, host, hostFirst) => {
          assert.deepEqual(gatewayUserNameProblems(user, "u"), []);
          if (host !== null) assert.deepEqual(gatewayLabelProblems(host, "l"), []);
          const parts = [user];
          const suffixes = [
            ...(session === null ? [] : [["session", session]]),
            ...(host === null ? [] : [["host", host]]),
          ];
          if (hostFirst) suffixes.reverse();
          for (const suffix of suffixes) parts.push(...suffix);
          assert.deepEqual(parseGatewayUserName(parts.join("-")), {
            user,
            ...(session === null ? {} : { session }),
            ...(host === null ? {} : { host }),
          });
        },
      ),
    );
  });

  it("builds what it reads", () => {
    const name = gatewayUserName("team-a", { session: "s-1", host: "country-de" });
    assert.equal(name, "team-a-host-country-de-session-s-1");
    assert.deepEqual(parseGatewayUserName(name), {
      user: "team-a",
      session: "s-1",
      host: "country-de",
    });
  });

  it("refuses what it could not read back", () => {
    for (const name of [
      "crawler-session",
      "crawler-host-",
      "crawler-session-a-session-b",
      "-x",
      "a--b",
    ])
      assert.equal(parseGatewayUserName(name), undefined, name);
    assert.match(
      gatewayUserNameProblems("my-host-team", "gateway.users[0].name")[0]!,
      /"my-hosts-team"/,
    );
    assert.match(gatewayLabelProblems("Country DE", "x")[0]!, /^x must be lower-case/);
    assert.match(
      gatewayLabelProblems("eu-session-1", "x")[0]!,
      /contains the word "session" or "host"/,
    );
    assert.deepEqual(gatewayUserListProblems(["crawler", "team-b", "crawler"], "gateway.users"), [
      'gateway.users[2].name "crawler" is given twice; list each user once',
    ]);
    assert.equal(isGatewaySessionId("abc.1-2"), true);
    assert.equal(isGatewaySessionId("a-host-b"), false);
  });
});

const SETTINGS: GatewaySettings = {
  port: 3128,
  allowedClientCidrs: ["10.0.0.0/8"],
  users: [{ name: "crawler", password: "crawler-password-1" }],
  members: [
    { name: "kvm1-1", address: "10.0.0.6", port: 3128, labels: ["kvm1"] },
    { name: "kvm1-0", address: "10.0.0.5", port: 3128, labels: ["kvm1", "country-de"] },
  ],
  paths: { configDir: "/etc/squid" },
};

describe("gateway squid configuration", () => {
  it("is the same bytes for the same members in any order", () => {
    const reversed = { ...SETTINGS, members: [...SETTINGS.members].reverse() };
    assert.equal(gatewaySquidConfig(reversed), gatewaySquidConfig(SETTINGS));
  });

  it("gives each member a rotating and a sticky peer, each kept to its own requests and the member's labels", () => {
    const config = gatewaySquidConfig(SETTINGS);
    const rulesOf = (peer: string) =>
      config
        .split("\n")
        .filter((line) => line.startsWith(`cache_peer_access ${peer} `))
        .map((line) => line.slice(`cache_peer_access ${peer} `.length));
    assert.deepEqual(rulesOf("kvm1-0"), [
      "deny gateway_session",
      "allow gateway_pinned gateway_pin_kvm1",
      "allow gateway_pinned gateway_pin_country_de",
      "deny gateway_pinned",
      "allow all",
    ]);
    assert.deepEqual(rulesOf("kvm1-0.sticky"), [
      "deny !gateway_session",
      "allow gateway_pinned gateway_pin_kvm1",
      "allow gateway_pinned gateway_pin_country_de",
      "deny gateway_pinned",
      "allow all",
    ]);
    assert.match(config, /^cache_peer 10\.0\.0\.5 parent 3128 0 userhash name=kvm1-0\.sticky /m);
    assert.match(config, /^never_direct allow all$/m);
    // A label ends at a suffix or at the end: kvm1 never matches kvm1-b.
    assert.match(
      config,
      /^acl gateway_pin_kvm1 proxy_auth_regex \[-\]host\[-\]kvm1\(\[-\]session\[-\]\|\$\)$/m,
    );
  });
});

const proxy = (name: string, fields: Partial<ProxyDetails>): ProxyDetails =>
  ({
    name,
    backend: name.split("-")[0]!,
    ip: null,
    ready: true,
    ...fields,
  }) as ProxyDetails;

describe("which members the gateway routes to", () => {
  it("those published as serving, by IPv4 first, IPv6 when that is all that serves, labelled by backend", () => {
    const members = gatewayMembers(
      [
        proxy("kvm1-0", { ip: "10.0.0.5" }),
        proxy("kvm1-1", { ip: "10.0.0.6", ready: false }),
        proxy("pve1-0", { ip: "10.0.1.5", ipv6Address: "fd00::5", ready: false, readyIpv6: true }),
        proxy("pve1-1", { ip: null }),
        proxy("pve1-2", { ip: "10.0.1.7", ready: null }),
      ],
      3128,
      { backendLabels: { pve1: ["country-de"] } },
      { user: "member", password: "member-password-1" },
    );
    assert.deepEqual(
      members.map((member) => `${member.name} ${member.address} ${member.labels.join(",")}`),
      ["kvm1-0 10.0.0.5 kvm1", "pve1-0 fd00::5 pve1,country-de", "pve1-2 10.0.1.7 pve1,country-de"],
    );
    assert.deepEqual(members[0]!.login, { user: "member", password: "member-password-1" });
  });
});
