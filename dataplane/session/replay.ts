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
 * Not thread-safe and not constant-time; call `check` only after the packet decrypted successfully,
 * in the per-peer in-order receive stage (an unauthenticated counter must never move the window).
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

export class ReplayWindow {
  private readonly ring = new Int32Array(RING_WORDS);
  /** The highest counter accepted so far (0 when none: counter 0 then lands in the window as usual). */
  private highest = 0;

  /** Forgets every counter (a new session key starts a new counter space). */
  reset(): void {
    this.ring.fill(0);
    this.highest = 0;
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
    // counter / 32 is exact for safe integers; `& mask` then takes the low bits of that integer.
    const word = Math.floor(counter / WORD_BITS);
    if (counter > this.highest) {
      const highestWord = Math.floor(this.highest / WORD_BITS);
      // Zero the words between the old and new highest word; after a jump of a whole ring, all of it.
      const advance = Math.min(word - highestWord, RING_WORDS);
      for (let i = 1; i <= advance; i++) this.ring[(highestWord + i) & RING_WORD_MASK] = 0;
      this.highest = counter;
    } else if (this.highest - counter > REPLAY_WINDOW_SIZE) {
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
