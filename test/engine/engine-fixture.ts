import { PveSimulator, type SimulatorOptions } from "../pve-sim/simulator";
import {
  captureResourceInputs,
  DynamicProviderServer,
  FakeEngine,
  packIntoConsumerProject,
  type CapturedResource,
  type ConsumerProject,
  type Props,
} from "./harness";

/**
 * The setup the engine tests that need no lab share: one consumer project
 * packed for the suite, and dynamic-provider servers, fake engines and
 * Proxmox simulators started on demand. Call it inside a `describe`: it
 * registers that suite's `before` (pack) and `after` (stop every server, then
 * every engine, settle and close every simulator, remove the project).
 */
export interface EngineFixture {
  /** The packed consumer project; available once the suite's `before` has run. */
  readonly project: ConsumerProject;
  /** Starts a server that is stopped after the suite; configures it when `config` is given. */
  startServer(options?: {
    config?: Record<string, string>;
    env?: NodeJS.ProcessEnv;
    /** Whose address the server logs to. */
    engine?: FakeEngine;
  }): Promise<DynamicProviderServer>;
  /**
   * The next `pulumi` command: the engine starts a provider process per
   * deployment, so a test that changes a host out of band between two
   * commands asks this for the second. Stops `previous` and starts a server
   * as it was started (same options and config): nothing the previous one
   * kept (a node listing shared by a refresh's Reads) carries over.
   */
  nextDeployment(previous: DynamicProviderServer): Promise<DynamicProviderServer>;
  startEngine(): Promise<FakeEngine>;
  /** A listening simulator whose guest agent answers after 20 ms unless `options` say otherwise. */
  startSimulator(options?: SimulatorOptions): Promise<PveSimulator>;
}

export function useEngineFixture(): EngineFixture {
  let project: ConsumerProject | undefined;
  const servers: DynamicProviderServer[] = [];
  const startedWith = new Map<DynamicProviderServer, Parameters<EngineFixture["startServer"]>[0]>();
  const engines: FakeEngine[] = [];
  const simulators: PveSimulator[] = [];

  before(() => {
    project = packIntoConsumerProject();
  });

  after(async () => {
    await Promise.all(servers.map((server) => server.stop()));
    await Promise.all(engines.map((engine) => engine.stop()));
    for (const sim of simulators) {
      await sim.settle();
      await sim.close();
    }
    project?.remove();
  });

  const fixture: EngineFixture = {
    get project(): ConsumerProject {
      if (!project) throw new Error("the consumer project is packed in the suite's before hook");
      return project;
    },
    async startServer(options = {}) {
      const server = await DynamicProviderServer.start(
        fixture.project,
        undefined,
        options.env,
        options.engine?.address,
      );
      servers.push(server);
      startedWith.set(server, options);
      if (options.config) await server.configure(options.config);
      return server;
    },
    async nextDeployment(previous) {
      const options = startedWith.get(previous);
      if (options === undefined)
        throw new Error("nextDeployment: a server this fixture did not start");
      await previous.stop();
      return fixture.startServer(options);
    },
    async startEngine() {
      const engine = await FakeEngine.start();
      engines.push(engine);
      return engine;
    },
    async startSimulator(options = {}) {
      const sim = new PveSimulator({ agentDelayMs: 20, ...options });
      simulators.push(sim);
      await sim.listen();
      return sim;
    },
  };
  return fixture;
}

/**
 * A ProxmoxProxy's arguments for the simulator's node `pve` (template 9000,
 * storages `local-lvm` and `seeds`, ready once it has an address, deadlines
 * that fit a test), with `overrides` on top.
 */
export function simulatorProxyArgs(sim: PveSimulator, overrides: Props = {}): Props {
  return {
    apiEndpoint: sim.endpoint,
    caCertPem: sim.caCertPem,
    node: "pve",
    templateVmid: 9000,
    diskStorage: "local-lvm",
    seedStorage: "seeds",
    readiness: { mode: "address" },
    timeouts: { createSeconds: 60, readySeconds: 20, deleteSeconds: 60 },
    ...overrides,
  };
}

/**
 * ProxmoxProxy members on the simulator whose guests answer through one
 * forward proxy: ready by its port, egress checked and re-checked through it
 * against the echo service, with `extra` inputs (the budget, a map).
 */
export async function captureSimulatorMembers(
  project: ConsumerProject,
  sim: PveSimulator,
  names: readonly string[],
  through: { proxyPort: number; echoPort: number; auth: { user: string; password: string } },
  extra: Props,
): Promise<CapturedResource[]> {
  const captured: CapturedResource[] = [];
  for (const name of names)
    captured.push(
      await captureResourceInputs(
        project,
        "ProxmoxProxy",
        name,
        simulatorProxyArgs(sim, {
          readiness: { mode: "port", port: through.proxyPort },
          egressCheck: { url: `http://127.0.0.1:${through.echoPort}/`, proxyAuth: through.auth },
          egressRecheck: true,
          timeouts: { createSeconds: 60, readySeconds: 8, deleteSeconds: 60 },
          ...extra,
        }),
      ),
    );
  return captured;
}
