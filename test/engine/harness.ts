import { ChildProcess, execFileSync, spawn } from "node:child_process";
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import * as grpc from "@grpc/grpc-js";
import { Struct } from "google-protobuf/google/protobuf/struct_pb";
import { Status } from "@pulumi/pulumi/proto/status_pb";
import * as providerRpc from "@pulumi/pulumi/proto/provider_grpc_pb";
import * as providerProto from "@pulumi/pulumi/proto/provider_pb";
import * as engineRpc from "@pulumi/pulumi/proto/engine_grpc_pb";
import { Empty } from "google-protobuf/google/protobuf/empty_pb";
import { packRepository } from "./pack";
import { ProgramHost } from "./program-host";

/**
 * Does what the Pulumi engine does with a dynamic resource, using the SDK's own
 * parts (docs/pulumi.md, "Testing without the CLI"):
 *
 * 1. `packIntoConsumerProject`: `npm pack` this repository and unpack it into
 *    a temporary consumer project's node_modules, so module resolution and
 *    closure serialization see the package exactly as users install it.
 * 2. `captureResourceInputs`: run a tiny consumer program under
 *    `pulumi.runtime.setMocks` (in a child process, so mocks never leak into
 *    other tests) and capture the inputs the resource registers, including the
 *    serialized `__provider`.
 * 3. `DynamicProviderServer.start`: spawn `@pulumi/pulumi/cmd/dynamic-provider`
 *    from the consumer directory, read its port, and talk to it with the
 *    generated `ResourceProviderClient`: Configure, Check, Diff, Create, Read,
 *    Update, Delete, with google-protobuf Structs, as the engine does.
 *
 * Generic on purpose: any dynamic resource exported by the package can be
 * driven (ProxmoxProxy now, KvmProxy next).
 */

const REPOSITORY = resolve(__dirname, "..", "..", "..");

export interface ConsumerProject {
  dir: string;
  packageName: string;
  /** Removes the directory. */
  remove(): void;
}

/**
 * Packs the already-built repository (`npm run build` first) and installs the
 * tarball into a fresh consumer project. Dependencies are linked from this
 * repository's node_modules (all but `without`): no registry is contacted.
 * The test command packs once after its build and names the tarball in
 * EGRESS_PACKED_TARBALL; without it, each project packs anew.
 */
export function packIntoConsumerProject(
  options: { without?: readonly string[] } = {},
): ConsumerProject {
  const dir = mkdtempSync(join(tmpdir(), "egress-consumer-"));
  try {
    const manifest = JSON.parse(readFileSync(join(REPOSITORY, "package.json"), "utf8")) as {
      name: string;
    };
    // The tarball lies in the project, as `npm pack --pack-destination` leaves it.
    const prepacked = process.env.EGRESS_PACKED_TARBALL;
    let tarball: string;
    if (prepacked !== undefined && existsSync(prepacked)) {
      tarball = join(dir, basename(prepacked));
      copyFileSync(prepacked, tarball);
    } else tarball = packRepository(dir);
    const modules = join(dir, "node_modules");
    const target = join(modules, manifest.name);
    mkdirSync(target, { recursive: true });
    execFileSync("tar", ["-xzf", tarball, "-C", target, "--strip-components=1"]);
    linkDependencies(join(REPOSITORY, "node_modules"), modules, [
      manifest.name,
      ...(options.without ?? []),
    ]);
    writeFileSync(
      join(dir, "package.json"),
      JSON.stringify({
        name: "egress-consumer",
        private: true,
        dependencies: { [manifest.name]: "file:packed" },
      }),
    );
    return {
      dir,
      packageName: manifest.name,
      remove: () => {
        ProgramHost.stopUnder(dir);
        rmSync(dir, { recursive: true, force: true });
      },
    };
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
}

/**
 * Links every package in `from` into `to`, except `skip` (names like `ssh2` or
 * `@scope/name`); a scope holding a skipped package gets a real directory of
 * links, so a consumer can lack one optional peer dependency.
 */
function linkDependencies(from: string, to: string, skip: readonly string[]): void {
  for (const entry of readdirSync(from)) {
    if (entry.startsWith(".") || skip.includes(entry)) continue;
    const skippedInScope = skip.filter((name) => name.startsWith(`${entry}/`));
    if (skippedInScope.length === 0) {
      symlinkSync(join(from, entry), join(to, entry));
      continue;
    }
    mkdirSync(join(to, entry));
    linkDependencies(
      join(from, entry),
      join(to, entry),
      skippedInScope.map((name) => name.slice(entry.length + 1)),
    );
  }
}

export interface CapturedResource {
  type: string;
  name: string;
  /** As the engine hands them to a provider that does not accept secrets: unwrapped. */
  inputs: Record<string, unknown>;
  /** Top-level inputs that were registered as secrets. */
  secretInputs: string[];
  /** The id a `.get` asked for (a ReadResource); undefined for a registration. */
  id?: string;
  urn: string;
}

/** The SDK's wire marker for a secret value. */
export const SECRET_SIGNATURE_KEY = "4dabf18193072939515e22adb298388d";
export const SECRET_SIGNATURE = "1b47061264138c4ac30d75fd1eb44270";

/** A value as the engine hands it to a provider that does not accept secrets: marks removed. */
export function unwrapSecrets(value: unknown, onSecret: () => void = () => undefined): unknown {
  if (Array.isArray(value)) return value.map((item) => unwrapSecrets(item, onSecret));
  if (typeof value === "object" && value !== null) {
    const record = value as Record<string, unknown>;
    if (record[SECRET_SIGNATURE_KEY] === SECRET_SIGNATURE) {
      onSecret();
      return unwrapSecrets(record.value, () => undefined);
    }
    return Object.fromEntries(
      Object.entries(record).map(([key, item]) => [key, unwrapSecrets(item, onSecret)]),
    );
  }
  return value;
}

const CAPTURE_PROGRAM = `
const fs = require("node:fs");
const pulumi = require("@pulumi/pulumi");
async function main(outFile, moduleName, exportName, resourceName, argsJson, project, stack, getId) {
  await pulumi.runtime.setMocks(
    {
      newResource(args) {
        fs.writeFileSync(outFile, JSON.stringify({ type: args.type, name: args.name, inputs: args.inputs, id: args.id }));
        return { id: args.name + "-id", state: args.inputs };
      },
      call(args) {
        return args.inputs;
      },
    },
    project,
    stack,
    false,
  );
  const exported = require(moduleName)[exportName];
  if (getId) exported.get(resourceName, getId, JSON.parse(argsJson));
  else new exported(resourceName, JSON.parse(argsJson));
}
`;

/** The project and stack a consumer program and the provider server run as, unless a test says otherwise. */
export const CONSUMER_IDENTITY = { project: "egress-consumer", stack: "engine-test" };

export const urnOf = (identity: { project: string; stack: string }, type: string, name: string) =>
  `urn:pulumi:${identity.stack}::${identity.project}::${type}::${name}`;

/**
 * Runs `program` (which defines an async `main`) in a node process in the
 * consumer directory, so the installed package resolves as users see it and
 * mocks never leak into other tests, and returns what it wrote to its first
 * argument, a file. Its arguments are that file, then the package name,
 * `exportName`, `resourceName`, the JSON of `args`, the project and stack of
 * `identity`, then `extra`. `name` names the program's files. The process
 * stays for the next run of the same program (./program-host.ts).
 */
export async function runResourceProgram(
  project: ConsumerProject,
  name: string,
  program: string,
  resource: { exportName: string; resourceName: string; args: Record<string, unknown> },
  identity: { project: string; stack: string },
  extra: readonly string[] = [],
): Promise<string> {
  const host = ProgramHost.for(join(project.dir, `${name}-program.js`), program, project.dir);
  const outFile = join(project.dir, `${name}-output-${++programRuns}.json`);
  await host.run([
    outFile,
    project.packageName,
    resource.exportName,
    resource.resourceName,
    JSON.stringify(resource.args),
    identity.project,
    identity.stack,
    ...extra,
  ]);
  try {
    return readFileSync(outFile, "utf8");
  } catch (error) {
    throw new Error(
      `the consumer program registered nothing: ${error instanceof Error ? error.message : String(error)}`,
    );
  } finally {
    rmSync(outFile, { force: true });
  }
}
let programRuns = 0;

/**
 * Runs a consumer program that constructs `new <exportName>(resourceName, args)`
 * from the installed package under mocks, and returns what it registered. A
 * serialization failure of `__provider` fails here, as it would in `pulumi up`.
 */
export async function captureResourceInputs(
  project: ConsumerProject,
  exportName: string,
  resourceName: string,
  args: Record<string, unknown>,
  identity: { project: string; stack: string } = CONSUMER_IDENTITY,
  /** Capture `<exportName>.get(resourceName, getId, args)` (a ReadResource) instead. */
  getId?: string,
): Promise<CapturedResource> {
  const captured = JSON.parse(
    await runResourceProgram(
      project,
      "capture",
      CAPTURE_PROGRAM,
      { exportName, resourceName, args },
      identity,
      getId === undefined ? [] : [getId],
    ),
  ) as Pick<CapturedResource, "type" | "name" | "inputs" | "id">;
  const secretInputs: string[] = [];
  const inputs: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(captured.inputs))
    inputs[key] = unwrapSecrets(value, () => secretInputs.push(key));
  return {
    ...captured,
    inputs,
    secretInputs,
    urn: urnOf(identity, captured.type, captured.name),
  };
}

export type Props = Record<string, unknown>;

export interface CheckReply {
  inputs: Props;
  failures: Array<{ property: string; reason: string }>;
}

export interface DiffReply {
  changes: "none" | "some" | "unknown";
  replaces: string[];
  deleteBeforeReplace: boolean;
}

/** A failed call; `initFailure` is set when create/update reported a partially created resource. */
export class EngineCallError extends Error {
  constructor(
    message: string,
    readonly code: number,
    readonly initFailure?: { id: string; properties: Props; reasons: string[] },
  ) {
    super(message);
  }
}

/** The dynamic-provider gRPC server, started from a consumer directory and stopped by its PID. */
export class DynamicProviderServer {
  private constructor(
    private readonly child: ChildProcess,
    readonly client: providerRpc.ResourceProviderClient,
    readonly stderr: () => string,
  ) {}

  /** Every call gets a deadline, like every other network call in this project. */
  callTimeoutMs = 120_000;

  static async start(
    project: ConsumerProject,
    identity: { project: string; stack: string } = CONSUMER_IDENTITY,
    env: NodeJS.ProcessEnv = process.env,
    /** What the engine passes as the provider's first argument; a FakeEngine's address to see logs. */
    engineAddress = "127.0.0.1:1",
    /** A command that execs its arguments (e.g. `unshare ...`): the provider runs under it, same PID. */
    launcher: string[] = [],
  ): Promise<DynamicProviderServer> {
    const entry = require.resolve("@pulumi/pulumi/cmd/dynamic-provider", { paths: [project.dir] });
    const [command, ...prefix] = [...launcher, process.execPath];
    const child = spawn(command!, [...prefix, entry, engineAddress], {
      cwd: project.dir,
      env: { ...env, PULUMI_NODEJS_PROJECT: identity.project, PULUMI_NODEJS_STACK: identity.stack },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    try {
      const port = await new Promise<number>((resolvePort, reject) => {
        let stdout = "";
        const timer = setTimeout(
          () => reject(new Error(`no port from the dynamic provider in 30 s: ${stderr}`)),
          30_000,
        );
        child.stdout!.on("data", (chunk: Buffer) => {
          stdout += chunk.toString();
          const match = /^(\d+)\s*$/m.exec(stdout);
          if (match) {
            clearTimeout(timer);
            resolvePort(Number(match[1]));
          }
        });
        child.once("exit", (code) => {
          clearTimeout(timer);
          reject(
            new Error(`the dynamic provider exited (${code}) before printing its port: ${stderr}`),
          );
        });
      });
      const client = new providerRpc.ResourceProviderClient(
        `127.0.0.1:${port}`,
        grpc.credentials.createInsecure(),
      );
      return new DynamicProviderServer(child, client, () => stderr);
    } catch (error) {
      if (child.exitCode === null) child.kill("SIGKILL");
      throw error;
    }
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Stops the server this harness started (by its PID) and waits for it to exit. */
  async stop(): Promise<void> {
    this.client.close();
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise<void>((resolveExit) => this.child.once("exit", () => resolveExit()));
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(timer);
  }

  async configure(config: Record<string, string>): Promise<void> {
    const request = new providerProto.ConfigureRequest();
    request.setArgs(Struct.fromJavaScript(config as never));
    for (const [key, value] of Object.entries(config)) request.getVariablesMap().set(key, value);
    await this.unary<providerProto.ConfigureResponse>((callback) =>
      this.client.configure(request, this.metadata(), this.options(), callback),
    );
  }

  async check(urn: string, olds: Props, news: Props): Promise<CheckReply> {
    const request = new providerProto.CheckRequest();
    request.setUrn(urn);
    request.setOlds(toStruct(olds));
    request.setNews(toStruct(news));
    const reply = await this.unary<providerProto.CheckResponse>((callback) =>
      this.client.check(request, this.metadata(), this.options(), callback),
    );
    return {
      inputs: (reply.getInputs()?.toJavaScript() ?? {}) as Props,
      failures: reply
        .getFailuresList()
        .map((failure) => ({ property: failure.getProperty(), reason: failure.getReason() })),
    };
  }

  async diff(urn: string, id: string, olds: Props, news: Props): Promise<DiffReply> {
    const request = new providerProto.DiffRequest();
    request.setUrn(urn);
    request.setId(id);
    request.setOlds(toStruct(olds));
    request.setNews(toStruct(news));
    const reply = await this.unary<providerProto.DiffResponse>((callback) =>
      this.client.diff(request, this.metadata(), this.options(), callback),
    );
    const changes = reply.getChanges();
    return {
      changes:
        changes === providerProto.DiffResponse.DiffChanges.DIFF_SOME
          ? "some"
          : changes === providerProto.DiffResponse.DiffChanges.DIFF_NONE
            ? "none"
            : "unknown",
      replaces: reply.getReplacesList(),
      deleteBeforeReplace: reply.getDeletebeforereplace(),
    };
  }

  async create(urn: string, properties: Props): Promise<{ id: string; properties: Props }> {
    const request = new providerProto.CreateRequest();
    request.setUrn(urn);
    request.setProperties(toStruct(properties));
    const reply = await this.unary<providerProto.CreateResponse>((callback) =>
      this.client.create(request, this.metadata(), this.options(), callback),
    );
    return {
      id: reply.getId(),
      properties: (reply.getProperties()?.toJavaScript() ?? {}) as Props,
    };
  }

  async read(
    urn: string,
    id: string,
    properties: Props,
    inputs: Props,
  ): Promise<{ id: string; properties: Props; inputs: Props }> {
    const request = new providerProto.ReadRequest();
    request.setUrn(urn);
    request.setId(id);
    request.setProperties(toStruct(properties));
    request.setInputs(toStruct(inputs));
    const reply = await this.unary<providerProto.ReadResponse>((callback) =>
      this.client.read(request, this.metadata(), this.options(), callback),
    );
    return {
      id: reply.getId(),
      properties: (reply.getProperties()?.toJavaScript() ?? {}) as Props,
      inputs: (reply.getInputs()?.toJavaScript() ?? {}) as Props,
    };
  }

  async update(urn: string, id: string, olds: Props, news: Props): Promise<Props> {
    const request = new providerProto.UpdateRequest();
    request.setUrn(urn);
    request.setId(id);
    request.setOlds(toStruct(olds));
    request.setNews(toStruct(news));
    const reply = await this.unary<providerProto.UpdateResponse>((callback) =>
      this.client.update(request, this.metadata(), this.options(), callback),
    );
    return (reply.getProperties()?.toJavaScript() ?? {}) as Props;
  }

  async delete(urn: string, id: string, properties: Props): Promise<void> {
    const request = new providerProto.DeleteRequest();
    request.setUrn(urn);
    request.setId(id);
    request.setProperties(toStruct(properties));
    await this.unary((callback) =>
      this.client.delete(request, this.metadata(), this.options(), callback),
    );
  }

  private metadata(): grpc.Metadata {
    return new grpc.Metadata();
  }

  private options(): Partial<grpc.CallOptions> {
    return { deadline: Date.now() + this.callTimeoutMs };
  }

  private unary<T>(
    call: (callback: (error: grpc.ServiceError | null, reply: T) => void) => void,
  ): Promise<T> {
    return new Promise((resolveCall, reject) => {
      call((error, reply) => (error ? reject(engineError(error)) : resolveCall(reply)));
    });
  }
}

/** Unwraps the ErrorResourceInitFailed detail the server packs for partially created resources. */
function engineError(error: grpc.ServiceError): EngineCallError {
  const details = error.metadata?.get("grpc-status-details-bin")?.[0];
  if (details instanceof Buffer) {
    const status = Status.deserializeBinary(new Uint8Array(details));
    for (const any of status.getDetailsList()) {
      if (!any.getTypeUrl().endsWith("pulumirpc.ErrorResourceInitFailed")) continue;
      const failure = providerProto.ErrorResourceInitFailed.deserializeBinary(any.getValue_asU8());
      return new EngineCallError(error.details || error.message, error.code, {
        id: failure.getId(),
        properties: (failure.getProperties()?.toJavaScript() ?? {}) as Props,
        reasons: failure.getReasonsList(),
      });
    }
  }
  return new EngineCallError(error.details || error.message, error.code);
}

function toStruct(props: Props): Struct {
  return Struct.fromJavaScript(JSON.parse(JSON.stringify(props)) as never);
}

/**
 * The engine's own gRPC service, reduced to what a provider calls on it: Log.
 * Records every line so tests can prove progress reaches `pulumi up` output.
 */
export class FakeEngine {
  private constructor(
    private readonly server: grpc.Server,
    readonly address: string,
    /** Every line the provider logged, in order. */
    readonly logs: Array<{ severity: number; message: string; ephemeral: boolean }>,
  ) {}

  static async start(): Promise<FakeEngine> {
    const server = new grpc.Server();
    const logs: Array<{ severity: number; message: string; ephemeral: boolean }> = [];
    server.addService(engineRpc.EngineService as unknown as grpc.ServiceDefinition, {
      log: (
        call: { request: { getSeverity(): number; getMessage(): string; getEphemeral(): boolean } },
        callback: (error: null, reply: unknown) => void,
      ) => {
        logs.push({
          severity: call.request.getSeverity(),
          message: call.request.getMessage(),
          ephemeral: call.request.getEphemeral(),
        });
        callback(null, new Empty());
      },
    });
    const port = await new Promise<number>((resolvePort, reject) =>
      server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (error, bound) =>
        error ? reject(error) : resolvePort(bound),
      ),
    );
    return new FakeEngine(server, `127.0.0.1:${port}`, logs);
  }

  stop(): Promise<void> {
    return new Promise((resolveStop) => this.server.tryShutdown(() => resolveStop()));
  }
}
