/**
 * Reading the gateway's access log (workloads/gateway/access-log.ts). Every
 * line below was written by real squid (Debian's 5.7) running the gateway's
 * own configuration in the namespace lab (test/support/gateway-netns.ts), in
 * front of member squids, in the `egress_gateway` logformat: copied from its
 * access.log as they came, for each way a request can end.
 */
import assert from "node:assert/strict";
import fc from "fast-check";
import { parseGatewayLogLine, type GatewayRequest } from "../../../workloads/gateway/access-log";
import { GATEWAY_LOG_FORMAT } from "../../../workloads/gateway/squid-gateway";
import { gatewayUserName } from "../../../workloads/gateway/user-names";

/** Real lines, by what happened. */
const SQUID = {
  plainGet: "1796512238.420 55 127.0.0.1 crawler TCP_MISS/200 224 GET ROUNDROBIN_PARENT/m3-0",
  plainConnect:
    "1796512238.471 41 127.0.0.1 crawler TCP_TUNNEL/200 142 CONNECT ROUNDROBIN_PARENT/m2-0",
  sessionGet:
    "1796512238.531 58 127.0.0.1 crawler-session-42 TCP_MISS/200 224 GET USERHASH_PARENT/m1-0.sticky",
  sessionConnect:
    "1796512238.534 1 127.0.0.1 crawler-session-42 TCP_TUNNEL/200 142 CONNECT USERHASH_PARENT/m1-0.sticky",
  pinned:
    "1796512238.545 9 127.0.0.1 crawler-host-kvm-b TCP_MISS/200 224 GET ROUNDROBIN_PARENT/m3-0",
  pinnedSession:
    "1796512238.556 9 127.0.0.1 crawler-host-kvm-a-session-s7 TCP_TUNNEL/200 142 CONNECT USERHASH_PARENT/m1-0.sticky",
  ipv6Client: "1796512238.667 6 ::1 crawler TCP_MISS/200 224 GET ROUNDROBIN_PARENT/m2-0",
  originNotFound: "1796512395.813 31 127.0.0.1 crawler TCP_MISS/404 226 GET ROUNDROBIN_PARENT/m3-0",
  wrongPassword: "1796512238.569 11 127.0.0.1 crawler TCP_DENIED/407 3475 GET HIER_NONE/-",
  wrongPasswordConnect:
    "1796512238.576 5 127.0.0.1 crawler TCP_DENIED/407 3451 CONNECT HIER_NONE/-",
  wrongPasswordSession:
    "1796512238.583 5 127.0.0.1 crawler-session-9 TCP_DENIED/407 3475 GET HIER_NONE/-",
  noCredentials: "1796512398.948 1 127.0.0.1 - TCP_DENIED/407 3475 GET HIER_NONE/-",
  unsafePort: "1796512398.965 1 127.0.0.1 - TCP_DENIED/403 3367 CONNECT HIER_NONE/-",
  unreadableRequest: "1796512543.665 0 127.0.0.1 - NONE_NONE/400 3350 GARBAGE HIER_NONE/-",
  pinNowhere: "1796512238.589 3 127.0.0.1 crawler-host-kvm-z TCP_MISS/502 3376 GET HIER_NONE/-",
  pinNowhereConnect:
    "1796512238.590 0 127.0.0.1 crawler-host-kvm-z NONE_NONE/500 0 CONNECT HIER_NONE/-",
  membersDead: "1796512238.803 0 127.0.0.1 crawler TCP_MISS/503 3406 GET ANY_OLD_PARENT/m3-0",
  membersDeadConnect:
    "1796512238.808 0 127.0.0.1 crawler NONE_NONE/503 0 CONNECT ANY_OLD_PARENT/m2-0",
  membersDeadSession:
    "1796512238.810 0 127.0.0.1 crawler-session-42 TCP_MISS/503 3406 GET ANY_OLD_PARENT/m3-0.sticky",
  noMemberLeft: "1796512238.811 0 127.0.0.1 crawler TCP_MISS/502 3376 GET HIER_NONE/-",
  clientGaveUp:
    "1796512397.405 1500 127.0.0.1 crawler TCP_MISS_ABORTED/000 0 GET ROUNDROBIN_PARENT/m2-0",
  memberRefusedGateway:
    "1796512841.753 34 127.0.0.1 crawler TCP_MISS/407 3475 GET ROUNDROBIN_PARENT/m2-0",
  memberRefusedGatewayConnect:
    "1796512841.780 17 127.0.0.1 crawler TCP_TUNNEL/407 0 CONNECT ANY_OLD_PARENT/m2-0",
  connectionWithoutRequest: "1796512543.654 0 127.0.0.1 - NONE_NONE/000 0 - HIER_NONE/-",
  nameWithSpace: "1796512399.028 0 127.0.0.1 crawler x TCP_DENIED/407 3475 GET HIER_NONE/-",
  nameWithQuoteAndBackslash:
    '1796512399.010 0 127.0.0.1 we"ird\\name TCP_DENIED/407 3475 GET HIER_NONE/-',
  sessionWithoutId:
    "1796512839.794 65 127.0.0.1 crawler-session- TCP_MISS/200 224 GET USERHASH_PARENT/m1-0.sticky",
};

const parsed = (line: string): GatewayRequest => {
  const request = parseGatewayLogLine(line);
  assert.ok(request !== undefined, `a readable line: ${line}`);
  return request;
};

describe("the gateway's access log (workloads/gateway/access-log.ts), on lines real squid wrote", () => {
  it("the lines here are in the format the gateway configures (a changed format fails here first)", () => {
    assert.equal(
      GATEWAY_LOG_FORMAT,
      "logformat egress_gateway %ts.%03tu %tr %>a %un %Ss/%03>Hs %<st %rm %Sh/%<A",
    );
  });

  it("a request routed through a member: the member, the user, status, bytes, method", () => {
    assert.deepEqual(parsed(SQUID.plainGet), {
      user: "crawler",
      pinned: false,
      session: false,
      member: "m3-0",
      status: 200,
      bytes: 224,
      method: "GET",
      result: "routed",
    });
    assert.deepEqual(parsed(SQUID.plainConnect), {
      user: "crawler",
      pinned: false,
      session: false,
      member: "m2-0",
      status: 200,
      bytes: 142,
      method: "CONNECT",
      result: "routed",
    });
    assert.equal(parsed(SQUID.ipv6Client).member, "m2-0");
  });

  it("a session: the base user, the member without its .sticky peer name", () => {
    for (const line of [SQUID.sessionGet, SQUID.sessionConnect]) {
      const request = parsed(line);
      assert.equal(request.user, "crawler");
      assert.equal(request.session, true);
      assert.equal(request.pinned, false);
      assert.equal(request.member, "m1-0");
      assert.equal(request.result, "routed");
    }
  });

  it("a pin, alone and with a session: the base user only", () => {
    assert.deepEqual(
      [SQUID.pinned, SQUID.pinnedSession].map((line) => {
        const { user, pinned, session, member } = parsed(line);
        return { user, pinned, session, member };
      }),
      [
        { user: "crawler", pinned: true, session: false, member: "m3-0" },
        { user: "crawler", pinned: true, session: true, member: "m1-0" },
      ],
    );
  });

  it("what the origin answered through a member is routed, a 404 too", () => {
    const request = parsed(SQUID.originNotFound);
    assert.equal(request.status, 404);
    assert.equal(request.result, "routed");
  });

  it("credentials refused (407) before any member: refused, the user as named, no member", () => {
    for (const line of [SQUID.wrongPassword, SQUID.wrongPasswordConnect]) {
      const request = parsed(line);
      assert.equal(request.result, "refused");
      assert.equal(request.status, 407);
      assert.equal(request.user, "crawler");
      assert.equal(request.member, undefined);
      assert.ok(request.bytes > 0);
    }
    const session = parsed(SQUID.wrongPasswordSession);
    assert.equal(session.user, "crawler");
    assert.equal(session.session, true);
    assert.equal(session.result, "refused");
  });

  it("no credentials at all: no user; squid's own 403 and 400 are refusals too", () => {
    assert.equal(parsed(SQUID.noCredentials).user, undefined);
    assert.equal(parsed(SQUID.noCredentials).result, "refused");
    const unsafe = parsed(SQUID.unsafePort);
    assert.equal(unsafe.status, 403);
    assert.equal(unsafe.result, "refused");
    assert.equal(unsafe.user, undefined);
    assert.equal(parsed(SQUID.unreadableRequest).result, "refused");
  });

  it("no member could take it (a pin nowhere, every member dead): failed, with the member squid last tried", () => {
    assert.deepEqual(
      [
        SQUID.pinNowhere,
        SQUID.pinNowhereConnect,
        SQUID.membersDead,
        SQUID.membersDeadConnect,
        SQUID.membersDeadSession,
        SQUID.noMemberLeft,
      ].map((line) => [parsed(line).status, parsed(line).member, parsed(line).result]),
      [
        [502, undefined, "failed"],
        [500, undefined, "failed"],
        [503, "m3-0", "failed"],
        [503, "m2-0", "failed"],
        [503, "m3-0", "failed"],
        [502, undefined, "failed"],
      ],
    );
  });

  it("no answer after a member was chosen (000), and a member refusing the gateway's own login (407): failed", () => {
    const gaveUp = parsed(SQUID.clientGaveUp);
    assert.equal(gaveUp.status, 0);
    assert.equal(gaveUp.member, "m2-0");
    assert.equal(gaveUp.result, "failed");
    for (const line of [SQUID.memberRefusedGateway, SQUID.memberRefusedGatewayConnect]) {
      const request = parsed(line);
      assert.equal(request.status, 407);
      assert.equal(request.member, "m2-0");
      assert.equal(request.result, "failed");
    }
  });

  it("a connection that carried no request (a TCP probe): method -, status 0, nobody", () => {
    const probe = parsed(SQUID.connectionWithoutRequest);
    assert.equal(probe.method, "-");
    assert.equal(probe.status, 0);
    assert.equal(probe.user, undefined);
    assert.equal(probe.member, undefined);
  });

  it("a name squid logs with a space, a quote or a backslash is read whole", () => {
    assert.equal(parsed(SQUID.nameWithSpace).user, "crawler x");
    assert.equal(parsed(SQUID.nameWithSpace).status, 407);
    assert.equal(parsed(SQUID.nameWithQuoteAndBackslash).user, 'we"ird\\name');
  });

  it("a name the conventions cannot read is read as squid did: the user before the suffix", () => {
    const request = parsed(SQUID.sessionWithoutId);
    assert.equal(request.user, "crawler");
    assert.equal(request.session, true);
    assert.equal(request.result, "routed");
  });

  it("takes the line with its line break, as a datagram carries it", () => {
    assert.deepEqual(parsed(SQUID.plainGet + "\n"), parsed(SQUID.plainGet));
    assert.deepEqual(parsed(SQUID.plainGet + "\r\n"), parsed(SQUID.plainGet));
  });

  it("refuses lines in other formats, cut short or empty", () => {
    for (const line of [
      "",
      "garbage",
      // squid's default `squid` logformat.
      "1796512238.420     55 127.0.0.1 TCP_MISS/200 224 GET http://127.0.3.1:8080/ crawler ROUNDROBIN_PARENT/127.0.1.3 text/plain",
      SQUID.plainGet.slice(0, 40),
      SQUID.plainGet.replace("TCP_MISS/200", "TCP_MISS/2000"),
      SQUID.plainGet.replace(" 224 ", " -1 "),
      SQUID.plainGet.replace("1796512238.420", "yesterday"),
      SQUID.plainGet.replace("ROUNDROBIN_PARENT/m3-0", "m3-0"),
    ])
      assert.equal(parseGatewayLogLine(line), undefined, JSON.stringify(line));
  });

  it("any name a client builds from the conventions is counted under its own user", () => {
    const word = fc.stringMatching(/^[A-Za-z0-9_.]{1,8}$/);
    const words = fc
      .array(word, { minLength: 1, maxLength: 3 })
      .filter((parts) => !parts.some((part) => part === "session" || part === "host"))
      .map((parts) => parts.join("-"));
    const label = fc
      .array(fc.stringMatching(/^[a-z0-9]{1,6}$/), { minLength: 1, maxLength: 2 })
      .filter((parts) => !parts.some((part) => part === "session" || part === "host"))
      .map((parts) => parts.join("-"));
    fc.assert(
      fc.property(
        words,
        fc.option(words, { nil: undefined }),
        fc.option(label, { nil: undefined }),
        (user, session, host) => {
          const name = gatewayUserName(user, {
            ...(session === undefined ? {} : { session }),
            ...(host === undefined ? {} : { host }),
          });
          const request = parsed(SQUID.sessionGet.replace("crawler-session-42", name));
          assert.equal(request.user, user);
          assert.equal(request.session, session !== undefined);
          assert.equal(request.pinned, host !== undefined);
        },
      ),
    );
  });
});
