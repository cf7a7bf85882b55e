/**
 * `egress-proxies doctor`: the preflight KvmProxy runs before every create,
 * run on demand against the KVM hosts of a stack config or one host given by
 * flags, with a table or JSON and an exit status; `--fix` applies the safe
 * fixes (fix.ts) and checks again. See docs/kvm.md ("A stock host").
 */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { parseArgs, promisify } from "node:util";
import { Deadline } from "../../provider/common/deadline";
import { EgressProxyError } from "../../provider/common/errors";
import { safeErrorMessage } from "../../provider/common/redact";
import { closeAllHosts, openHost } from "../../provider/kvm/connect";
import { runPreflight } from "../../provider/kvm/host-facts";
import { applySafeFixes } from "./fix";
import { hostPassed, renderJson, renderTable, type HostReport } from "./report";
import { TargetError, targetFromFlags, targetsFromStackConfig, type DoctorTarget } from "./targets";

export const DOCTOR_USAGE = `usage: egress-proxies doctor [--fix] [--json] [--timeout 60]
         [--stack <name> [--cwd <dir>] | --config-json <file>]
         [--host <host> [--port 22] [--user root] [--identity <key file>] [--known-hosts <file>]
                        [--jump [user@]host[:port][,...]]]
         [--socket /var/run/libvirt/libvirt-sock] [--pool default] [--network default | --bridge br0]
         [--firmware uefi|bios] [--domain-type kvm|qemu]
  Without --stack, --config-json or --host: the local libvirt socket with KvmProxy's defaults.
  --stack runs \`pulumi config --json --show-secrets --stack <name>\`; --config-json reads its saved output.`;

const DOCTOR_EXIT = { ready: 0, notReady: 1, usage: 2 } as const;

export interface Output {
  out(text: string): void;
  err(text: string): void;
  /** The terminal's width when stdout is one; the table fits 80 columns otherwise. */
  columns?: number;
}

const run = promisify(execFile);

async function stackConfigJson(stack: string, cwd: string | undefined): Promise<unknown> {
  try {
    const { stdout } = await run(
      "pulumi",
      ["config", "--json", "--show-secrets", "--stack", stack],
      {
        cwd,
        timeout: 120_000,
        maxBuffer: 16 * 1024 * 1024,
      },
    );
    return JSON.parse(stdout) as unknown;
  } catch (error) {
    throw new TargetError(
      `\`pulumi config --json --stack ${stack}\` failed: ${safeErrorMessage(error as Error).split("\n")[0]}`,
    );
  }
}

function readJsonFile(path: string): unknown {
  try {
    return JSON.parse(readFileSync(path, "utf8")) as unknown;
  } catch (error) {
    throw new TargetError(`--config-json ${path}: ${(error as Error).message}`);
  }
}

async function examine(
  target: DoctorTarget,
  fix: boolean,
  timeoutSeconds: number,
): Promise<HostReport> {
  const deadline = Deadline.afterSeconds(timeoutSeconds, "--timeout");
  try {
    const { host } = await openHost(target.connectTo, deadline, {
      privateKeySource: target.privateKeySource,
    });
    let findings = await runPreflight(host, target.wants, { autostart: true });
    const fixed = fix ? await applySafeFixes(host, findings) : [];
    if (fixed.length > 0) findings = await runPreflight(host, target.wants, { autostart: true });
    return { target, findings, fixed };
  } catch (error) {
    // The table says host and check already: the detail without the "connect <host>:" prefix.
    const problem = safeErrorMessage(error instanceof EgressProxyError ? error.detail : error);
    return { target, problem, findings: [], fixed: [] };
  }
}

export async function doctor(argv: string[], output: Output): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        fix: { type: "boolean", default: false },
        json: { type: "boolean", default: false },
        timeout: { type: "string", default: "60" },
        stack: { type: "string" },
        cwd: { type: "string" },
        "config-json": { type: "string" },
        host: { type: "string" },
        port: { type: "string" },
        user: { type: "string" },
        identity: { type: "string" },
        "known-hosts": { type: "string" },
        jump: { type: "string" },
        "insecure-ignore-host-key": { type: "boolean", default: false },
        socket: { type: "string" },
        pool: { type: "string" },
        network: { type: "string" },
        bridge: { type: "string" },
        firmware: { type: "string" },
        "domain-type": { type: "string" },
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
    }));
  } catch (error) {
    output.err(`egress-proxies doctor: ${(error as Error).message}\n${DOCTOR_USAGE}`);
    return DOCTOR_EXIT.usage;
  }
  if (values.help) {
    output.out(DOCTOR_USAGE);
    return DOCTOR_EXIT.ready;
  }
  const timeoutSeconds = Number(values.timeout);
  if (!Number.isInteger(timeoutSeconds) || timeoutSeconds < 1 || timeoutSeconds > 3600) {
    output.err(`egress-proxies doctor: --timeout must be whole seconds between 1 and 3600`);
    return DOCTOR_EXIT.usage;
  }
  let targets: DoctorTarget[];
  try {
    const sources = [values.stack, values["config-json"], values.host].filter(
      (v) => v !== undefined,
    );
    if (sources.length > 1) throw new TargetError("give one of --stack, --config-json and --host");
    if (values.stack !== undefined)
      targets = targetsFromStackConfig(
        await stackConfigJson(values.stack, values.cwd),
        `stack ${values.stack}`,
      );
    else if (values["config-json"] !== undefined)
      targets = targetsFromStackConfig(readJsonFile(values["config-json"]), values["config-json"]);
    else
      targets = [
        targetFromFlags({
          host: values.host,
          port: values.port,
          user: values.user,
          identity: values.identity,
          knownHosts: values["known-hosts"],
          jump: values.jump,
          insecureIgnoreHostKey: values["insecure-ignore-host-key"],
          socket: values.socket,
          pool: values.pool,
          network: values.network,
          bridge: values.bridge,
          firmware: values.firmware,
          domainType: values["domain-type"],
        }),
      ];
  } catch (error) {
    if (!(error instanceof TargetError)) throw error;
    output.err(`egress-proxies doctor: ${error.message}`);
    return DOCTOR_EXIT.usage;
  }
  try {
    const reports = await Promise.all(
      targets.map((target) => examine(target, values.fix, timeoutSeconds)),
    );
    // A problem is in the table (or the JSON) once: not repeated on stderr.
    output.out(values.json ? renderJson(reports) : renderTable(reports, output.columns ?? 80));
    return reports.every(hostPassed) ? DOCTOR_EXIT.ready : DOCTOR_EXIT.notReady;
  } finally {
    await closeAllHosts();
  }
}
