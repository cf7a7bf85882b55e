/**
 * One secret set for both resources (provider/common/secrets.ts), proved on
 * what would be stored: the inputs the SDK registers (captured under mocks,
 * secret marks and all), and what the real dynamic-provider gRPC server
 * returns from Check, Create and Read once the engine's own secret rules are
 * applied to it. No plaintext of any secret may be left.
 */
import assert from "node:assert/strict";
import type { PveSimulator } from "../pve-sim/simulator";
import { simulatorProxyArgs, useEngineFixture } from "./engine-fixture";
import type { Props } from "./harness";
import { captureRegistration, stateAsStored, type Registration } from "./registration";

const KEY_BODY = "c2VudGluZWwta2V5LWJvZHktOTQxNw";
const SECRETS = {
  privateKey: `-----BEGIN OPENSSH PRIVATE KEY-----\n${KEY_BODY}\n-----END OPENSSH PRIVATE KEY-----\n`,
  passphrase: "sentinel-passphrase-5521",
  userData: "#cloud-config\n# sentinel-user-data-3318\n",
  userDataBase64: Buffer.from("sentinel-binary-user-data-7730").toString("base64"),
  vendorData: "#cloud-config\n# sentinel-vendor-data-2287\n",
  networkConfig: "version: 2\n# sentinel-network-config-6604\n",
  urlPassword: "sentinel-url-password-8812",
  proxyPassword: "sentinel-proxy-password-4410",
  guestFile: "crawler:sentinel-guest-file-5150",
};
/** What the pool hands a VM member to deliver in place: a password file among them. */
const GUEST_FILES = {
  files: [{ path: "/etc/squid/egress-proxies.htpasswd", content: `${SECRETS.guestFile}\n` }],
  commands: [["systemctl", "reload-or-restart", "squid"]],
  userDataIdentity: "0f1e2d3c",
};

/** The distinctive part of each secret, searched for in what would be stored. */
const NEEDLES = [
  KEY_BODY,
  SECRETS.passphrase,
  "sentinel-user-data-3318",
  SECRETS.userDataBase64,
  "sentinel-vendor-data-2287",
  "sentinel-network-config-6604",
  SECRETS.urlPassword,
  SECRETS.proxyPassword,
  SECRETS.guestFile,
];

function assertNoPlaintext(stored: string, needles: readonly string[], what: string): void {
  for (const needle of needles)
    assert.ok(!stored.includes(needle), `${what} holds ${JSON.stringify(needle)} in plaintext`);
}

/** The test can fail: the same reply without the engine's rules does hold the secrets. */
function assertHolds(reply: Props, needles: readonly string[]): void {
  const plain = JSON.stringify(reply);
  for (const needle of needles) assert.ok(plain.includes(needle), `reply lacks ${needle}`);
}

describe("engine: one secret set for both resources, no plaintext in state", function () {
  this.timeout(120_000);
  const fixture = useEngineFixture();

  function registeredStore(registration: Registration): string {
    return stateAsStored(registration.inputs, registration, "inputs");
  }

  describe("KvmProxy", () => {
    const program = (overrides: Props = {}): Props => ({
      connection: {
        host: "kvm1.lan",
        privateKey: SECRETS.privateKey,
        passphrase: { $output: SECRETS.passphrase },
      },
      image: { url: `https://mirror:${SECRETS.urlPassword}@images.example/debian-12.qcow2` },
      userData: SECRETS.userData,
      vendorData: SECRETS.vendorData,
      networkConfig: SECRETS.networkConfig,
      guestFiles: GUEST_FILES,
      // An Output: made secret once resolved, when it turns out to carry userinfo.
      readiness: { probeUrl: { $output: `http://probe:${SECRETS.urlPassword}@example.com/` } },
      egressCheck: {
        url: "http://echo.example/",
        proxyAuth: { user: "squid", password: SECRETS.proxyPassword },
      },
      ...overrides,
    });

    it("registers credentials, cloud-init and URLs with userinfo as secrets, leaf by leaf", async () => {
      const registration = await captureRegistration(
        fixture.project,
        "KvmProxy",
        "edge-s",
        program(),
      );
      assert.deepEqual(registration.secretPaths.sort(), [
        "connection.passphrase",
        "connection.privateKey",
        "egressCheck.proxyAuth.password",
        "guestFiles.files",
        "guestFiles.userDataIdentity",
        "image.url",
        "networkConfig",
        "readiness.probeUrl",
        "userData",
        "vendorData",
      ]);
      // egressCheck may hold proxyAuth.password, so the whole output is secret.
      assert.deepEqual(registration.additionalSecretOutputs.sort(), [
        "connection",
        "egressCheck",
        "guestFiles",
        "networkConfig",
        "seedSha256",
        "userData",
        "userDataBase64",
        "vendorData",
      ]);
      assertHolds(
        registration.inputs,
        NEEDLES.filter((n) => n !== SECRETS.userDataBase64),
      );
      assertNoPlaintext(registeredStore(registration), NEEDLES, "the registered inputs");
    });

    it("a jump host's own key and passphrase are secret; the one-line form stays plain", async () => {
      const hopKey = SECRETS.privateKey.replace(KEY_BODY, `${KEY_BODY}hop`);
      const registration = await captureRegistration(
        fixture.project,
        "KvmProxy",
        "edge-jump",
        program({
          connection: {
            host: "kvm1.lan",
            proxyJump: [
              "admin@bastion.example:2222",
              { host: "jump2.lan", privateKey: hopKey, passphrase: SECRETS.passphrase },
            ],
          },
        }),
      );
      assert.deepEqual(
        registration.secretPaths.filter((path) => path.startsWith("connection")).sort(),
        ["connection.proxyJump.1.passphrase", "connection.proxyJump.1.privateKey"],
      );
      assertHolds(registration.inputs, [`${KEY_BODY}hop`, "admin@bastion.example:2222"]);
      assertNoPlaintext(
        registeredStore(registration),
        [`${KEY_BODY}hop`, SECRETS.passphrase],
        "the registered inputs",
      );
    });

    it("a URL without userinfo stays plain", async () => {
      const registration = await captureRegistration(
        fixture.project,
        "KvmProxy",
        "edge-plain",
        program({
          image: { url: "https://images.example/debian-12.qcow2" },
          readiness: { probeUrl: { $output: "http://example.com/" } },
        }),
      );
      assert.ok(!registration.secretPaths.includes("image.url"));
      assert.ok(!registration.secretPaths.includes("readiness.probeUrl"));
    });

    it("check's reply through gRPC, as the engine stores it, holds no secret in plaintext", async () => {
      const server = await fixture.startServer({ config: {} });
      for (const overrides of [
        {},
        { userData: undefined, userDataBase64: SECRETS.userDataBase64 },
      ]) {
        const registration = await captureRegistration(
          fixture.project,
          "KvmProxy",
          "edge-s",
          program(overrides),
        );
        const checked = await server.check(registration.urn, {}, registration.inputs);
        // URLs with userinfo are refused anyway; the reply still carries them back.
        assert.deepEqual(checked.failures.map((f) => f.property).sort(), [
          "image.url",
          "readiness.probeUrl",
        ]);
        const needles = NEEDLES.filter((needle) => JSON.stringify(checked.inputs).includes(needle));
        assert.ok(needles.length >= 6, `only ${needles.length} secrets in the reply`);
        assertNoPlaintext(stateAsStored(checked.inputs, registration, "inputs"), needles, "check");
        assertNoPlaintext(registeredStore(registration), NEEDLES, "the registered inputs");
      }
    });

    it("a whole connection given as an Output is secret as a whole", async () => {
      const registration = await captureRegistration(
        fixture.project,
        "KvmProxy",
        "edge-o",
        program({ connection: { $output: { host: "kvm1.lan", privateKey: SECRETS.privateKey } } }),
      );
      assert.ok(registration.secretPaths.includes("connection"), registration.secretPaths.join());
      assertNoPlaintext(registeredStore(registration), [KEY_BODY], "the registered inputs");
    });

    it("an image given as an Output is secret as a whole when its URL carries userinfo", async () => {
      const url = `https://mirror:${SECRETS.urlPassword}@images.example/debian-12.qcow2`;
      const registration = await captureRegistration(
        fixture.project,
        "KvmProxy",
        "edge-i",
        program({ image: { $output: { url } } }),
      );
      assert.ok(registration.secretPaths.includes("image"), registration.secretPaths.join());
      assertNoPlaintext(registeredStore(registration), [SECRETS.urlPassword], "the inputs");
    });
  });

  describe("ProxmoxProxy (create and read on the simulator)", () => {
    let sim: PveSimulator;

    before(async () => {
      sim = await fixture.startSimulator();
    });

    const program = (overrides: Props = {}): Props =>
      simulatorProxyArgs(sim, {
        apiToken: sim.tokenFor(),
        userData: SECRETS.userData,
        vendorData: SECRETS.vendorData,
        guestFiles: GUEST_FILES,
        ...overrides,
      });

    it("registers the same set as KvmProxy for the inputs it has", async () => {
      const registration = await captureRegistration(
        fixture.project,
        "ProxmoxProxy",
        "edge-s",
        program({ apiEndpoint: `https://root:${SECRETS.urlPassword}@pve.example:8006` }),
      );
      assert.deepEqual(registration.secretPaths.sort(), [
        "apiEndpoint",
        "apiToken",
        "guestFiles.files",
        "guestFiles.userDataIdentity",
        "userData",
        "vendorData",
      ]);
      assert.deepEqual(registration.additionalSecretOutputs.sort(), [
        "apiToken",
        "egressCheck",
        "guestFiles",
        "seedSha256",
        "userData",
        "vendorData",
      ]);
      assertNoPlaintext(registeredStore(registration), NEEDLES, "the registered inputs");
    });

    it("check, create and read replies through gRPC, as the engine stores them, hold no secret", async () => {
      const server = await fixture.startServer({ config: {} });
      const registration = await captureRegistration(
        fixture.project,
        "ProxmoxProxy",
        "edge-s",
        program(),
      );
      const token = sim.tokenFor().split("=")[1];
      const needles = [token, "sentinel-user-data-3318", "sentinel-vendor-data-2287"];
      const checked = await server.check(registration.urn, {}, registration.inputs);
      assert.deepEqual(checked.failures, []);
      assertHolds(checked.inputs, needles);
      assertNoPlaintext(stateAsStored(checked.inputs, registration, "inputs"), needles, "check");

      const created = await server.create(registration.urn, checked.inputs);
      try {
        const outputs = created.properties;
        const seedSha256 = String(outputs.seedSha256);
        assert.match(seedSha256, /^[0-9a-f]{64}$/);
        assertHolds(outputs, [...needles, seedSha256]);
        assertNoPlaintext(
          stateAsStored(outputs, registration, "outputs"),
          [...needles, seedSha256],
          "create",
        );
        const read = await server.read(registration.urn, created.id, outputs, checked.inputs);
        assertNoPlaintext(
          stateAsStored(read.properties, registration, "outputs"),
          [...needles, seedSha256],
          "read's outputs",
        );
        assertNoPlaintext(
          stateAsStored(read.inputs, registration, "inputs"),
          needles,
          "read's inputs",
        );
      } finally {
        await server.delete(registration.urn, created.id, created.properties);
      }
    });
  });
});
