/**
 * Time as the protocol core sees it. The core never reads the system clock itself: every use of
 * time goes through a Clock, so tests can move time forward by hand (see ManualClock).
 */
export interface Clock {
  /** Monotonic milliseconds (arbitrary origin); drives every timer. */
  now(): number;
  /** Wall-clock milliseconds since the Unix epoch; used for TAI64N timestamps and `last_handshake_time`. */
  wallNow(): number;
}

export const systemClock: Clock = {
  now: () => performance.now(),
  wallNow: () => Date.now(),
};

/** A clock that moves only when told to; wall time moves with it. */
export class ManualClock implements Clock {
  private monotonic: number;
  private wall: number;
  constructor(startMs = 1_000_000, wallStartMs = Date.UTC(2026, 0, 1)) {
    this.monotonic = startMs;
    this.wall = wallStartMs;
  }
  now(): number { return this.monotonic; }
  wallNow(): number { return this.wall; }
  advance(ms: number): void {
    if (!(ms >= 0)) throw new RangeError(`ManualClock.advance: ms must be >= 0, got ${ms}`);
    this.monotonic += ms;
    this.wall += ms;
  }
}
