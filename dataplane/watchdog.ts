/**
 * The second line of defence against a stalled hand-off between threads (the crypto task rings,
 * the TUN and UDP reader rings): a queue that holds work and makes no progress for `stallMs` is a
 * stall. It is reported once per episode (with the queue's state: depths and sequence numbers,
 * never keys), counted, and handed to the owner's recovery (re-collect, re-kick, restart).
 *
 * The watch itself is sans-I/O: the owner calls `check(now)` from its own timer with what it
 * sees. Progress is any change of a number the owner picks (a sequence it consumed), so a queue
 * that moves slowly under load is never mistaken for a stalled one.
 */

/** How long a queue may hold work without progress before it counts as stalled. */
export const STALL_MS = 1000;
/** How often the owners look (a fraction of STALL_MS, so a stall is seen within ~1.25 s). */
export const WATCH_INTERVAL_MS = 250;

const looks = new Set<() => void>();
let lookTimer: ReturnType<typeof setInterval> | undefined;

/**
 * Runs `look` every WATCH_INTERVAL_MS until the returned function is called. Every watch of the
 * process shares one timer (the TUN queues' rings and the UDP ring: three timers of their own cost
 * an idle daemon 12 wake-ups a second, one costs 4). The timer does not keep the process alive.
 */
export function lookEveryInterval(look: () => void): () => void {
  looks.add(look);
  if (lookTimer === undefined) {
    lookTimer = setInterval(runLooks, WATCH_INTERVAL_MS);
    lookTimer.unref?.();
  }
  return () => {
    looks.delete(look);
    if (looks.size === 0 && lookTimer !== undefined) {
      clearInterval(lookTimer);
      lookTimer = undefined;
    }
  };
}

function runLooks(): void {
  for (const look of looks) look();
}

export interface StallReport {
  /** Which queue, e.g. "crypto worker 1" or "TUN ring". */
  queue: string;
  /** How long it has held work without progress. */
  stalledMs: number;
  /** Depths and sequence numbers (no keys, no packet bytes). */
  state: Record<string, number | string | boolean>;
}

export type StallHandler = (report: StallReport) => void;

/** What a watched component (crypto pool, TUN, UDP bind) shows the device: counted, and reported through onStall. */
export interface Liveness {
  /** Stalls detected so far. */
  readonly stalls: number;
  /** How long the stall in progress has lasted (0 = none). */
  readonly stalledMs: number;
  /** Where reports go (the device sets it to its logger). */
  onStall: StallHandler | undefined;
}

export class StallWatch {
  /** Stalls detected (episodes, not checks). */
  stalls = 0;
  private lastProgress = Number.NaN;
  private since = 0;
  private lastCheck = Number.NaN;
  private reported = false;
  /** Recoveries attempted in the current episode (the owner may escalate on the second). */
  attempts = 0;

  constructor(readonly queue: string, private readonly stallMs = STALL_MS) {}

  /** How long the reported stall in progress has lasted at `now` (0 = none). */
  stalledMs(now: number): number {
    return this.reported ? now - this.since : 0;
  }

  /**
   * One look: `pending` = the queue holds work, `progress` = a number that changes when work
   * moves. Returns true when the owner should recover now: on detection and then again every
   * `stallMs` while the stall lasts (see `attempts`). `report` is called once per episode.
   */
  check(now: number, pending: boolean, progress: number, state: () => StallReport['state'], report?: StallHandler): boolean {
    // A late look (this thread itself was busy or asleep) says nothing about the queue: the
    // wake-up it waits for may be queued behind this very timer. Start measuring again.
    const late = !(now - this.lastCheck <= this.stallMs / 2);
    this.lastCheck = now;
    if (!pending || progress !== this.lastProgress || (late && !this.reported)) {
      this.lastProgress = progress;
      this.since = now;
      this.reported = false;
      this.attempts = 0;
      return false;
    }
    const stalledMs = now - this.since;
    if (stalledMs < this.stallMs * (this.attempts + 1)) return false;
    if (!this.reported) {
      this.reported = true;
      this.stalls++;
      report?.({ queue: this.queue, stalledMs, state: state() });
    }
    this.attempts++;
    return true;
  }
}

/** The one-line form of a report for a log. */
export function formatStall(r: StallReport): string {
  const state = Object.entries(r.state).map(([k, v]) => `${k}=${v}`).join(' ');
  return `pipeline stall: ${r.queue} held work without progress for ${Math.round(r.stalledMs)} ms (${state}); recovering`;
}
