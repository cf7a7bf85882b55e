/**
 * The redirect policy for image downloads, without a network: addresses and
 * names are classified from literals, and host names resolve through an
 * injected lookup. That is how a non-loopback image.url is tested here: the
 * tests may only ever reach loopback, so "mirror.example resolves to
 * 203.0.113.5" is an answer the fake resolver gives, never a connection.
 */
import assert from "node:assert/strict";
import {
  addressKind,
  hostNameKind,
  ImageSourceRefusedError,
  MAX_IMAGE_REDIRECTS,
  redirectTarget,
  vetHost,
  type AllowedKinds,
  type GuardedAddressKind,
  type HostLookup,
  type ResolvedAddress,
} from "../../../provider/kvm/image-source-policy";
import { pinnedConnector } from "../../../provider/kvm/pinned-agent";

describe("image redirect policy: address kinds", () => {
  const table: [string, GuardedAddressKind | undefined][] = [
    ["127.0.0.1", "loopback"],
    ["127.200.3.4", "loopback"],
    ["::1", "loopback"],
    ["0:0:0:0:0:0:0:1", "loopback"],
    ["169.254.1.1", "link-local"],
    ["fe80::1", "link-local"],
    ["fe80::1%eth0", "link-local"],
    ["febf:ffff::1", "link-local"],
    ["169.254.169.254", "metadata"],
    ["169.254.170.2", "metadata"],
    ["100.100.100.200", "metadata"],
    ["fd00:ec2::254", "metadata"],
    ["FD00:EC2:0:0:0:0:0:254", "metadata"],
    ["0.0.0.0", "unspecified"],
    ["0.12.34.56", "unspecified"],
    ["::", "unspecified"],
    // IPv4 inside IPv6 reaches the IPv4 address.
    ["::ffff:127.0.0.1", "loopback"],
    ["::ffff:7f00:1", "loopback"],
    ["::ffff:169.254.169.254", "metadata"],
    ["::ffff:a9fe:a9fe", "metadata"],
    ["::ffff:169.254.3.3", "link-local"],
    ["::ffff:0.0.0.0", "unspecified"],
    ["64:ff9b::a9fe:a9fe", "metadata"],
    ["::127.0.0.1", "loopback"],
    ["::ffff:0:127.0.0.1", "loopback"], // translated (RFC 7915)
    ["::ffff:0:a9fe:a9fe", "metadata"],
    ["2002:7f00:1::", "loopback"], // 6to4 of 127.0.0.1
    ["2002:a9fe:a9fe:1:2:3:4:5", "metadata"],
    ["2002:a9fe:0101::1", "link-local"],
    ["2001:0:4136:e378:8000:63bf:5601:5601", "metadata"], // Teredo, client 169.254.169.254 inverted
    ["2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"], // Teredo, client 127.0.0.1 inverted
    ["64:ff9b:1::7f00:1", "loopback"], // NAT64 local-use, read as /96
    ["64:ff9b:1:a9fe:a9:fe00::", "metadata"], // NAT64 local-use, read as /48 (RFC 6052)
    ["64:ff9b::127.0.0.1", "loopback"],
    ["fd12:3456:789a::1", "unique-local"],
    ["fc00::1", "unique-local"],
    ["fd00:ec2::255", "unique-local"],
    // Ordinary addresses, private ranges included (a mirror on the LAN is normal).
    ["10.1.2.3", undefined],
    ["192.168.1.10", undefined],
    ["100.64.0.1", undefined],
    ["203.0.113.5", undefined],
    ["::ffff:203.0.113.5", undefined],
    ["2001:db8::1", undefined],
    ["fec0::1", undefined],
    ["2002:cb00:7105::1", undefined], // 6to4 of 203.0.113.5
    ["2001:0:4136:e378:8000:63bf:34ff:8efa", undefined], // Teredo, client 203.0.113.5
    ["64:ff9b::203.0.113.5", undefined],
    ["2001:db8:1::1", undefined],
    ["fe00::1", undefined],
  ];
  for (const [address, expected] of table)
    it(`${address} → ${expected ?? "ordinary"}`, () =>
      assert.equal(addressKind(address), expected));

  const names: [string, GuardedAddressKind | undefined][] = [
    ["localhost", "loopback"],
    ["LOCALHOST.", "loopback"],
    ["images.localhost", "loopback"],
    ["metadata.google.internal", "metadata"],
    ["metadata.google.internal.", "metadata"],
    ["metadata", "metadata"],
    ["instance-data.ec2.internal", "metadata"],
    ["cloud.debian.org", undefined],
    ["localhost.example.com", undefined],
  ];
  for (const [name, expected] of names)
    it(`name ${name} → ${expected ?? "ordinary"}`, () =>
      assert.equal(hostNameKind(name), expected));
});

describe("image redirect policy: redirect targets", () => {
  const original = new URL("https://images.example/releases/12/debian.qcow2");
  const refused = (pattern: RegExp) => (error: unknown) =>
    error instanceof ImageSourceRefusedError &&
    /image\.url https:\/\/images\.example\/releases\/12\/debian\.qcow2 /.test(error.message) &&
    pattern.test(error.message);

  it("resolves relative Locations against the URL that sent them", () => {
    const current = new URL("https://mirror.example/a/b/moved?x=1");
    const cases: [string, string][] = [
      ["/pool/debian.qcow2", "https://mirror.example/pool/debian.qcow2"],
      ["../../c/debian.qcow2", "https://mirror.example/c/debian.qcow2"],
      ["debian.qcow2", "https://mirror.example/a/b/debian.qcow2"],
      ["//cdn.example/d.qcow2", "https://cdn.example/d.qcow2"],
      ["https://cdn.example/d.qcow2#part", "https://cdn.example/d.qcow2"],
    ];
    for (const [location, expected] of cases)
      assert.equal(redirectTarget(original, current, location, 1).href, expected, location);
  });

  it("keeps or upgrades the scheme, never downgrades it", () => {
    const http = new URL("http://mirror.example/x");
    assert.equal(redirectTarget(original, http, "http://cdn.example/y", 1).protocol, "http:");
    assert.equal(redirectTarget(original, http, "https://cdn.example/y", 1).protocol, "https:");
    assert.equal(redirectTarget(original, original, "https://cdn.example/y", 1).protocol, "https:");
    assert.throws(
      () => redirectTarget(original, original, "http://cdn.example/y", 1),
      refused(/to http:\/\/cdn\.example\/y: a redirect from https down to plain http/),
    );
  });

  for (const location of [
    "file:///etc/passwd",
    "ftp://mirror.example/debian.qcow2",
    "data:application/octet-stream;base64,AAAA",
    "gopher://mirror.example/",
  ])
    it(`refuses ${location.slice(0, location.indexOf(":") + 1)} as a target`, () =>
      assert.throws(
        () => redirectTarget(original, original, location, 1),
        refused(/only http and https redirects are followed/),
      ));

  it(`follows ${MAX_IMAGE_REDIRECTS} redirects and refuses the next`, () => {
    assert.equal(
      redirectTarget(original, original, "/y", MAX_IMAGE_REDIRECTS).href,
      "https://images.example/y",
    );
    assert.throws(
      () => redirectTarget(original, original, "/y", MAX_IMAGE_REDIRECTS + 1),
      refused(/more than 5 times/),
    );
  });

  it("refuses credentials in a target, and never shows them", () => {
    assert.throws(
      () => redirectTarget(original, original, "https://admin:hunter22@cdn.example/y", 1),
      (error: Error) =>
        refused(/carrying credentials/)(error) &&
        !error.message.includes("hunter22") &&
        !error.message.includes("admin"),
    );
  });

  it("refuses a redirect without a usable Location", () => {
    assert.throws(
      () => redirectTarget(original, original, undefined, 1),
      refused(/without a Location/),
    );
    assert.throws(() => redirectTarget(original, original, "", 1), refused(/without a Location/));
    assert.throws(() => redirectTarget(original, original, "http://[::1", 1), refused(/not a URL/));
    assert.throws(
      () => redirectTarget(original, original, ["/a", "https://cdn.example/b"], 1),
      refused(/2 different Location headers/),
    );
  });

  it("shows a target without its query, where signed URLs keep their tokens", () => {
    assert.throws(
      () => redirectTarget(original, original, "ftp://cdn.example/y?token=abcdef0123", 1),
      (error: Error) =>
        /ftp:\/\/cdn\.example\/y\?…/.test(error.message) && !/abcdef0123/.test(error.message),
    );
  });
});

describe("image redirect policy: hosts and addresses", () => {
  const original = new URL("https://mirror.example/debian.qcow2");
  /** A resolver from a table; records what it was asked. */
  function fakeResolver(answers: Record<string, string[]>): HostLookup & { asked: string[] } {
    const asked: string[] = [];
    const lookup = (hostname: string): Promise<ResolvedAddress[]> => {
      asked.push(hostname);
      const addresses = answers[hostname];
      if (addresses === undefined)
        return Promise.reject(
          Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: "ENOTFOUND" }),
        );
      return Promise.resolve(
        addresses.map((address) => ({ address, family: address.includes(":") ? 6 : 4 }) as const),
      );
    };
    return Object.assign(lookup, { asked });
  }
  const resolver = fakeResolver({
    "mirror.example": ["203.0.113.5"],
    "cdn.example": ["203.0.113.9", "2001:db8::9"],
    "rebind.example": ["127.0.0.1"],
    "mixed.example": ["203.0.113.10", "169.254.169.254"],
    "lan-mirror.example": ["127.0.0.53"],
    "link-mirror.example": ["169.254.10.10"],
    "mapped.example": ["::ffff:127.0.0.1"],
    localhost: ["127.0.0.1", "::1"],
  });
  const vet = (url: string, allowed: AllowedKinds) =>
    vetHost(new URL(url), allowed, {
      original,
      lookup: resolver,
      signal: new AbortController().signal,
    });

  async function originKinds(url: string): Promise<ReadonlySet<GuardedAddressKind>> {
    return (await vet(url, "any")).kinds;
  }

  it("takes image.url itself as given, whatever it reaches", async () => {
    for (const url of [
      "http://127.0.0.1/x",
      "http://169.254.169.254/x",
      "http://localhost/x",
      "https://rebind.example/x",
    ])
      assert.ok(await vet(url, "any"));
  });

  it("from an ordinary image.url, follows redirects to ordinary hosts and pins their addresses", async () => {
    const allowed = await originKinds("https://mirror.example/debian.qcow2");
    assert.equal(allowed.size, 0);
    const host = await vet("https://cdn.example/debian.qcow2", allowed);
    assert.equal(host.hostname, "cdn.example");
    assert.deepEqual(
      host.addresses.map((a) => a.address),
      ["203.0.113.9", "2001:db8::9"],
    );
  });

  const fromOrdinary: [string, RegExp][] = [
    ["http://127.0.0.1:8080/x", /127\.0\.0\.1:8080\/x, a loopback address/],
    ["http://[::1]/x", /a loopback address/],
    ["http://[::ffff:127.0.0.1]/x", /a loopback address/],
    ["http://0x7f.1/x", /http:\/\/127\.0\.0\.1\/x, a loopback address/],
    ["http://169.254.169.254/latest/meta-data/", /a cloud metadata address/],
    ["http://2852039166/latest/", /169\.254\.169\.254\/latest\/, a cloud metadata address/],
    ["http://[fd00:ec2::254]/", /a cloud metadata address/],
    ["http://169.254.7.7/", /a link-local address/],
    ["http://[fe80::1]/", /a link-local address/],
    ["http://0.0.0.0:22/", /an unspecified address/],
    ["http://rebind.example/x", /\(rebind\.example resolves to 127\.0\.0\.1\), a loopback address/],
    [
      "http://mixed.example/x",
      /\(mixed\.example resolves to 169\.254\.169\.254\), a cloud metadata address/,
    ],
    ["http://mapped.example/x", /a loopback address/],
  ];
  for (const [target, pattern] of fromOrdinary)
    it(`from an ordinary image.url, refuses ${target}`, async () => {
      const allowed = await originKinds("https://mirror.example/debian.qcow2");
      await assert.rejects(
        vet(target, allowed),
        (error: Error) =>
          error instanceof ImageSourceRefusedError &&
          error.message.startsWith(
            "image.url https://mirror.example/debian.qcow2 was redirected to ",
          ) &&
          pattern.test(error.message),
      );
    });

  it("refuses localhost and metadata names before asking any resolver", async () => {
    resolver.asked.length = 0;
    for (const target of [
      "http://localhost/x",
      "http://images.localhost/x",
      "http://metadata.google.internal/computeMetadata/v1/",
    ])
      await assert.rejects(vet(target, new Set()), ImageSourceRefusedError);
    assert.deepEqual(resolver.asked, []);
  });

  it("from a loopback image.url (a lab mirror), follows loopback redirects but nothing else guarded", async () => {
    const allowed = await originKinds("http://lan-mirror.example:8080/debian.qcow2");
    assert.deepEqual([...allowed], ["loopback"]);
    assert.ok(await vet("http://127.0.0.2:8081/debian.qcow2", allowed));
    assert.ok(await vet("http://rebind.example/debian.qcow2", allowed));
    assert.deepEqual(
      [...(await vet("http://localhost/debian.qcow2", allowed)).kinds],
      ["loopback"],
    );
    await assert.rejects(vet("http://169.254.169.254/", allowed), /a cloud metadata address/);
    await assert.rejects(vet("http://169.254.7.7/", allowed), /a link-local address/);
    await assert.rejects(vet("http://0.0.0.0/", allowed), /an unspecified address/);
  });

  it("a link-local image.url does not open the metadata service", async () => {
    const allowed = await originKinds("http://link-mirror.example/debian.qcow2");
    assert.deepEqual([...allowed], ["link-local"]);
    assert.ok(await vet("http://169.254.7.7/x", allowed));
    await assert.rejects(vet("http://169.254.169.254/x", allowed), /a cloud metadata address/);
  });

  it("gives up a lookup when the signal aborts", async () => {
    const controller = new AbortController();
    const hanging: HostLookup = (_name, signal) =>
      new Promise((_resolve, reject) =>
        signal.addEventListener("abort", () => reject(signal.reason)),
      );
    const pending = vetHost(new URL("https://slow.example/x"), new Set(), {
      original,
      lookup: hanging,
      signal: controller.signal,
    });
    controller.abort(new Error("deadline"));
    await assert.rejects(pending, /deadline/);
  });
});

describe("pinned connector", () => {
  it("refuses a host the policy never checked, before any socket", () => {
    let baseCalls = 0;
    const connect = pinnedConnector(new Map(), () => void baseCalls++);
    let result: Error | null | undefined;
    connect({ hostname: "169.254.169.254", protocol: "http:", port: "80" }, (...args) => {
      result = args[0];
    });
    assert.ok(result instanceof ImageSourceRefusedError);
    assert.match(result.message, /169\.254\.169\.254, which the redirect policy never checked/);
    assert.equal(baseCalls, 0);
  });

  it("hands a checked host to the real connector", () => {
    const seen: string[] = [];
    const pins = new Map([
      [
        "mirror.example",
        { hostname: "mirror.example", addresses: [], kinds: new Set<GuardedAddressKind>() },
      ],
    ]);
    const connect = pinnedConnector(pins, (options) => void seen.push(options.hostname));
    connect({ hostname: "mirror.example", protocol: "https:", port: "443" }, () => undefined);
    assert.deepEqual(seen, ["mirror.example"]);
  });
});
