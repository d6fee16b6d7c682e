/**
 * Per-source token bucket for handshake messages, consulted only while the device is under load
 * (and, with other rates, for the cookie replies of an overloaded device: core.ts).
 *
 * Each source may send PACKETS_PER_SECOND handshake messages per second with bursts of up to
 * PACKET_BURST (or the rates given). A bucket holds "time credit" in milliseconds: it refills at
 * 1 ms per ms elapsed, is capped at burst × the cost of a packet (1000 / rate ms), and each
 * allowed packet spends that cost.
 *
 * Sources are keyed by address: the full IPv4 address, and for IPv6 the /64 it lies in, because one
 * host usually controls a whole /64 and could otherwise get a fresh bucket per address (the Linux
 * kernel groups the same way). IPv4-mapped IPv6 addresses (::ffff:a.b.c.d, seen on dual-stack
 * sockets) are keyed as the IPv4 address; grouping them by /64 would put all of IPv4 in one bucket.
 *
 * The buckets live in an open-addressing hash table of typed arrays, so `allow` allocates nothing
 * (this runs while someone floods us). The table's hash is seeded randomly per instance so that
 * nobody can choose addresses that all collide.
 */
import { randomBytes } from 'node:crypto';

export const PACKETS_PER_SECOND = 20;
export const PACKET_BURST = 5;
/** Entries unused for longer than this are dropped by collectGarbage (a full bucket holds ≤ 250 ms). */
export const IDLE_EXPIRY_MS = 1000;
/**
 * Upper bound on tracked sources. A flood from spoofed addresses would otherwise grow the table
 * without limit. When full, new sources are refused rather than evicting known ones: evicting would
 * hand the attacker a way to reset legitimate sources' buckets, while refusing only delays new
 * sources until collectGarbage frees idle entries (within about a second).
 */
export const MAX_ENTRIES = 65536;

const EMPTY = 0;
const FAMILY_V4 = 4;
const FAMILY_V6 = 6;
const INITIAL_SLOTS = 64;

export interface RateLimiterOptions {
  /** Hard cap on tracked sources (default MAX_ENTRIES). */
  maxEntries?: number;
  /** Packets per second each source may send (default PACKETS_PER_SECOND). */
  packetsPerSecond?: number;
  /** Burst each source may send at once (default PACKET_BURST). */
  burst?: number;
  /**
   * What `allow` answers for a new source while the table is full: false (default: refuse, the
   * handshake limiter's choice, see MAX_ENTRIES) or true (admit without tracking it, for a limiter
   * that only sheds optional work and must never lock a new source out).
   */
  admitWhenFull?: boolean;
  /** Fixed hash seed, for reproducible tests; random by default. */
  hashSeed?: number;
}

/** murmur3's 32-bit finalizer: spreads every input bit over the whole word. */
function mix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return h ^ (h >>> 16);
}

function isIdle(lastMs: number, nowMs: number): boolean {
  return nowMs - lastMs > IDLE_EXPIRY_MS;
}

function readWord(bytes: Uint8Array, at: number): number {
  return (bytes[at] << 24) | (bytes[at + 1] << 16) | (bytes[at + 2] << 8) | bytes[at + 3];
}

/** Slots are always a power of two, at most half full, so probe sequences stay short. */
function slotsFor(entries: number): number {
  let slots = INITIAL_SLOTS;
  while (slots < entries * 2) slots *= 2;
  return slots;
}

/** One generation of the table: parallel arrays indexed by slot. */
class BucketTable {
  readonly mask: number;
  /** EMPTY, FAMILY_V4 or FAMILY_V6. */
  readonly family: Uint8Array;
  /** IPv4: the address and 0. IPv6: the two words of the /64. */
  readonly keyHigh: Int32Array;
  readonly keyLow: Int32Array;
  readonly creditMs: Float64Array;
  readonly lastMs: Float64Array;

  constructor(slots: number) {
    this.mask = slots - 1;
    this.family = new Uint8Array(slots);
    this.keyHigh = new Int32Array(slots);
    this.keyLow = new Int32Array(slots);
    this.creditMs = new Float64Array(slots);
    this.lastMs = new Float64Array(slots);
  }

  get slots(): number {
    return this.mask + 1;
  }
}

export class RateLimiter {
  private table = new BucketTable(INITIAL_SLOTS);
  private entries = 0;
  private readonly maxEntries: number;
  private readonly seed: number;
  /** Credit one packet costs, and the most a bucket holds (the burst). */
  private readonly packetCostMs: number;
  private readonly maxCreditMs: number;
  private readonly admitWhenFull: boolean;

  constructor(options: RateLimiterOptions = {}) {
    const maxEntries = options.maxEntries ?? MAX_ENTRIES;
    if (!Number.isInteger(maxEntries) || maxEntries < 1 || maxEntries > 1 << 24) {
      throw new RangeError(`RateLimiter: maxEntries must be an integer 1..${1 << 24}, got ${maxEntries}`);
    }
    this.maxEntries = maxEntries;
    const perSecond = options.packetsPerSecond ?? PACKETS_PER_SECOND;
    const burst = options.burst ?? PACKET_BURST;
    if (!(perSecond > 0) || !Number.isFinite(perSecond)) throw new RangeError(`RateLimiter: packetsPerSecond must be positive, got ${perSecond}`);
    if (!Number.isInteger(burst) || burst < 1) throw new RangeError(`RateLimiter: burst must be a positive integer, got ${burst}`);
    this.packetCostMs = 1000 / perSecond;
    this.maxCreditMs = this.packetCostMs * burst;
    this.admitWhenFull = options.admitWhenFull ?? false;
    this.seed = options.hashSeed !== undefined ? options.hashSeed | 0 : randomBytes(4).readInt32LE(0);
  }

  /** Number of sources currently tracked. */
  get size(): number {
    return this.entries;
  }

  /**
   * Whether a handshake message from `address` (4 or 16 bytes) may be processed at `nowMs`
   * (monotonic milliseconds). Spends one packet's credit when it returns true.
   */
  allow(address: Uint8Array, nowMs: number): boolean {
    let family: number, high: number, low: number;
    if (address.length === 4) {
      family = FAMILY_V4;
      high = readWord(address, 0);
      low = 0;
    } else if (address.length === 16) {
      if (readWord(address, 0) === 0 && readWord(address, 4) === 0 && readWord(address, 8) === 0xffff) {
        family = FAMILY_V4;
        high = readWord(address, 12);
        low = 0;
      } else {
        family = FAMILY_V6;
        high = readWord(address, 0);
        low = readWord(address, 4);
      }
    } else {
      throw new RangeError(`RateLimiter.allow: an IP address has 4 or 16 bytes, got ${address.length}`);
    }

    let table = this.table;
    let slot = this.findSlot(table, family, high, low);
    if (table.family[slot] !== EMPTY) {
      // A known source: refill for the time since its last packet, then try to spend.
      const elapsed = nowMs - table.lastMs[slot];
      let credit = table.creditMs[slot] + (elapsed > 0 ? elapsed : 0);
      if (credit > this.maxCreditMs) credit = this.maxCreditMs;
      table.lastMs[slot] = nowMs;
      if (credit < this.packetCostMs) {
        table.creditMs[slot] = credit;
        return false;
      }
      table.creditMs[slot] = credit - this.packetCostMs;
      return true;
    }

    if (this.entries >= this.maxEntries) return this.admitWhenFull;
    if ((this.entries + 1) * 2 > table.slots) {
      this.table = table = this.rehash(slotsFor(this.entries + 1), undefined);
      slot = this.findSlot(table, family, high, low);
    }
    // A new source starts with a full bucket and spends one packet of it right away.
    table.family[slot] = family;
    table.keyHigh[slot] = high;
    table.keyLow[slot] = low;
    table.creditMs[slot] = this.maxCreditMs - this.packetCostMs;
    table.lastMs[slot] = nowMs;
    this.entries++;
    return true;
  }

  /**
   * Drops sources idle for more than IDLE_EXPIRY_MS (their buckets would be full again, so
   * forgetting them changes no answer). Meant to run about once a second; returns how many went.
   */
  collectGarbage(nowMs: number): number {
    if (this.entries === 0) return 0;
    const before = this.entries;
    let live = 0;
    const old = this.table;
    for (let slot = 0; slot <= old.mask; slot++) {
      if (old.family[slot] !== EMPTY && !isIdle(old.lastMs[slot], nowMs)) live++;
    }
    if (live === before) return 0;
    // Rebuilding keeps probe chains intact without tombstones, and lets the table shrink after a flood.
    this.table = this.rehash(slotsFor(live), nowMs);
    return before - this.entries;
  }

  /** Forgets every source. */
  clear(): void {
    this.table = new BucketTable(INITIAL_SLOTS);
    this.entries = 0;
  }

  /** Linear probing: the slot holding the key, or the empty slot where it would go. */
  private findSlot(table: BucketTable, family: number, high: number, low: number): number {
    const mask = table.mask;
    // The family is left out of the hash: an IPv4 key and an IPv6 /64 with equal words then share a
    // probe chain (one extra probe, rare) and are told apart by the family check below.
    let slot = mix(mix(this.seed ^ high) ^ low) & mask;
    for (;;) {
      const f = table.family[slot];
      if (f === EMPTY || (f === family && table.keyHigh[slot] === high && table.keyLow[slot] === low)) return slot;
      slot = (slot + 1) & mask;
    }
  }

  /** Copies the entries (only those not idle at `nowMs`, if given) into a new table of `slots` slots. */
  private rehash(slots: number, nowMs: number | undefined): BucketTable {
    const old = this.table;
    const fresh = new BucketTable(slots);
    let count = 0;
    for (let i = 0; i <= old.mask; i++) {
      const family = old.family[i];
      if (family === EMPTY || (nowMs !== undefined && isIdle(old.lastMs[i], nowMs))) continue;
      const slot = this.findSlot(fresh, family, old.keyHigh[i], old.keyLow[i]);
      fresh.family[slot] = family;
      fresh.keyHigh[slot] = old.keyHigh[i];
      fresh.keyLow[slot] = old.keyLow[i];
      fresh.creditMs[slot] = old.creditMs[i];
      fresh.lastMs[slot] = old.lastMs[i];
      count++;
    }
    this.entries = count;
    return fresh;
  }
}
