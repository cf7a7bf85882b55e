/**
 * The SSH layer runs ssh2's own client and key parser, loaded from their
 * files, and a process that dials does not load the rest of ssh2 (its
 * server, HTTP agents and key generator: 3.5 MB resident).
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import * as ssh2 from "ssh2";
import { Ssh2Client, parseSshKey, ssh2File } from "../../../provider/ssh/ssh2-parts";
import { sshKeyPair } from "../../support/ssh-keys";

const DIST = join(__dirname, "..", "..", "..");

describe("ssh2 parts", () => {
  it("are ssh2's own Client and parseKey", () => {
    assert.equal(Ssh2Client, ssh2.Client);
    assert.equal(parseSshKey, ssh2.utils.parseKey);
    const parsed = parseSshKey(sshKeyPair().private);
    assert.ok(!(parsed instanceof Error), "the key parser reads a key ssh2 made");
  });

  it("names a file ssh2 does not have with an error, not a silent undefined", () => {
    assert.throws(() => ssh2File("./no-such-file.js"), /Cannot find module/);
  });

  it("loads no ssh2 server, HTTP agent or key generator in a process that uses the SSH layer", () => {
    const program = `
      require(${JSON.stringify(join(DIST, "provider", "ssh"))});
      require(${JSON.stringify(join(DIST, "provider", "libvirt-rpc-xdr"))});
      const loaded = Object.keys(require.cache).filter((p) => p.includes("/ssh2/lib/"));
      console.log(JSON.stringify(loaded.map((p) => p.slice(p.indexOf("/ssh2/lib/") + 10))));`;
    const result = spawnSync(process.execPath, ["-e", program], {
      encoding: "utf8",
      timeout: 30_000,
    });
    assert.equal(result.status, 0, result.stderr);
    const loaded = JSON.parse(result.stdout) as string[];
    assert.ok(loaded.includes("client.js"), `ssh2's client is loaded: ${loaded.join(" ")}`);
    for (const unused of ["index.js", "server.js", "http-agents.js", "keygen.js"]) {
      assert.ok(!loaded.includes(unused), `${unused} is not loaded: ${loaded.join(" ")}`);
    }
  });
});
