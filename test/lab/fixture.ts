/**
 * The lab as a mocha fixture. `useLab()` in a suite's `before` brings the lab
 * up and returns its description; processes this test run started are
 * stopped, by PID, in a root-level `after` hook, and a lab that was already
 * running is left alone. A lab that cannot start fails the suite loudly: lab
 * tests never skip.
 */
import { stopWhatThisProcessStarted } from "./lab";

export { LAB_SCRIPTS_DIR, useLab, type LabEnv } from "./lab";

// Root-level hook (this module is imported while mocha loads spec files).
after(async function stopWhatThisRunStarted() {
  this.timeout(60_000);
  await stopWhatThisProcessStarted();
});
