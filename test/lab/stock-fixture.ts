/**
 * The stock-host profile as a mocha fixture: `useStockHost()` in a suite's
 * `before`; the processes this run started are stopped, by PID, in a
 * root-level `after` hook. A profile that cannot start fails loudly.
 */
import { stopStockHostProcesses } from "./stock-host";

export * from "./stock-host";

after(async function stopStockHostThisRunStarted() {
  this.timeout(60_000);
  await stopStockHostProcesses();
});
