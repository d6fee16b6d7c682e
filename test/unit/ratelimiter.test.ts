import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ManualClock } from '../../dataplane/clock.ts';
import { parseIp } from '../../dataplane/net/ip.ts';
import { IDLE_EXPIRY_MS, MAX_ENTRIES, PACKET_BURST, PACKETS_PER_SECOND, RateLimiter } from '../../dataplane/noise/ratelimiter.ts';
import { prng } from '../helpers/prng.ts';

const COST_MS = 50; // 1/20 s, stated independently of the module

test('exported constants match the protocol', () => {
  assert.equal(PACKETS_PER_SECOND, 20);
  assert.equal(PACKET_BURST, 5);
  assert.equal(IDLE_EXPIRY_MS, 1000);
  assert.equal(MAX_ENTRIES, 65536);
});

/** How many of `attempts` back-to-back packets (same instant) are allowed. */
function burst(limiter: RateLimiter, address: Uint8Array, nowMs: number, attempts = 10): number {
  let allowed = 0;
  for (let i = 0; i < attempts; i++) if (limiter.allow(address, nowMs)) allowed++;
  return allowed;
}

describe('RateLimiter timeline on a manual clock', () => {
  test('5 allowed, 6th denied, one more after 1/20 s, refills to at most 5', () => {
    const clock = new ManualClock();
    const limiter = new RateLimiter();
    const source = parseIp('192.0.2.1');
    for (let i = 1; i <= 5; i++) assert.equal(limiter.allow(source, clock.now()), true, `packet ${i}`);
    assert.equal(limiter.allow(source, clock.now()), false, 'packet 6');
    clock.advance(COST_MS - 1);
    assert.equal(limiter.allow(source, clock.now()), false, 'not yet: 49 ms of credit');
    clock.advance(1);
    assert.equal(limiter.allow(source, clock.now()), true, 'one packet after 1/20 s');
    assert.equal(limiter.allow(source, clock.now()), false, 'and only one');
    clock.advance(2 * COST_MS);
    assert.equal(burst(limiter, source, clock.now()), 2, 'two packets after 2/20 s');
    clock.advance(10_000);
    assert.equal(burst(limiter, source, clock.now()), 5, 'refills to the burst size, no more');
  });

  test('denied packets do not spend credit', () => {
    const clock = new ManualClock();
    const limiter = new RateLimiter();
    const source = parseIp('192.0.2.1');
    assert.equal(burst(limiter, source, clock.now()), 5);
    for (let i = 0; i < 4; i++) {
      clock.advance(10);
      assert.equal(limiter.allow(source, clock.now()), false, `after ${10 * (i + 1)} ms`);
    }
    clock.advance(10);
    assert.equal(limiter.allow(source, clock.now()), true, 'credit accrued across denied attempts');
  });

  test('a steady flood gets 20 packets per second plus the initial burst', () => {
    const limiter = new RateLimiter();
    const source = parseIp('198.51.100.7');
    let allowed = 0;
    const durationMs = 10_000;
    for (let t = 0; t < durationMs; t++) if (limiter.allow(source, t)) allowed++;
    // Credit available: the initial full bucket plus 1 ms per ms; each packet costs 50 ms.
    const ceiling = (PACKET_BURST * COST_MS + (durationMs - 1)) / COST_MS;
    assert.ok(allowed <= ceiling && allowed > ceiling - 1, `allowed ${allowed}, expected just under ${ceiling}`);
  });

  test('fractional times and a clock that steps backwards', () => {
    const limiter = new RateLimiter();
    const source = parseIp('192.0.2.1');
    assert.equal(burst(limiter, source, 1000.25), 5);
    assert.equal(limiter.allow(source, 500), false, 'going back in time grants nothing');
    assert.equal(limiter.allow(source, 549.9), false);
    assert.equal(limiter.allow(source, 550.1), true, 'credit counts from the last packet seen');
  });
});

describe('RateLimiter keys', () => {
  test('separate buckets per IPv4 address', () => {
    const limiter = new RateLimiter();
    const a = parseIp('10.0.0.1');
    const b = parseIp('10.0.0.2');
    assert.equal(burst(limiter, a, 0), 5);
    assert.equal(burst(limiter, b, 0), 5);
    assert.equal(limiter.size, 2);
  });

  test('IPv6 addresses in the same /64 share a bucket', () => {
    const limiter = new RateLimiter();
    assert.equal(burst(limiter, parseIp('2001:db8:1:2::1'), 0, 3), 3);
    assert.equal(burst(limiter, parseIp('2001:db8:1:2:ffff:ffff:ffff:ffff'), 0), 2);
    assert.equal(limiter.allow(parseIp('2001:db8:1:2:8000::'), 0), false);
    assert.equal(limiter.size, 1);
  });

  test('IPv6 addresses in different /64s do not', () => {
    const limiter = new RateLimiter();
    assert.equal(burst(limiter, parseIp('2001:db8:1:2::1'), 0), 5);
    assert.equal(burst(limiter, parseIp('2001:db8:1:3::1'), 0), 5, 'last bit of the /64 differs');
    assert.equal(burst(limiter, parseIp('2001:db8:1:2::1'), 0), 0);
    assert.equal(burst(limiter, parseIp('3001:db8:1:2::1'), 0), 5, 'first bit differs');
    assert.equal(limiter.size, 3);
  });

  test('IPv4-mapped IPv6 addresses count as their IPv4 address', () => {
    const limiter = new RateLimiter();
    assert.equal(burst(limiter, parseIp('::ffff:192.0.2.1'), 0, 3), 3);
    assert.equal(burst(limiter, parseIp('192.0.2.1'), 0), 2, 'same source as the mapped form');
    assert.equal(burst(limiter, parseIp('::ffff:192.0.2.2'), 0), 5, 'not grouped by /64');
    assert.equal(limiter.size, 2);
  });

  test('an IPv4 address and an IPv6 /64 with the same leading bytes are different sources', () => {
    const limiter = new RateLimiter();
    assert.equal(burst(limiter, parseIp('1.2.3.4'), 0), 5);
    assert.equal(burst(limiter, parseIp('102:304::'), 0), 5);
    assert.equal(burst(limiter, parseIp('::'), 0), 5);
    assert.equal(burst(limiter, parseIp('0.0.0.0'), 0), 5);
    assert.equal(limiter.size, 4);
  });

  test('the caller may reuse its address buffer', () => {
    const limiter = new RateLimiter();
    const buffer = parseIp('10.0.0.1');
    assert.equal(burst(limiter, buffer, 0), 5);
    buffer[3] = 2;
    assert.equal(burst(limiter, buffer, 0), 5);
  });

  test('bad addresses are rejected with a descriptive error', () => {
    const limiter = new RateLimiter();
    assert.throws(() => limiter.allow(new Uint8Array(5), 0), /4 or 16 bytes, got 5/);
    assert.throws(() => limiter.allow(new Uint8Array(0), 0), /got 0/);
    assert.throws(() => new RateLimiter({ maxEntries: 0 }), /maxEntries must be an integer/);
    assert.throws(() => new RateLimiter({ maxEntries: 1.5 }), /got 1\.5/);
    assert.equal(limiter.size, 0);
  });
});

describe('RateLimiter garbage collection and cap', () => {
  test('entries idle for more than 1 s are collected', () => {
    const limiter = new RateLimiter();
    const a = parseIp('10.0.0.1');
    const b = parseIp('10.0.0.2');
    assert.equal(burst(limiter, a, 0), 5);
    assert.equal(burst(limiter, b, 600), 5);
    assert.equal(limiter.collectGarbage(1000), 0, 'a was idle exactly 1 s: kept');
    assert.equal(limiter.size, 2);
    assert.equal(limiter.collectGarbage(1000.5), 1, 'a is now idle longer than 1 s');
    assert.equal(limiter.size, 1);
    assert.equal(limiter.allow(b, 1000.5), true, 'b kept its bucket (400 ms of credit)');
    assert.equal(limiter.collectGarbage(3000), 1);
    assert.equal(limiter.size, 0);
    assert.equal(limiter.collectGarbage(3000), 0);
    // A collected source starts over with a full bucket, as it would have had anyway.
    assert.equal(burst(limiter, a, 3000), 5);
  });

  test('a denied packet still counts as activity', () => {
    const limiter = new RateLimiter();
    const a = parseIp('10.0.0.1');
    assert.equal(burst(limiter, a, 0), 5);
    assert.equal(limiter.allow(a, 40), false);
    assert.equal(limiter.collectGarbage(1040), 0, 'idle exactly 1 s since the denied packet');
    assert.equal(limiter.size, 1);
    assert.equal(limiter.collectGarbage(1041), 1);
  });

  test('the table is capped: new sources are refused when full, known ones still served', () => {
    const limiter = new RateLimiter({ maxEntries: 3 });
    for (let i = 1; i <= 3; i++) assert.equal(limiter.allow(parseIp(`10.0.0.${i}`), 0), true);
    assert.equal(limiter.allow(parseIp('10.0.0.4'), 0), false, 'new source while full');
    assert.equal(limiter.allow(parseIp('fd00::1'), 0), false, 'new IPv6 source while full');
    assert.equal(limiter.size, 3);
    assert.equal(burst(limiter, parseIp('10.0.0.2'), 0), 4, 'a known source keeps its bucket');
    assert.equal(limiter.allow(parseIp('10.0.0.1'), 800), true);
    assert.equal(limiter.collectGarbage(1500), 2);
    assert.equal(limiter.allow(parseIp('10.0.0.4'), 1500), true, 'room again after collection');
    assert.equal(limiter.size, 2);
  });

  test('the default cap is MAX_ENTRIES sources', () => {
    const limiter = new RateLimiter();
    const address = new Uint8Array(4);
    for (let i = 0; i < MAX_ENTRIES; i++) {
      address[0] = 10; address[1] = i >> 16; address[2] = (i >> 8) & 0xff; address[3] = i & 0xff;
      if (!limiter.allow(address, 0)) assert.fail(`source ${i} refused below the cap`);
    }
    assert.equal(limiter.size, MAX_ENTRIES);
    assert.equal(limiter.allow(parseIp('11.0.0.0'), 0), false);
    assert.equal(limiter.size, MAX_ENTRIES);
    assert.equal(limiter.collectGarbage(1001), MAX_ENTRIES);
    assert.equal(limiter.allow(parseIp('11.0.0.0'), 1001), true);
  });

  test('buckets survive table growth and partial collection', () => {
    const limiter = new RateLimiter({ hashSeed: 12345 });
    const addressOf = (i: number) => (i % 2 === 0
      ? Uint8Array.of(172, 16 + (i >> 16), (i >> 8) & 0xff, i & 0xff)
      : parseIp(`2001:db8:${(i >> 16).toString(16)}:${(i & 0xffff).toString(16)}::1`));
    const n = 5000;
    // Even sources exhaust their bucket at t = 0, odd ones spend one packet at t = 600.
    for (let i = 0; i < n; i += 2) assert.equal(burst(limiter, addressOf(i), 0), 5);
    for (let i = 1; i < n; i += 2) assert.equal(limiter.allow(addressOf(i), 600), true);
    assert.equal(limiter.size, n);
    for (let i = 0; i < n; i += 2) assert.equal(limiter.allow(addressOf(i), 0), false, `source ${i} forgot its state`);
    assert.equal(limiter.collectGarbage(1500), n / 2, 'the even sources went idle');
    for (let i = 1; i < n; i += 2) assert.equal(burst(limiter, addressOf(i), 1500), 5, `source ${i} after collection`);
    assert.equal(limiter.size, n / 2);
    limiter.clear();
    assert.equal(limiter.size, 0);
  });
});

// ---- randomized differential test against a Map-based model ----


/** The same rules with string keys and a Map, written as plainly as possible. */
class NaiveLimiter {
  readonly buckets = new Map<string, { credit: number; last: number }>();
  constructor(private readonly cap: number) {}
  private keyOf(a: Uint8Array): string {
    const mapped = a.length === 16 && a.subarray(0, 10).every((x) => x === 0) && a[10] === 0xff && a[11] === 0xff;
    if (a.length === 4 || mapped) return `v4 ${Array.from(a.subarray(a.length - 4)).join('.')}`;
    return `v6 ${Array.from(a.subarray(0, 8)).join(':')}`;
  }
  allow(a: Uint8Array, now: number): boolean {
    const key = this.keyOf(a);
    const bucket = this.buckets.get(key);
    if (bucket === undefined) {
      if (this.buckets.size >= this.cap) return false;
      this.buckets.set(key, { credit: 5 * COST_MS - COST_MS, last: now });
      return true;
    }
    bucket.credit = Math.min(5 * COST_MS, bucket.credit + Math.max(0, now - bucket.last));
    bucket.last = now;
    if (bucket.credit < COST_MS) return false;
    bucket.credit -= COST_MS;
    return true;
  }
  collect(now: number): number {
    let removed = 0;
    for (const [key, bucket] of this.buckets) if (now - bucket.last > 1000) { this.buckets.delete(key); removed++; }
    return removed;
  }
}

function runDifferential(seed: number): void {
  const random = prng(seed);
  const int = (n: number) => Math.floor(random() * n);
  const cap = 50 + int(400);
  const limiter = new RateLimiter({ maxEntries: cap, hashSeed: int(2 ** 32) });
  const naive = new NaiveLimiter(cap);
  // A pool of sources in which /64 sharing and IPv4-mapped aliases occur often.
  const pool: Uint8Array[] = [];
  for (let i = 0; i < 600; i++) {
    const kind = int(3);
    if (kind === 0) pool.push(Uint8Array.of(10, 0, int(4), int(256)));
    else if (kind === 1) pool.push(parseIp(`fd00:0:0:${int(64).toString(16)}::${int(4).toString(16)}`));
    else pool.push(parseIp(`::ffff:10.0.${int(4)}.${int(256)}`));
  }
  let now = int(1e6);
  for (let step = 0; step < 40_000; step++) {
    const r = random();
    if (r < 0.001) {
      now += int(1500);
      assert.equal(limiter.collectGarbage(now), naive.collect(now), `step ${step}: collectGarbage(${now})`);
    } else {
      if (r < 0.3) now += random() * 30;
      const address = pool[int(pool.length)];
      assert.equal(limiter.allow(address, now), naive.allow(address, now), `step ${step}: allow(${address.join('.')}, ${now})`);
    }
    assert.equal(limiter.size, naive.buckets.size, `step ${step}: size`);
  }
}

describe('RateLimiter randomized differential test', () => {
  test('agrees with a Map-based model', () => {
    const envSeed = process.env.RATELIMITER_SEED;
    const baseSeed = envSeed !== undefined ? Number(envSeed) : (Math.random() * 2 ** 32) >>> 0;
    for (let round = 0; round < 5; round++) {
      const seed = (baseSeed + round) >>> 0;
      try {
        runDifferential(seed);
      } catch (err) {
        const message = `rate limiter differential test failed with seed ${seed} (rerun with RATELIMITER_SEED=${seed})`;
        console.error(message);
        throw new Error(`${message}: ${(err as Error).message}`, { cause: err });
      }
    }
  });
});
