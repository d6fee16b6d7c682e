/**
 * The device's timer runs at the core's next deadline, at most core.longestTickMs() apart
 * (device.ts nextTickDelay), where it used to run every 100 ms. It must never sleep past a
 * deadline, also one armed while it sleeps.
 *
 * The model: two cores over an in-memory wire, each with the timer schedule the device computes.
 * Over random interleavings of sends both ways, deliveries in and out of order, lost datagrams,
 * persistent keepalives switched on and off and time passing, under the production timings and
 * random shortened ones (as ROAMGUARD_TEST_TIMINGS sets them), after every event no deadline of
 * either core is earlier than the run already scheduled, and every run happens at its time.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { PRODUCTION_TIMINGS, THREAD_KEYPAIR_MARGIN_MS, type Timings } from '../../dataplane/constants.ts';
import { nextTickDelay } from '../../dataplane/device/device.ts';
import { A_INNER, B_INNER, makeCorePair, type CorePair } from '../helpers/core-pair.ts';
import { ipv4Packet } from '../helpers/ip-packet.ts';
import { prng } from '../helpers/prng.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

/** Random shortened timings, in the proportions of the real ones (or the real ones). */
function randomTimings(random: () => number): Partial<Timings> | undefined {
  if (random() < 0.3) return undefined;
  const rekeyTimeout = 50 + Math.floor(random() * 1000);
  const rejectAfterTime = THREAD_KEYPAIR_MARGIN_MS + 500 + Math.floor(random() * 5000);
  return {
    rekeyTimeout,
    rekeyTimeoutJitterMax: Math.floor(random() * rekeyTimeout / 3),
    keepaliveTimeout: 100 + Math.floor(random() * 3000),
    rejectAfterTime,
    rekeyAfterTime: Math.floor(rejectAfterTime * (0.3 + random() * 0.6)),
    rekeyAttemptTime: rekeyTimeout * (2 + Math.floor(random() * 6)),
  };
}

describe('the device timer at the next deadline', () => {
  test('sleeps a second at most with the production timings, and less than any timer an event arms', () => {
    const pair = makeCorePair(crypto);
    assert.equal(pair.a.core.longestTickMs(), 1000);
    const short = makeCorePair(crypto, { timings: { rekeyTimeout: 60, rekeyTimeoutJitterMax: 1 } });
    assert.equal(short.a.core.longestTickMs(), 60);
    const late = makeCorePair(crypto, { timings: { rejectAfterTime: 1300 } });
    assert.equal(late.a.core.longestTickMs(), 300, 'a new keypair is taken back from the threads 300 ms after it was made');
  });

  test("counts a keypair's hand-back to the threads as a deadline", () => {
    const pair = makeCorePair(crypto);
    pair.a.core.sendPacket(ipv4Packet(A_INNER, B_INNER));
    pair.pump();
    const created = pair.a.peer.keypairs.current!.created;
    const handBack = created + PRODUCTION_TIMINGS.rejectAfterTime - THREAD_KEYPAIR_MARGIN_MS;
    // Its timers (a keepalive, a new handshake) come first; with them off, the hand-back is next.
    pair.a.peer.timers.stopAll();
    assert.equal(pair.a.core.nextDeadline(created), handBack);
    assert.equal(pair.a.core.nextDeadline(handBack), Infinity, 'done by the run at that time');
  });

  test('model: over random interleavings no deadline is ever earlier than the scheduled run', () => {
    for (let seed = 1; seed <= 60; seed++) {
      const random = prng(seed);
      const timings = randomTimings(random);
      const pair = makeCorePair(crypto, { timings });
      const sides = ['a', 'b'] as const;
      const scheduled = { a: 0, b: 0 };
      const schedule = (side: 'a' | 'b') => {
        const now = pair.clock.now();
        scheduled[side] = now + nextTickDelay(pair[side].core, now);
      };
      schedule('a');
      schedule('b');
      const context = (step: number, what: string) => `seed ${seed}, step ${step} (${what}), timings ${JSON.stringify(timings ?? 'production')}`;
      const check = (step: number, what: string) => {
        for (const side of sides) {
          const due = pair[side].core.nextDeadline(pair.clock.now());
          assert.ok(due >= scheduled[side], `${side}: a deadline at ${due} before the run at ${scheduled[side]}: ${context(step, what)}`);
        }
      };
      /** Moves the clock to `until`, running each side's timer at its scheduled times on the way. */
      const passTime = (until: number, step: number) => {
        for (;;) {
          const side = scheduled.a <= scheduled.b ? 'a' : 'b';
          if (scheduled[side] > until) break;
          pair.clock.advance(scheduled[side] - pair.clock.now());
          pair[side].core.tick();
          schedule(side);
          check(step, `${side}'s timer`);
        }
        pair.clock.advance(until - pair.clock.now());
      };
      const deliver = (step: number) => {
        if (pair.wire.length === 0) return;
        const index = random() < 0.7 ? 0 : Math.floor(random() * pair.wire.length);
        const [d] = pair.wire.splice(index, 1);
        if (random() < 0.1) return; // lost
        (d.from === 'a' ? pair.b : pair.a).core.receiveDatagram(d.bytes, d.source);
        check(step, `delivery to ${d.from === 'a' ? 'b' : 'a'}`);
      };

      for (let step = 0; step < 400; step++) {
        const r = random();
        if (r < 0.3) {
          const from = random() < 0.5 ? 'a' : 'b';
          pair[from].core.sendPacket(from === 'a' ? ipv4Packet(A_INNER, B_INNER, 40, step) : ipv4Packet(B_INNER, A_INNER, 40, step));
          check(step, `${from} sends`);
        } else if (r < 0.65) {
          deliver(step);
        } else if (r < 0.68) {
          const side = random() < 0.5 ? 'a' : 'b';
          pair[side].peer.setPersistentKeepalive(random() < 0.5 ? 0 : 1 + Math.floor(random() * 3));
          check(step, `${side}'s persistent keepalive changed`);
        } else {
          // Time passes: mostly short steps, sometimes past a rekey or the end of a session.
          const longest = (timings?.rejectAfterTime ?? PRODUCTION_TIMINGS.rejectAfterTime) / 4;
          passTime(pair.clock.now() + Math.floor(random() < 0.9 ? random() * 300 : random() * longest), step);
        }
      }
    }
  });
});
