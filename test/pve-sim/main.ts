import { PveSimulator, PVE9_PROXY_PRIVILEGES } from "./simulator";

/**
 * `npm run pve-sim`: a simulator to point a real Pulumi program at by hand.
 * Prints the endpoint, the token and the CA file to use; stops on Ctrl-C.
 * Knobs come from the environment, all optional:
 *   PVE_SIM_PORT, PVE_SIM_LATENCY_MS, PVE_SIM_TASK_MS, PVE_SIM_5XX_RATE,
 *   PVE_SIM_AGENT_DELAY_MS, PVE_SIM_AGENT_NEVER=1, PVE_SIM_PVE8=1,
 *   PVE_SIM_FAIL_TASK=<task type> (e.g. qmclone)
 */
async function main(): Promise<void> {
  const env = process.env;
  const number = (name: string): number | undefined =>
    env[name] === undefined ? undefined : Number(env[name]);
  const failType = env.PVE_SIM_FAIL_TASK;
  const simulator = new PveSimulator({
    pveMajor: env.PVE_SIM_PVE8 === "1" ? 8 : 9,
    latencyMs: number("PVE_SIM_LATENCY_MS"),
    defaultTaskMs: number("PVE_SIM_TASK_MS") ?? 2000,
    serverErrorRate: number("PVE_SIM_5XX_RATE"),
    agentDelayMs: number("PVE_SIM_AGENT_DELAY_MS") ?? 3000,
    agentNeverUp: env.PVE_SIM_AGENT_NEVER === "1",
    guestAddress: () => "127.0.0.1",
    failTask:
      failType === undefined
        ? undefined
        : (type) => (type === failType ? "injected failure" : undefined),
    tokens: [
      {
        id: "automation@pve!egress",
        secret: "5e1c7a52-1d7c-4f0e-9f43-6a5b2c4d8e90",
        privileges: "all",
      },
      {
        id: "proxy@pve!least",
        secret: "0f9a7e15-3b8c-4d21-a6e4-9c2b7d1e5f30",
        privileges: PVE9_PROXY_PRIVILEGES,
      },
    ],
  });
  const endpoint = await simulator.listen(number("PVE_SIM_PORT") ?? 0);
  const { writeFileSync } = await import("node:fs");
  const caFile = `${process.cwd()}/pve-sim-ca.pem`;
  writeFileSync(caFile, simulator.caCertPem);
  console.log(
    `pve-sim listening: node ${simulator.node}, template 9000, disk storage local-lvm, seed storage seeds`,
  );
  console.log(`export PROXMOX_VE_ENDPOINT=${endpoint}`);
  console.log(`export PROXMOX_VE_API_TOKEN=${simulator.tokenFor()}`);
  console.log(`export PROXMOX_VE_CA_CERT=${caFile}`);
  const stop = () => {
    void simulator.close().then(() => process.exit(0));
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
}

void main();
