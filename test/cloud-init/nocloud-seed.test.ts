/**
 * The seed as cloud-init itself reads it: NoCloud's file loader and the
 * user-data processor from Debian's cloud-init package, over a real ISO.
 */
import { strict as assert } from "node:assert";
import { randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { gunzipSync, gzipSync } from "node:zlib";
import { GUEST_AGENT_SCRIPT } from "../../provider/nocloud";
import {
  readSeedWithCloudInit,
  type CloudInitPart,
  type CloudInitView,
} from "../support/cloud-init";
import { scratchDir } from "../support/iso-tools";

function partsOf(view: CloudInitView["userDataParts"] | null): CloudInitPart[] {
  assert.ok(
    Array.isArray(view),
    `cloud-init could not process the document: ${JSON.stringify(view)}`,
  );
  return view;
}

const userMime = [
  'Content-Type: multipart/mixed; boundary="USERBOUNDARY"',
  "MIME-Version: 1.0",
  "",
  "--USERBOUNDARY",
  'Content-Type: text/cloud-config; charset="us-ascii"',
  "",
  "#cloud-config",
  "runcmd: [echo from-mime]",
  "--USERBOUNDARY",
  'Content-Type: text/x-shellscript; charset="us-ascii"',
  "",
  "#!/bin/sh",
  "echo user-script",
  "--USERBOUNDARY--",
  "",
].join("\n");

describe("NoCloud seed read by cloud-init's own code", function () {
  this.timeout(120_000);

  it("names the instance and the host after the VM in meta-data", () => {
    const view = readSeedWithCloudInit({ vmName: "proxy-abc123", userData: "#cloud-config\n" });
    assert.deepEqual(view.metaData, {
      "instance-id": "proxy-abc123",
      "local-hostname": "proxy-abc123",
    });
  });

  describe("user-data reaches cloud-init byte for byte, in every format", () => {
    const cloudConfig =
      "#cloud-config\n# a comment that must survive\nversion: 1.10\npackages: [squid]\n";

    it("cloud-config, comments and 1.10 intact", () => {
      const view = readSeedWithCloudInit({ vmName: "vm-a", userData: cloudConfig });
      assert.ok(view.files.get("user-data")!.equals(Buffer.from(cloudConfig)));
      const [part] = partsOf(view.userDataParts);
      assert.equal(part.type, "text/cloud-config");
      assert.equal(part.payload.toString(), cloudConfig);
    });

    it("Jinja template", () => {
      const jinja =
        "## template: jinja\n#cloud-config\nruncmd:\n  - echo {{ v1.local_hostname }}\n";
      const view = readSeedWithCloudInit({ vmName: "vm-b", userData: jinja });
      assert.ok(view.files.get("user-data")!.equals(Buffer.from(jinja)));
      const [part] = partsOf(view.userDataParts);
      assert.equal(part.type, "text/jinja2");
      assert.equal(part.payload.toString(), jinja);
    });

    it("MIME multipart: the user's own parts, types kept", () => {
      const view = readSeedWithCloudInit({ vmName: "vm-c", userData: userMime });
      assert.ok(view.files.get("user-data")!.equals(Buffer.from(userMime)));
      const parts = partsOf(view.userDataParts);
      assert.deepEqual(
        parts.map((p) => p.type),
        ["text/cloud-config", "text/x-shellscript"],
      );
      assert.equal(parts[1].payload.toString(), "#!/bin/sh\necho user-script");
    });

    it("gzip: cloud-init decompresses what we stored unchanged", () => {
      const gzipped = gzipSync(Buffer.from(cloudConfig));
      const view = readSeedWithCloudInit({ vmName: "vm-d", userData: gzipped });
      assert.ok(view.files.get("user-data")!.equals(gzipped));
      const [part] = partsOf(view.userDataParts);
      assert.equal(part.type, "text/cloud-config");
      assert.equal(part.payload.toString(), cloudConfig);
    });

    it("shell script", () => {
      const script = "#!/bin/bash\nset -e\necho 'héllo' > /tmp/x\n";
      const view = readSeedWithCloudInit({ vmName: "vm-e", userData: script });
      assert.ok(view.files.get("user-data")!.equals(Buffer.from(script)));
      const [part] = partsOf(view.userDataParts);
      assert.equal(part.type, "text/x-shellscript");
      assert.equal(part.payload.toString(), script);
    });

    it("#include (of a local file: no network)", () => {
      const scratch = scratchDir("include");
      try {
        const included = join(scratch.dir, "included.yaml");
        writeFileSync(included, "#cloud-config\nruncmd: [echo included]\n");
        const include = `#include\nfile://${included}\n`;
        const view = readSeedWithCloudInit({ vmName: "vm-f", userData: include });
        assert.ok(view.files.get("user-data")!.equals(Buffer.from(include)));
        const [part] = partsOf(view.userDataParts);
        assert.equal(part.type, "text/cloud-config");
        assert.equal(part.payload.toString(), "#cloud-config\nruncmd: [echo included]\n");
      } finally {
        scratch.remove();
      }
    });

    it("binary: stored unchanged even though cloud-init cannot use it", () => {
      const binary = Buffer.concat([Buffer.from([0xff, 0xfe, 0x00]), randomBytes(4096)]);
      const view = readSeedWithCloudInit({ vmName: "vm-g", userData: binary });
      assert.ok(view.files.get("user-data")!.equals(binary));
      const [part] = partsOf(view.userDataParts);
      assert.equal(part.type, "text/x-not-multipart");
      assert.ok(part.payload.equals(binary));
    });
  });

  describe("vendor-data", () => {
    it("is the guest-agent script alone by default, sniffed as a shell script", () => {
      const view = readSeedWithCloudInit({ vmName: "vm-h", userData: "#cloud-config\n" });
      assert.equal(view.files.get("vendor-data")!.toString(), GUEST_AGENT_SCRIPT);
      const [part] = partsOf(view.vendorDataParts);
      assert.equal(part.type, "text/x-shellscript");
      assert.equal(part.sniffed, "text/x-shellscript");
      assert.equal(part.payload.toString(), GUEST_AGENT_SCRIPT);
    });

    it("carries the script and configured cloud-config as one multipart, MIME headers first", () => {
      const extra = "#cloud-config\nntp: {enabled: true}\n";
      const view = readSeedWithCloudInit({ vmName: "vm-i", vendorData: extra });
      assert.match(view.files.get("vendor-data")!.toString(), /^MIME-Version: 1\.0\n/);
      const parts = partsOf(view.vendorDataParts);
      assert.deepEqual(
        parts.map((p) => p.type),
        ["text/x-shellscript", "text/cloud-config"],
      );
      assert.equal(parts[0].payload.toString(), GUEST_AGENT_SCRIPT);
      assert.equal(parts[1].payload.toString(), extra);
    });

    it("keeps configured vendor-data that is itself multipart, every part with its own type", () => {
      const view = readSeedWithCloudInit({ vmName: "vm-j", vendorData: userMime });
      const parts = partsOf(view.vendorDataParts);
      assert.deepEqual(
        parts.map((p) => p.type),
        ["text/x-shellscript", "text/cloud-config", "text/x-shellscript"],
      );
      assert.equal(parts[0].payload.toString(), GUEST_AGENT_SCRIPT);
      assert.equal(parts[2].payload.toString(), "#!/bin/sh\necho user-script");
    });

    it("keeps configured vendor-data that is a script, or gzip, beside the agent script", () => {
      const script = "#!/bin/sh\necho vendor-extra\n";
      const scriptParts = partsOf(
        readSeedWithCloudInit({ vmName: "vm-k", vendorData: script }).vendorDataParts,
      );
      assert.deepEqual(
        scriptParts.map((p) => [p.type, p.payload.toString()]),
        [
          ["text/x-shellscript", GUEST_AGENT_SCRIPT],
          ["text/x-shellscript", script],
        ],
      );
      const gz = gzipSync(Buffer.from("#cloud-config\nlocale: C.UTF-8\n"));
      const gzParts = partsOf(
        readSeedWithCloudInit({ vmName: "vm-l", vendorData: gz }).vendorDataParts,
      );
      assert.deepEqual(
        gzParts.map((p) => p.type),
        ["text/x-shellscript", "text/cloud-config"],
      );
      assert.equal(gzParts[1].payload.toString(), gunzipSync(gz).toString());
    });

    describe("non-ASCII text reaches the handlers intact beside the agent script", () => {
      const text =
        '#cloud-config\nwrite_files:\n- path: /etc/motd\n  content: "Grüße aus 東京 ✓"\n';
      const script = "#!/bin/sh\necho 'Grüße aus 東京 ✓'\n";
      const cases: Array<[string, Buffer, string]> = [
        ["plain cloud-config", Buffer.from(text), "text/cloud-config"],
        ["gzip cloud-config", gzipSync(Buffer.from(text)), "text/cloud-config"],
        ["gzip shell script", gzipSync(Buffer.from(script)), "text/x-shellscript"],
      ];
      for (const [name, vendorData, type] of cases)
        it(name, () => {
          const parts = partsOf(
            readSeedWithCloudInit({ vmName: "vm-u", vendorData }).vendorDataParts,
          );
          assert.deepEqual(
            parts.map((p) => p.type),
            ["text/x-shellscript", type],
          );
          const expected = vendorData[0] === 0x1f ? gunzipSync(vendorData) : vendorData;
          assert.equal(parts[1].payload.toString("utf8"), expected.toString("utf8"));
          assert.ok(parts[1].handed.equals(expected), parts[1].handed.toString("utf8"));
          assert.ok(parts[0].handed.equals(Buffer.from(GUEST_AGENT_SCRIPT)));
        });

      it("gzip that is a MIME multipart of its own: each part keeps its type and text", () => {
        // A MIME part with 8-bit text needs a transfer encoding; cloud-init mangles it otherwise,
        // whoever wraps it. Given one, it survives gzip and our multipart.
        const mime = [
          'Content-Type: multipart/mixed; boundary="USERBOUNDARY"',
          "MIME-Version: 1.0",
          "",
          "--USERBOUNDARY",
          'Content-Type: text/cloud-config; charset="us-ascii"',
          "",
          "#cloud-config",
          "runcmd: [echo from-mime]",
          "--USERBOUNDARY",
          'Content-Type: text/x-shellscript; charset="utf-8"',
          "Content-Transfer-Encoding: base64",
          "",
          Buffer.from(script).toString("base64"),
          "--USERBOUNDARY--",
          "",
        ].join("\n");
        const parts = partsOf(
          readSeedWithCloudInit({ vmName: "vm-v", vendorData: gzipSync(Buffer.from(mime)) })
            .vendorDataParts,
        );
        assert.deepEqual(
          parts.map((p) => p.type),
          ["text/x-shellscript", "text/cloud-config", "text/x-shellscript"],
        );
        assert.equal(parts[2].handed.toString("utf8"), script);
      });
    });

    it("is only the configured vendor-data, verbatim, when installGuestAgent is false", () => {
      const extra = "#cloud-config\nruncmd: [echo only-this]\n";
      const view = readSeedWithCloudInit({
        vmName: "vm-m",
        vendorData: extra,
        installGuestAgent: false,
      });
      assert.equal(view.files.get("vendor-data")!.toString(), extra);
      assert.deepEqual(
        partsOf(view.vendorDataParts).map((p) => p.type),
        ["text/cloud-config"],
      );
    });

    it("is absent when there is neither script nor configured vendor-data", () => {
      const view = readSeedWithCloudInit({ vmName: "vm-n", installGuestAgent: false });
      assert.equal(view.files.has("vendor-data"), false);
      assert.equal(view.vendorDataParts, null);
    });
  });

  it("passes network-config through byte for byte", () => {
    const networkConfig =
      "version: 2\nethernets:\n  id0:\n    match: {macaddress: '52:54:00:12:34:56'}\n    dhcp4: true\n";
    const view = readSeedWithCloudInit({ vmName: "vm-o", networkConfig });
    assert.equal(view.files.get("network-config")!.toString(), networkConfig);
  });
});
