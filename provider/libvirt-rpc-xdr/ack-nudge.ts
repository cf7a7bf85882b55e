/**
 * Keeps a pipelined link from waiting on a delayed TCP acknowledgement.
 *
 * Over SSH the daemon's replies reach us through sshd, which sets
 * TCP_NODELAY only for interactive sessions: on a socket forward, Nagle's
 * rule makes it hold a small segment while an earlier one is still
 * unacknowledged. Linux acknowledges at once only when it has data to send;
 * a client that is just waiting acknowledges after up to 40 ms. So whenever
 * sshd sends two segments in a row — the replies of a pipelined burst, or
 * an SSH-level message (ssh2's host-key proof) just before the first reply —
 * the second waits 40 ms for an ACK that nothing provokes.
 *
 * The nudge provokes it: something small is written when
 * - data arrived, replies are still owed, and nothing was written since
 *   (checked after the turn's promise jobs: a reply that prompts the next
 *   call carries the ACK itself), or
 * - replies are owed and the link has been silent since our last write for
 *   1, 2, 4, 8, 16, then 32 ms (data we cannot see, such as SSH messages, may
 *   be waiting for its ACK); after that the delayed ACK has gone anyway.
 */
const FIRST_SILENCE_MS = 1;
/** Past Linux's 40 ms delayed-ACK ceiling a nudge changes nothing. */
const LAST_SILENCE_MS = 32;

export class AcknowledgementNudge {
  private wroteSinceData = false;
  private afterData: NodeJS.Immediate | undefined;
  private silence: NodeJS.Timeout | undefined;
  private silenceMs = FIRST_SILENCE_MS;
  private nudging = false;
  private stopped = false;

  constructor(
    /** Writes the no-op packet. */
    private readonly send: () => void,
    /** Whether replies are still owed to somebody. */
    private readonly repliesOwed: () => boolean,
  ) {}

  /** Call on every chunk of input. */
  received(): void {
    if (this.stopped) return;
    this.wroteSinceData = false;
    this.silenceMs = FIRST_SILENCE_MS;
    this.clearSilence();
    this.afterData ??= setImmediate(() => {
      this.afterData = undefined;
      if (!this.wroteSinceData && this.repliesOwed()) this.nudge();
    });
  }

  /** Call on every write to the transport. */
  wrote(): void {
    if (this.stopped) return;
    this.wroteSinceData = true;
    if (this.nudging) this.silenceMs *= 2;
    else this.silenceMs = FIRST_SILENCE_MS;
    this.clearSilence();
    if (this.silenceMs > LAST_SILENCE_MS || !this.repliesOwed()) return;
    this.silence = setTimeout(() => {
      this.silence = undefined;
      if (this.repliesOwed()) this.nudge();
    }, this.silenceMs);
    this.silence.unref();
  }

  stop(): void {
    this.stopped = true;
    this.clearSilence();
    if (this.afterData) clearImmediate(this.afterData);
    this.afterData = undefined;
  }

  private nudge(): void {
    this.nudging = true;
    try {
      this.send();
    } finally {
      this.nudging = false;
    }
  }

  private clearSilence(): void {
    if (this.silence) clearTimeout(this.silence);
    this.silence = undefined;
  }
}
