/**
 * Rotation by exit address (provider/common/egress-rotation.ts), through each
 * VM resource's own check and diff: the member whose recorded exit address
 * has a new entry is replaced; the others, the map's own changes, and a
 * replacement that still leaves from the burned address are not.
 */
import { strict as assert } from "node:assert";
import { egressRotationDue } from "../../provider/common/egress-rotation";
import { canonicalAddress } from "../../provider/common/exit-address";
import * as kvm from "../../provider/kvm/provider";
import * as proxmox from "../../provider/proxmox/provider";

type Props = Record<string, unknown>;
const owner = { project: "p", stack: "s", resource: "edge" };

const backends = [
  {
    name: "KvmProxy",
    raw: {
      owner,
      connection: { host: "kvm1.lan", privateKey: "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n" },
      image: { url: "https://i.example/a.qcow2" },
      userData: "#cloud-config\n",
    } as Props,
    check: kvm.check,
    diff: (olds: Props, news: Props) => kvm.diff("id", olds, news),
  },
  {
    name: "ProxmoxProxy",
    raw: {
      owner,
      apiToken: "root@pam!edge=5ecret",
      node: "pve",
      templateVmid: 9000,
      diskStorage: "local-lvm",
      seedStorage: "local",
      userData: "#cloud-config\n",
    } as Props,
    check: proxmox.check,
    diff: (olds: Props, news: Props) => proxmox.diff("id", olds, news),
  },
];

describe("rotation by exit address (rotateEgress)", () => {
  it("canonical addresses: IPv6 in one spelling, IPv4 as is, anything else is not an address", () => {
    assert.equal(canonicalAddress("2001:DB8:0:0:0::7"), "2001:db8::7");
    assert.equal(canonicalAddress("203.0.113.9"), "203.0.113.9");
    assert.equal(canonicalAddress("kvm1-0"), undefined);
    assert.equal(canonicalAddress("203.0.113.09"), undefined);
  });

  for (const backend of backends)
    describe(backend.name, () => {
      async function created(egress: Props, rotateEgress?: Record<string, string>): Promise<Props> {
        const raw = rotateEgress === undefined ? backend.raw : { ...backend.raw, rotateEgress };
        const checked = await backend.check({}, raw);
        assert.deepEqual(checked.failures, []);
        return { ...checked.inputs, host: "h", ...egress };
      }
      async function planned(olds: Props, rotateEgress?: Record<string, string>) {
        const raw = rotateEgress === undefined ? backend.raw : { ...backend.raw, rotateEgress };
        const checked = await backend.check(olds, raw);
        assert.deepEqual(checked.failures, []);
        const decision = await backend.diff(olds, checked.inputs);
        return [decision.changes, decision.replaces];
      }

      it("replaces the member that leaves from a burned address (any spelling), nothing else changes", async () => {
        const burned = await created({ egressIp: "203.0.113.9", egressIpv6: "2001:db8::7" });
        const clean = await created({ egressIp: "203.0.113.10" });
        assert.deepEqual(await planned(burned, { "203.0.113.9": "burned-2026-12-04" }), [
          true,
          ["rotateEgress"],
        ]);
        assert.deepEqual(await planned(burned, { "2001:DB8::0:7": "burned" }), [
          true,
          ["rotateEgress"],
        ]);
        // Another member's address, or none recorded: the map alone is no change at all.
        assert.deepEqual(await planned(clean, { "203.0.113.9": "burned-2026-12-04" }), [false, []]);
        assert.deepEqual(await planned(await created({}), { "203.0.113.9": "x" }), [false, []]);
      });

      it("a replacement that still leaves from the burned address is not replaced again; a new text rotates again", async () => {
        const entry = { "203.0.113.9": "burned-2026-12-04" };
        const replacement = await created({ egressIp: "203.0.113.9" }, entry);
        assert.deepEqual(await planned(replacement, entry), [false, []]);
        assert.deepEqual(await planned(replacement, { ...entry, "198.51.100.4": "x" }), [
          false,
          [],
        ]);
        assert.deepEqual(await planned(replacement, { "203.0.113.9": "burned-again" }), [
          true,
          ["rotateEgress"],
        ]);
        // Dropping the entry later changes nothing either.
        assert.deepEqual(await planned(replacement), [false, []]);
      });

      it("check names the field and the fix for a key that is no address or an empty text", async () => {
        const { failures } = await backend.check(
          {},
          {
            ...backend.raw,
            rotateEgress: { "kvm1-0": "x", "203.0.113.9": "" },
          },
        );
        const text = JSON.stringify(failures);
        assert.match(
          text,
          /"property":"rotateEgress\.kvm1-0","reason":"rotateEgress must map exit addresses \(IPv4 or IPv6\) to texts/,
        );
        assert.match(text, /rotateEgress values must be texts of 1 to 200 characters/);
      });
    });

  it("the rule reads only the member's own recorded addresses", () => {
    assert.equal(
      egressRotationDue({ egressIp: null }, { rotateEgress: { "203.0.113.9": "x" } }),
      undefined,
    );
    assert.deepEqual(
      egressRotationDue({ egressIpv6: "2001:db8::7" }, { rotateEgress: { "2001:db8::7": "x" } }),
      { address: "2001:db8::7", text: "x" },
    );
  });
});
