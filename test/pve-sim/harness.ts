import { SecretValue } from "../../provider/common/redact";
import { ProxmoxClient } from "../../provider/proxmox/client";
import { forgetNodeListings } from "../../provider/proxmox/node-listings";
import { PveSimulator, SimulatorOptions } from "./simulator";

/**
 * Starts a simulator for one mocha suite and stops it afterwards, even when a
 * test fails (the server is in-process: closing it is all there is to stop).
 */
export function useSimulator(options: SimulatorOptions | (() => SimulatorOptions) = {}): {
  readonly sim: PveSimulator;
  client(token?: string): ProxmoxClient;
} {
  let current: PveSimulator | undefined;
  beforeEach(async () => {
    current = new PveSimulator(typeof options === "function" ? options() : options);
    await current.listen();
  });
  afterEach(async () => {
    await current?.settle();
    await current?.close();
    current = undefined;
  });
  return {
    get sim(): PveSimulator {
      if (current === undefined) throw new Error("simulator not started");
      return current;
    },
    client(token?: string): ProxmoxClient {
      if (current === undefined) throw new Error("simulator not started");
      return new ProxmoxClient({
        endpoint: current.endpoint,
        apiToken: new SecretValue(token ?? current.tokenFor()),
        caCertPem: current.caCertPem,
      });
    },
  };
}

/** A client for a running simulator, trusting its CA. */
export function clientFor(sim: PveSimulator, token?: string): ProxmoxClient {
  return new ProxmoxClient({
    endpoint: sim.endpoint,
    apiToken: new SecretValue(token ?? sim.tokenFor()),
    caCertPem: sim.caCertPem,
  });
}

/**
 * Where the engine would start a new provider process (each `pulumi refresh`
 * or `up` gets its own): no node listing an earlier Read shared is handed out
 * (provider/proxmox/node-listings.ts). For in-process tests that change a
 * host behind the provider's back between two refreshes; without it the
 * second would see, as one refresh does, a listing up to a window old.
 */
export function asIfNewProviderProcess(): void {
  forgetNodeListings(undefined);
}
