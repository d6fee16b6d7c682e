/**
 * Sliding replay window for transport-data counters (the RFC 6479 bitmap ring).
 *
 * The ring holds 8192 bits: 256 words of 32 bits. Bit `c mod 8192` remembers whether counter c was
 * accepted. When the highest counter seen moves forward, the words it moves into are zeroed first,
 * so a bit never carries over from a counter 8192 lower. Words are 32-bit because JS bit operations
 * are 32-bit: Int32Array words keep the hot path in plain integer arithmetic (BigUint64 words would
 * box BigInts and be far slower).
 *
 * Acceptance rule, exactly as in wireguard-go (128 blocks of 64 bits, usable window 127 × 64 = 8128):
 * a counter is accepted once if it is below the limit and either above every counter seen so far, or
 * at most WINDOW_SIZE below the highest one. With 32-bit words the ring could cover 255 × 32 = 8160
 * counters back; 8128 is kept so both implementations accept and reject the same counters.
 *
 * Shared between threads: the window lives in a SharedArrayBuffer (a keypair's slot of the keypair
 * table, keypair-table.ts), so the main thread and a thread that receives for the same keypair
 * check counters against one window. A check runs under a tiny spin lock (one compare-exchange to
 * take it, one store to drop it; the critical section is a few word operations and never throws),
 * so a counter is accepted exactly once whichever thread sees it. Not constant-time; call `check`
 * only after the packet decrypted successfully (an unauthenticated counter must never move the
 * window).
 */

/**
 * Default limit for `check`: counters at or above it are rejected.
 *
 * The protocol's limit is 2^64 − 2^13 − 1 (REJECT_AFTER_MESSAGES). It is unreachable in practice: a
 * key is dropped after 180 s (REJECT_AFTER_TIME), and no link sends 2^53 packets in 180 s. Counters here
 * are JS numbers, which hold integers exactly only below 2^53, so anything at or above
 * Number.MAX_SAFE_INTEGER (2^53 − 1) is rejected; a 64-bit counter decoded into a number that large
 * has lost precision and could alias a genuine counter.
 */
export const REJECT_AFTER_MESSAGES_SAFE = Number.MAX_SAFE_INTEGER;

const WORD_BITS = 32;
const RING_WORDS = 256;
const RING_WORD_MASK = RING_WORDS - 1;
const BIT_MASK = WORD_BITS - 1;
/** How far below the highest accepted counter a late packet may still be accepted. */
export const REPLAY_WINDOW_SIZE = 8128;

/** Bytes of one window in shared memory: the ring, the highest counter (a float64), the lock word, padding. */
export const REPLAY_WINDOW_BYTES = RING_WORDS * 4 + 16;
const HIGHEST_AT = RING_WORDS * 4;
const LOCK_AT = HIGHEST_AT + 8;

export class ReplayWindow {
  private readonly ring: Int32Array;
  /** [0]: the highest counter accepted so far (0 when none: counter 0 then lands in the window as usual). */
  private readonly highest: Float64Array;
  /** [0]: 1 while a thread checks. */
  private readonly lock: Int32Array;

  /**
   * A window in `buffer` at `byteOffset` (a multiple of 8; REPLAY_WINDOW_BYTES long, all zeros for
   * a fresh window), or in memory of its own.
   */
  constructor(buffer: SharedArrayBuffer = new SharedArrayBuffer(REPLAY_WINDOW_BYTES), byteOffset = 0) {
    if (!Number.isInteger(byteOffset) || byteOffset < 0 || byteOffset % 8 !== 0 || byteOffset + REPLAY_WINDOW_BYTES > buffer.byteLength) {
      throw new RangeError(`replay window: ${REPLAY_WINDOW_BYTES} bytes at offset ${byteOffset} (a multiple of 8) do not fit ${buffer.byteLength} bytes`);
    }
    this.ring = new Int32Array(buffer, byteOffset, RING_WORDS);
    this.highest = new Float64Array(buffer, byteOffset + HIGHEST_AT, 1);
    this.lock = new Int32Array(buffer, byteOffset + LOCK_AT, 1);
  }

  /** Forgets every counter (a new session key starts a new counter space). */
  reset(): void {
    this.acquire();
    this.ring.fill(0);
    this.highest[0] = 0;
    Atomics.store(this.lock, 0, 0);
  }

  private acquire(): void {
    while (Atomics.compareExchange(this.lock, 0, 0, 1) !== 0) {
      // Another thread holds it for a few word operations: spin.
    }
  }

  /**
   * True exactly once for each acceptable counter; false for replays, counters too far behind the
   * window, counters at or above `limit` (or REJECT_AFTER_MESSAGES_SAFE), and anything that is not a
   * non-negative safe integer. Accepting a counter records it.
   */
  check(counter: number, limit: number = REJECT_AFTER_MESSAGES_SAFE): boolean {
    if (!Number.isSafeInteger(counter) || counter < 0 || counter >= limit || counter >= REJECT_AFTER_MESSAGES_SAFE) {
      return false;
    }
    this.acquire();
    const accepted = this.record(counter);
    Atomics.store(this.lock, 0, 0);
    return accepted;
  }

  /** The check itself, under the lock. */
  private record(counter: number): boolean {
    // counter / 32 is exact for safe integers; `& mask` then takes the low bits of that integer.
    const word = Math.floor(counter / WORD_BITS);
    const highest = this.highest[0];
    if (counter > highest) {
      const highestWord = Math.floor(highest / WORD_BITS);
      // Zero the words between the old and new highest word; after a jump of a whole ring, all of it.
      const advance = Math.min(word - highestWord, RING_WORDS);
      for (let i = 1; i <= advance; i++) this.ring[(highestWord + i) & RING_WORD_MASK] = 0;
      this.highest[0] = counter;
    } else if (highest - counter > REPLAY_WINDOW_SIZE) {
      return false;
    }
    const slot = word & RING_WORD_MASK;
    const bit = 1 << (counter & BIT_MASK);
    const seen = this.ring[slot];
    if ((seen & bit) !== 0) return false;
    this.ring[slot] = seen | bit;
    return true;
  }
}
