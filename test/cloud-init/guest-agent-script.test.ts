/**
 * The guest-agent vendor script, checked by the shells and linters Debian
 * ships and run under dash with stub package managers and init systems.
 * Each run happens in a private mount namespace whose /run is a fresh tmpfs,
 * so "systemd present" is real (/run/systemd/system exists) and nothing on
 * the host changes. test-needs: root (unshare --mount)
 */
import { strict as assert } from "node:assert";
import { spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { GUEST_AGENT_SCRIPT } from "../../provider/nocloud";
import { run, scratchDir } from "../support/iso-tools";

interface Scenario {
  /** Commands to stub: each logs its argv; an installer also drops a fake qemu-ga on PATH. */
  stubs: string[];
  systemd: boolean;
  /** Stub exits 100 for `apt-get install` until `apt-get update` ran. */
  aptNeedsUpdate?: boolean;
  /** Every installer stub fails. */
  installFails?: boolean;
  /** `systemctl is-active` says the agent runs (the boot or the package started it). */
  agentRunning?: boolean;
}

interface Outcome {
  status: number | null;
  stdout: string;
  calls: string[];
}

const INSTALLERS = new Set(["apt-get", "dnf", "yum", "zypper", "apk"]);

function stubScript(name: string, dir: string, log: string, scenario: Scenario): string {
  const record = `echo "${name} $*" >> ${log}`;
  if (name === "systemctl")
    return `#!/bin/sh\n${record}\n[ "$1" = is-active ] && exit ${scenario.agentRunning ? 0 : 3}\nexit 0\n`;
  if (!INSTALLERS.has(name)) return `#!/bin/sh\n${record}\nexit 0\n`;
  const dropAgent = `printf '#!/bin/sh\\nexit 0\\n' > ${dir}/qemu-ga; /bin/chmod +x ${dir}/qemu-ga`;
  const gate = scenario.installFails
    ? "exit 100"
    : scenario.aptNeedsUpdate && name === "apt-get"
      ? `case "$1" in update) : > ${dir}/.updated; exit 0;; esac\n[ -e ${dir}/.updated ] || exit 100`
      : "";
  return `#!/bin/sh\n${record}\n${gate}\n${dropAgent}\nexit 0\n`;
}

function prepare(scenario: Scenario): {
  dir: string;
  script: string;
  log: string;
  remove: () => void;
} {
  const scratch = scratchDir("agent-script");
  const bin = join(scratch.dir, "bin");
  mkdirSync(bin);
  const log = join(scratch.dir, "calls.log");
  writeFileSync(log, "");
  for (const name of scenario.stubs) {
    const path = join(bin, name);
    writeFileSync(path, stubScript(name, bin, log, scenario));
    chmodSync(path, 0o755);
  }
  const script = join(scratch.dir, "agent.sh");
  writeFileSync(script, GUEST_AGENT_SCRIPT);
  return { dir: bin, script, log, remove: scratch.remove };
}

function runScript(scenario: Scenario, times = 1): Outcome[] {
  const env = prepare(scenario);
  try {
    const outcomes: Outcome[] = [];
    for (let i = 0; i < times; i++) {
      writeFileSync(env.log, "");
      const setup = scenario.systemd ? "mkdir -p /run/systemd/system && " : "";
      const result = spawnSync(
        "/usr/bin/unshare",
        [
          "--mount",
          "--propagation",
          "private",
          "/bin/sh",
          "-c",
          `mount -t tmpfs tmpfs /run && ${setup}exec /usr/bin/env -i PATH=${env.dir} /bin/dash ${env.script}`,
        ],
        { encoding: "utf8" },
      );
      if (result.error) throw result.error;
      outcomes.push({
        status: result.status,
        stdout: result.stdout + result.stderr,
        calls: readFileSync(env.log, "utf8").split("\n").filter(Boolean),
      });
    }
    return outcomes;
  } finally {
    env.remove();
  }
}

describe("guest-agent vendor script", function () {
  this.timeout(120_000);

  before(() => {
    // The checks below rely on the host having no agent of its own.
    assert.ok(
      !existsSync("/usr/sbin/qemu-ga") && !existsSync("/usr/bin/qemu-ga"),
      "the host must not have qemu-ga installed",
    );
  });

  it("parses under sh -n and dash -n, and passes shellcheck as POSIX sh", () => {
    const scratch = scratchDir("agent-lint");
    try {
      const path = join(scratch.dir, "agent.sh");
      writeFileSync(path, GUEST_AGENT_SCRIPT);
      run("sh", ["-n", path]);
      run("dash", ["-n", path]);
      run("shellcheck", ["--shell=sh", "--severity=style", path]);
    } finally {
      scratch.remove();
    }
  });

  it("installs with apt-get and starts with systemd, and a second run installs nothing", () => {
    const [first, second] = runScript({ stubs: ["apt-get", "systemctl"], systemd: true }, 2);
    assert.equal(first.status, 0, first.stdout);
    assert.deepEqual(first.calls, [
      "apt-get install -y qemu-guest-agent",
      "systemctl is-active --quiet qemu-guest-agent",
      "systemctl enable qemu-guest-agent",
      "systemctl start qemu-guest-agent",
    ]);
    assert.equal(second.status, 0, second.stdout);
    assert.match(second.stdout, /already installed/);
    assert.deepEqual(second.calls, [
      "systemctl is-active --quiet qemu-guest-agent",
      "systemctl enable qemu-guest-agent",
      "systemctl start qemu-guest-agent",
    ]);
  });

  it("leaves an agent the boot already started alone: no enable (update-rc.d), no start", () => {
    const [outcome] = runScript({
      stubs: ["apt-get", "systemctl"],
      systemd: true,
      agentRunning: true,
    });
    assert.equal(outcome.status, 0, outcome.stdout);
    assert.deepEqual(outcome.calls, [
      "apt-get install -y qemu-guest-agent",
      "systemctl is-active --quiet qemu-guest-agent",
    ]);
    assert.match(outcome.stdout, /qemu-guest-agent is running/);
  });

  it("refreshes empty apt lists only when the first install fails", () => {
    const [outcome] = runScript({
      stubs: ["apt-get", "systemctl"],
      systemd: true,
      aptNeedsUpdate: true,
    });
    assert.equal(outcome.status, 0, outcome.stdout);
    assert.deepEqual(outcome.calls.slice(0, 3), [
      "apt-get install -y qemu-guest-agent",
      "apt-get update",
      "apt-get install -y qemu-guest-agent",
    ]);
  });

  it("uses dnf when present (and prefers it to yum)", () => {
    const [outcome] = runScript({ stubs: ["dnf", "yum", "systemctl"], systemd: true });
    assert.equal(outcome.status, 0, outcome.stdout);
    assert.deepEqual(outcome.calls[0], "dnf install -y qemu-guest-agent");
    assert.ok(!outcome.calls.some((call) => call.startsWith("yum")));
  });

  it("uses zypper, and apk with OpenRC", () => {
    const [zypper] = runScript({ stubs: ["zypper", "systemctl"], systemd: true });
    assert.equal(zypper.calls[0], "zypper --non-interactive install qemu-guest-agent");
    const [apk] = runScript({ stubs: ["apk", "rc-update", "rc-service"], systemd: false });
    assert.equal(apk.status, 0, apk.stdout);
    assert.deepEqual(apk.calls, [
      "apk add --no-cache qemu-guest-agent",
      "rc-update add qemu-guest-agent default",
      "rc-service qemu-guest-agent start",
    ]);
  });

  it("does not call systemctl when systemd is not running, and says so", () => {
    const [outcome] = runScript({ stubs: ["apt-get", "systemctl"], systemd: false });
    assert.equal(outcome.status, 0, outcome.stdout);
    assert.deepEqual(outcome.calls, ["apt-get install -y qemu-guest-agent"]);
    assert.match(outcome.stdout, /neither systemd nor OpenRC found/);
  });

  it("reports an image with no package manager and exits 0 without doing anything", () => {
    const [outcome] = runScript({ stubs: ["systemctl"], systemd: true });
    assert.equal(outcome.status, 0, outcome.stdout);
    assert.deepEqual(outcome.calls, []);
    assert.match(outcome.stdout, /no supported package manager/);
  });

  it("exits 1 with a message when the install fails, so cloud-init status shows it", () => {
    const [outcome] = runScript({ stubs: ["dnf", "systemctl"], systemd: true, installFails: true });
    assert.equal(outcome.status, 1, outcome.stdout);
    assert.match(outcome.stdout, /installing the agent failed/);
    assert.ok(!outcome.calls.some((call) => call.startsWith("systemctl")));
  });
});
