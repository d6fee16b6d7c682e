/**
 * A model-based adversarial test of the whole inbound and outbound path (issue 12, item 1): two
 * Devices over in-memory TUNs that seal what they read as the reader threads do in one
 * configuration, and in another TUNs that do not seal themselves, so that every packet takes the
 * core's single-packet path, driven by a seeded PRNG through random interleavings of
 *
 * - genuine traffic both ways, sealed where it is read by the TUN's sealer while the send table
 *   names a keypair (MemoryTun runs transport-sealer.ts as the reader thread does), else by the
 *   core on the main thread,
 * - handshakes: either side initiating, both at once (crossing), timer rekeys, expiry and key
 *   erasure on the manual clock, private-key changes (with the peer re-added on the other side),
 * - an attacker who sees every receiver index on the wire and sends datagrams sealed under the
 *   all-zero key, under keys of keypairs it remembers that have since been retired, and under
 *   random keys, small and large, from its own addresses or spoofing the genuine one,
 * - replays, reordering, duplication and loss of genuine datagrams (and some replayed handshakes),
 *   and the genuine peers roaming between two addresses each,
 * - event-loop turns at random points: a datagram is opened by the receiving bind the moment the
 *   model delivers it (as the UDP reader thread opens it on receipt) and handled by the device on
 *   a later turn, so a handshake delivered before it, a key change or expiry in between often
 *   retires the keypair it was opened under before it is handled.
 *
 * The invariants, checked at every step: every packet written to a TUN was sealed by the genuine
 * peer (each genuine inner packet carries a unique id; forged ones carry another tag) and is
 * written at most once; each device's endpoint for its peer is always one of the peer's genuine
 * addresses (only authenticated datagrams may move it, and the attacker's never are); no datagram
 * a device sends opens under the all-zero key. At the end of each configuration: the 'zero-key'
 * floor was never reached, the binds opened genuine datagrams and refused forged ones, both races
 * was exercised ('keypair-retired' drops), the genuine peers' roaming moved the endpoints, and every
 * retired keypair's keys are zeros once the pipelines are idle (no hold leaked).
 *
 * ROAMGUARD_SOAK=1 runs 10 000 000 steps per configuration; ROAMGUARD_MODEL_SEED replays a seed
 * (the action sequence is the seed's; where worker completions land between steps depends on
 * the machine).
 * ROAMGUARD_MODEL_STEPS overrides the number of steps per configuration.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ManualClock } from '../../dataplane/clock.ts';
import { THREAD_KEYPAIR_MARGIN_MS, type Timings } from '../../dataplane/constants.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { writeCounterNonce, type Crypto } from '../../dataplane/crypto/primitives.ts';
import type { Device } from '../../dataplane/device/device.ts';
import type { MemoryBind } from '../../dataplane/bind/memory-bind.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';
import type { Keypair } from '../../dataplane/session/keypair.ts';
import { NO_KEYPAIR } from '../../dataplane/session/send-table.ts';
import type { Peer } from '../../dataplane/session/peer.ts';
import type { MemoryTun } from '../../dataplane/tun/memory-tun.ts';
import { makeDevicePair } from '../helpers/device-pair.ts';
import { randInt, readU32le, weighted, writeU32le, type Rng } from '../helpers/fuzz.ts';
import { prng } from '../helpers/prng.ts';
import { isBun } from '../../dataplane/sys/threads.ts';

const SOAK = process.env.ROAMGUARD_SOAK === '1';
const SEED = Number(process.env.ROAMGUARD_MODEL_SEED ?? 0x4b3e11);
/**
 * Steps per configuration: 2 x 250 000 under Node (the default suite's half million, about 30 s);
 * under Bun, which runs the unit tests a second time in CI with a 60 s limit per test, 100 000.
 * The soak runs 10 000 000.
 */
const STEPS = Number(process.env.ROAMGUARD_MODEL_STEPS ?? (SOAK ? 10_000_000 : isBun ? 100_000 : 250_000));

/** Short protocol timers, so rekeys, expiry and key erasure happen often on the manual clock. */
const TIMINGS: Partial<Timings> = {
  rekeyAfterTime: 3_000, rejectAfterTime: 4_500, rekeyAttemptTime: 2_000, rekeyTimeout: 250,
  rekeyTimeoutJitterMax: 20, keepaliveTimeout: 600,
};

const GENUINE = 0x47454e55; // 'GENU': sealed by the genuine peer
const FORGED = 0x4556494c; // 'EVIL': sealed by the attacker
const PROTO = 253; // IP protocol "for experimentation"
/** A forged packet's id says (in its top 4 bits) what it was sealed under. */
const FORGED_KINDS = [undefined, 'the all-zero key', 'a retired keypair\'s key', 'a random key'];

const INNER = { a: [10, 0, 0, 1], b: [10, 0, 0, 2] } as const;
const ATTACKERS = [new Endpoint('203.0.113.66', 6666), new Endpoint('198.18.0.9', 53), new Endpoint('2001:db8::bad', 443)];

type Name = 'a' | 'b';
const other = (n: Name): Name => (n === 'a' ? 'b' : 'a');

/** An IPv4 packet from `src` to `dst` whose payload is a tag and a 32-bit id. */
function innerPacket(src: readonly number[], dst: readonly number[], tag: number, id: number, size: number): Uint8Array {
  const p = new Uint8Array(Math.max(28, size));
  const view = new DataView(p.buffer);
  p[0] = 0x45;
  view.setUint16(2, p.length);
  p[8] = 64;
  p[9] = PROTO;
  p.set(src, 12);
  p.set(dst, 16);
  view.setUint32(20, tag);
  view.setUint32(24, id);
  return p;
}

const ACTIONS = [
  ['send', 170], ['burst', 30], ['deliver', 250], ['deliver-many', 60], ['lose', 10], ['replay', 40],
  ['forge', 170], ['forge-burst', 20], ['turn', 150], ['time', 35], ['initiate', 8], ['cross', 3],
  ['replay-handshake', 2], ['expire', 1], ['change-key', 1], ['settle', 1], ['roam', 2],
] as const;
type Action = typeof ACTIONS[number][0];

interface OnWire { to: Name; bytes: Uint8Array; /** Absent: from wherever the genuine sender is at delivery time. */ source?: Endpoint }
interface Remembered { keypair: Keypair; key: Uint8Array; index: number }

let crypto: Crypto;
before(async () => {
  crypto = await selectCrypto();
});

/**
 * `tunSeals` false: the TUNs do not seal (MemoryTunOptions.sealsItself, as a reader thread without
 * an AEAD provider), so every packet takes the core's single-packet path on the main thread.
 */
async function runModel(config: string, seed: number, steps: number, tunSeals = true) {
  const rng: Rng = prng(seed);
  /** For what the wire keeps for replays: called whenever a device sends, so it must not consume `rng`. */
  const sampling: Rng = prng(seed ^ 0x9e3779b9);
  const clock = new ManualClock();
  const pair = await makeDevicePair(crypto, { timings: TIMINGS, clock, tunSeals });
  const sides = { a: pair.a, b: pair.b };
  const device = (n: Name): Device => sides[n].device;
  const tun = (n: Name): MemoryTun => sides[n].tun;
  /**
   * Each side's two genuine addresses: it sends from the first; the model delivers its datagrams
   * from whichever it is "at" (it roams between them now and then). A bind at the second address
   * lets datagrams sent there reach the wire too.
   */
  const addresses = {
    a: [new Endpoint('192.0.2.1', pair.a.bind.port), new Endpoint('192.0.2.11', pair.a.bind.port)],
    b: [new Endpoint('192.0.2.2', pair.b.bind.port), new Endpoint('192.0.2.12', pair.b.bind.port)],
  };
  await pair.network.bind('192.0.2.11').open(pair.a.bind.port);
  await pair.network.bind('192.0.2.12').open(pair.b.bind.port);
  const at = { a: 0, b: 0 };
  const genuineAddress = (n: Name) => addresses[n][at[n]];
  /** n's peer object for the other side (replaced when the other side's key changes). */
  const lookUpPeer = (n: Name): Peer => device(n).core.getPeer(device(other(n)).core.ourPublicKey!)!;
  const peers = { a: lookUpPeer('a'), b: lookUpPeer('b') };
  const peerOf = (n: Name): Peer => peers[n];
  const zeroKey = new Uint8Array(32);
  const nonce = new Uint8Array(12);

  /** What went wrong in the step that broke an invariant (all of it, not only the first). */
  const failures: string[] = [];
  const fail = (what: string) => { if (failures.length < 5) failures.push(what); };

  // --- the wire: every datagram a device sends is captured here and delivered only when the model says so
  const wire: OnWire[] = [];
  const transports: Record<Name, Uint8Array[]> = { a: [], b: [] }; // genuine transport datagrams, for replays
  const handshakes: OnWire[] = [];
  const seenIndices: Record<Name, number[]> = { a: [], b: [] }; // receiver indices that lead to n, as seen on the wire
  const noteIndex = (to: Name, index: number) => {
    const list = seenIndices[to];
    if (list.includes(index)) return;
    list.push(index);
    if (list.length > 16) list.shift();
  };
  let sentDatagrams = 0;
  pair.network.filter = (from, _to, bytes) => {
    const sender: Name = from.host === '192.0.2.1' ? 'a' : 'b';
    if (!from.equals(addresses[sender][0])) fail(`a datagram from an unknown address ${from}`);
    const to = other(sender);
    sentDatagrams++;
    const type = bytes[0];
    if (type === 4 && bytes.length >= 32) {
      noteIndex(to, readU32le(bytes, 4));
      const counter = readU32le(bytes, 8) + readU32le(bytes, 12) * 2 ** 32;
      const sealed = bytes.slice(16);
      if (crypto.open(zeroKey, writeCounterNonce(counter, nonce), sealed, undefined)) fail(`${sender} sent a datagram sealed under the all-zero key`);
      keep(transports[to], bytes, 512);
    } else if (type === 1) {
      noteIndex(sender, readU32le(bytes, 4));
      keepHandshake({ to, bytes });
    } else if (type === 2) {
      noteIndex(sender, readU32le(bytes, 4));
      noteIndex(to, readU32le(bytes, 8));
      keepHandshake({ to, bytes });
    }
    wire.push({ to, bytes });
    if (wire.length > 4096) wire.shift(); // a congested link loses the oldest
    return false; // the model delivers it
  };
  const keep = (list: Uint8Array[], bytes: Uint8Array, max: number) => {
    if (list.length < max) list.push(bytes);
    else list[randInt(sampling, max)] = bytes;
  };
  const keepHandshake = (d: OnWire) => {
    if (handshakes.length < 64) handshakes.push(d);
    else handshakes[randInt(sampling, 64)] = d;
  };
  // Opened by the receiving bind now (a copy: the wire keeps its bytes for duplicates and replays),
  // handled on a later turn: whatever the steps in between change (a handshake delivered before it
  // retiring its keypair, a key change, expiry) meets the datagram already opened.
  const deliver = (d: OnWire) => (sides[d.to].bind as MemoryBind).receiveFrom(d.bytes, d.source ?? genuineAddress(other(d.to)));

  // --- genuine traffic: ids 1 .. nextId-1 of each direction were sent (`to` names the receiving side)
  const nextId: Record<Name, number> = { a: 1, b: 1 };
  const deliveredIds: Record<Name, Uint8Array> = { a: new Uint8Array(1 << 16), b: new Uint8Array(1 << 16) };
  const deliveredCount: Record<Name, number> = { a: 0, b: 0 };
  for (const n of ['a', 'b'] as const) {
    tun(n).onWrite((packet) => {
      const view = new DataView(packet.buffer, packet.byteOffset, packet.byteLength);
      const tag = packet.length >= 28 && packet[9] === PROTO ? view.getUint32(20) : 0;
      const id = packet.length >= 28 ? view.getUint32(24) : 0;
      if (tag === FORGED) {
        fail(`${n}'s TUN got a forged packet, sealed under ${FORGED_KINDS[id >>> 28] ?? '?'} (${packet.length} bytes)`);
        return;
      }
      if (tag !== GENUINE || id < 1 || id >= nextId[n]) {
        fail(`${n}'s TUN got a packet the genuine peer never sent (tag ${tag.toString(16)}, id ${id}, ${packet.length} bytes)`);
        return;
      }
      let seen = deliveredIds[n];
      if (id >= seen.length) {
        const grown = new Uint8Array(Math.max(seen.length * 2, id + 1));
        grown.set(seen);
        seen = deliveredIds[n] = grown;
      }
      if (seen[id]) fail(`${n}'s TUN got genuine packet ${id} twice`);
      seen[id] = 1;
      deliveredCount[n]++;
    });
  }
  const send = (from: Name, count: number) => {
    const to = other(from);
    for (let i = 0; i < count; i++) {
      const size = rng() < 0.6 ? 28 + randInt(rng, 200) : 300 + randInt(rng, 1100);
      tun(from).inject(innerPacket(INNER[from], INNER[to], GENUINE, nextId[to]++, size));
    }
  };

  // --- the attacker's memory: keypairs it saw, so it can use their keys once they are retired
  const remembered: Record<Name, Remembered[]> = { a: [], b: [] };
  const seenKeypairs = new WeakSet<Keypair>();
  const checkedAtEnd: Keypair[] = [];
  const slots = (p: Peer | undefined) => (p ? [p.keypairs.previous, p.keypairs.current, p.keypairs.next] : []);
  const live = (n: Name, k: Keypair) => slots(peerOf(n)).includes(k);
  const observeKeypairs = () => {
    for (const n of ['a', 'b'] as const) {
      for (const k of slots(peerOf(n))) {
        if (!k || seenKeypairs.has(k)) continue;
        seenKeypairs.add(k);
        remembered[n].push({ keypair: k, key: k.receiveKey.slice(), index: k.localIndex });
        if (remembered[n].length > 32) checkedAtEnd.push(remembered[n].shift()!.keypair);
      }
    }
  };

  const forge = (victim: Name) => {
    const indices = seenIndices[victim];
    if (indices.length === 0) return;
    let index = indices[randInt(rng, indices.length)];
    let key: Uint8Array;
    let kindCode: number;
    const kind = rng();
    if (kind < 0.45) {
      key = zeroKey;
      kindCode = 1;
    } else if (kind < 0.75) {
      const old = remembered[victim].filter((r) => !live(victim, r.keypair));
      if (old.length === 0) return;
      const r = old[randInt(rng, old.length)];
      key = r.key;
      kindCode = 2;
      if (rng() < 0.7) index = r.index;
    } else {
      key = crypto.randomBytes(32);
      kindCode = 3;
    }
    const size = rng() < 0.5 ? 28 + randInt(rng, 200) : 300 + randInt(rng, 1100);
    const inner = innerPacket(INNER[other(victim)], INNER[victim], FORGED, (kindCode << 28 | randInt(rng, 1 << 28)) >>> 0, size);
    const padded = Math.ceil(inner.length / 16) * 16;
    const bytes = new Uint8Array(16 + padded + 16);
    const counter = rng() < 0.5 ? randInt(rng, 64) : randInt(rng, 1 << 20);
    bytes[0] = 4;
    writeU32le(bytes, 4, index);
    writeU32le(bytes, 8, counter);
    bytes.set(inner, 16);
    crypto.seal(key, writeCounterNonce(counter, nonce), bytes.subarray(16, 16 + padded), undefined, bytes.subarray(16));
    const source = rng() < 0.85 ? ATTACKERS[randInt(rng, ATTACKERS.length)] : addresses[other(victim)][randInt(rng, 2)];
    deliver({ to: victim, source, bytes });
    forged++;
  };
  let forged = 0;

  const tick = () => { device('a').core.tick(); device('b').core.tick(); };
  const advance = (ms: number) => { clock.advance(ms); tick(); };
  const turn = () => new Promise<void>((resolve) => setImmediate(resolve));
  const sleep = () => new Promise<void>((resolve) => setTimeout(resolve, 1));
  /** Until the TUNs' queues are empty and the turns behind them have run. */
  const settle = async () => {
    const deadline = Date.now() + 30_000;
    for (let quiet = 0; quiet < 3;) {
      if (Date.now() > deadline) throw new Error(`${config}: the devices never went idle`);
      // A timer, not only setImmediate: every phase of the event loop runs (Bun delivers
      // Atomics.waitAsync wake-ups in one that a chain of immediates can starve).
      await (quiet === 0 ? sleep() : turn());
      quiet = tun('a').pending === 0 && tun('b').pending === 0 ? quiet + 1 : 0;
    }
  };

  let roamsOfRemovedPeers = 0;
  /** Per side, the number of the peer it removed last (its send-table entry must name nothing). */
  const removedNumber: Record<Name, number | undefined> = { a: undefined, b: undefined };
  const changeKey = (n: Name) => {
    const d = device(n).core;
    if (rng() < 0.5) {
      d.setPrivateKey(d.ourPrivateKey!); // the same key again: every session ends
      return;
    }
    const oldPublic = d.ourPublicKey!;
    d.setPrivateKey(generatePrivateKey(crypto));
    const o = device(other(n)).core;
    roamsOfRemovedPeers += peers[other(n)].roamCount;
    removedNumber[other(n)] = peers[other(n)].number;
    o.removePeer(oldPublic);
    peers[other(n)] = o.addPeer(d.ourPublicKey!, { endpoint: genuineAddress(n), allowedIps: [`${INNER[n].join('.')}/32`] });
  };

  /** Only authenticated datagrams move an endpoint, and those come from the genuine addresses only. */
  const checkEndpoints = (step: number) => {
    for (const n of ['a', 'b'] as const) {
      const p = peerOf(n);
      const [first, second] = addresses[other(n)];
      if (!p.endpoint?.equals(first) && !p.endpoint?.equals(second)) {
        fail(`${n}'s endpoint for its peer moved to ${p.endpoint} (roamed ${p.roamCount} times) at step ${step}`);
      }
    }
  };

  /**
   * The send table (send-table.ts), derived here on its own: it names a keypair for the peer
   * exactly when the main thread would send with it (the current keypair, not retired, more than
   * THREAD_KEYPAIR_MARGIN_MS from its reject-after time, nothing staged, an endpoint), and then
   * that keypair and that endpoint, sticky source included. A removed peer's entry names nothing.
   */
  const sendTableSeen = { named: 0, cleared: 0 };
  const checkSendTables = (step: number) => {
    const now = clock.now();
    for (const n of ['a', 'b'] as const) {
      const p = peerOf(n);
      const table = device(n).core.sendTable;
      const entry = table.read(p.number);
      if (entry === undefined) {
        fail(`${n}'s send table has no entry for its peer at step ${step}`);
        continue;
      }
      const k = p.keypairs.current;
      const e = p.endpoint;
      const usable = p.stagedCount === 0 && e !== undefined && k !== null && !k.retired
        && now - k.created < TIMINGS.rejectAfterTime! - THREAD_KEYPAIR_MARGIN_MS;
      if (!usable) {
        if (entry.keySlot !== NO_KEYPAIR) {
          fail(`${n}'s send table names keypair slot ${entry.keySlot} for its peer at step ${step}, where the main thread must send (staged ${p.stagedCount}, `
            + `endpoint ${e}, current ${k === null ? 'none' : `retired ${k.retired}, age ${now - k.created} ms`})`);
        }
        sendTableSeen.cleared++;
        continue;
      }
      const same = entry.keySlot === k.at.slot && entry.keyGeneration === k.at.generation && entry.remoteIndex === (k.remoteIndex | 0)
        && entry.port === e.port && entry.family === e.family && e.addressBytes.every((b, i) => entry.address[i] === b)
        && (e.local === undefined
          ? entry.sourceFamily === 0
          : entry.sourceIfindex === e.local.ifindex && e.local.address.every((b, i) => entry.sourceAddress[i] === b));
      if (!same) fail(`${n}'s send table for its peer is not its current keypair (slot ${k.at.slot}) and endpoint ${e} at step ${step}: ${JSON.stringify({ ...entry, address: [...entry.address], sourceAddress: [...entry.sourceAddress] })}`);
      sendTableSeen.named++;
      const removed = removedNumber[n];
      if (removed !== undefined && (table.read(removed)?.keySlot ?? NO_KEYPAIR) !== NO_KEYPAIR) fail(`${n}'s send table still names a keypair for its removed peer ${removed} at step ${step}`);
    }
  };

  const counts = new Map<Action, number>();
  const started = performance.now();
  let step = 0;
  let lastAction: Action | undefined;
  try {
    send('a', 1);
    send('b', 1);
    for (; step < steps && failures.length === 0; step++) {
      const action = lastAction = weighted(rng, ACTIONS);
      counts.set(action, (counts.get(action) ?? 0) + 1);
      const side: Name = rng() < 0.5 ? 'a' : 'b';
      switch (action) {
        case 'send': send(side, 1); break;
        case 'burst': send(side, 2 + randInt(rng, 40)); break;
        case 'deliver':
        case 'deliver-many': {
          for (let n = action === 'deliver' ? 1 : 2 + randInt(rng, 30); n > 0 && wire.length > 0; n--) {
            const at = rng() < 0.75 ? 0 : randInt(rng, wire.length); // mostly in order, sometimes reordered
            const d = wire[at];
            if (rng() >= 0.08) wire.splice(at, 1); // else it stays: a duplicate comes later
            deliver(d);
          }
          break;
        }
        case 'lose': if (wire.length > 0) wire.splice(randInt(rng, wire.length), 1); break;
        case 'replay': {
          const list = transports[side];
          if (list.length > 0) deliver({ to: side, source: addresses[other(side)][randInt(rng, 2)], bytes: list[randInt(rng, list.length)] });
          break;
        }
        case 'forge': forge(side); break;
        case 'forge-burst': for (let n = 2 + randInt(rng, 20); n > 0; n--) forge(rng() < 0.8 ? side : other(side)); break;
        case 'turn': await turn(); break;
        case 'time': advance(rng() < 0.9 ? randInt(rng, 200) : randInt(rng, 3000)); break;
        case 'initiate': advance(260); peerOf(side).initiateHandshake(); break;
        case 'cross': advance(260); peerOf('a').initiateHandshake(); peerOf('b').initiateHandshake(); break;
        case 'replay-handshake': if (handshakes.length > 0) deliver(handshakes[randInt(rng, handshakes.length)]); break;
        case 'expire': advance(3 * TIMINGS.rejectAfterTime! + 1); break;
        case 'change-key': changeKey(side); break;
        case 'roam': at[side] ^= 1; break;
        case 'settle': await (rng() < 0.25 ? settle() : turn()); break; // waiting for idle workers is slow on a loaded machine
      }
      observeKeypairs();
      checkEndpoints(step);
      checkSendTables(step);
    }
    if (failures.length === 0) {
      await settle();
      checkEndpoints(step);
    }
    if (failures.length > 0) {
      assert.fail(`${config}: ${failures.join('; ')} — after ${step} steps (the last: ${lastAction}) with seed ${seed} (ROAMGUARD_MODEL_SEED=${seed} replays it; `
        + `drops a ${JSON.stringify(device('a').core.drops.snapshot())}, b ${JSON.stringify(device('b').core.drops.snapshot())})`);
    }
    const drops = { a: device('a').core.drops, b: device('b').core.drops };
    assert.equal(drops.a.get('zero-key') + drops.b.get('zero-key'), 0, 'the zero-key floor is never reached: keypair holds keep keys alive while used');
    for (const n of ['a', 'b'] as const) {
      const opener = (sides[n].bind as MemoryBind).openerCounts;
      assert.ok(opener && opener.opened > 0 && opener.failed > 0, `${n}'s bind opened datagrams on arrival, and refused forged ones: ${JSON.stringify(opener)}`);
      assert.ok(opener.delivered > 0 && opener.delivered < opener.opened, `${n}'s bind delivered some of them itself (confirmed sessions), and left the rest to the device: ${JSON.stringify(opener)}`);
      const sealer = tun(n).sealerCounts;
      if (tunSeals) assert.ok(sealer && sealer.sealed > 0 && sealer.left > 0, `${n}'s TUN sealed and sent some packets itself (the send table named a keypair), and left the rest to the device: ${JSON.stringify(sealer)}`);
      else assert.equal(sealer, undefined, `${n}'s TUN sealed nothing itself`);
    }
    assert.ok(drops.a.get('keypair-retired') + drops.b.get('keypair-retired') > 0, 'the race was exercised: some datagrams opened on arrival met their keypair retired when handled');
    for (const n of ['a', 'b'] as const) checkedAtEnd.push(...remembered[n].filter((r) => !live(n, r.keypair)).map((r) => r.keypair));
    const unzeroed = checkedAtEnd.filter((k) => k.retired && !k.keysZeroed).length;
    assert.equal(unzeroed, 0, 'every retired keypair\'s keys are zeros once the pipelines are idle (no hold leaked)');
    assert.ok(deliveredCount.a > steps / 50 && deliveredCount.b > steps / 50, `genuine traffic flows both ways: ${deliveredCount.a} and ${deliveredCount.b} packets`);
    assert.ok(sendTableSeen.named > steps / 10 && sendTableSeen.cleared > steps / 1000, `the send tables were checked both naming a keypair and handing packets to the main thread: ${JSON.stringify(sendTableSeen)}`);
    const roams = roamsOfRemovedPeers + peerOf('a').roamCount + peerOf('b').roamCount;
    assert.ok(roams > 0, 'the genuine peers roamed, and their authenticated datagrams moved the endpoints');
    return {
      steps, roams, seconds: (performance.now() - started) / 1000, forged, sentDatagrams, delivered: deliveredCount, sendTableSeen,
      retiredKeypairs: checkedAtEnd.length, actions: Object.fromEntries(counts),
      drops: { a: drops.a.snapshot(), b: drops.b.snapshot() },
    };
  } finally {
    await pair.close();
  }
}

describe('keypair lifetime: a model of two devices and an attacker', () => {
  const timeout = SOAK ? 7_200_000 : 300_000;
  test(`TUNs that seal (as the reader threads do): ${STEPS.toLocaleString('en')} random steps; only the genuine peer's packets are delivered, each once; endpoints never reach the attacker`, { timeout }, async (tc) => {
    const result = await runModel('TUNs that seal', SEED, STEPS);
    tc.diagnostic(JSON.stringify(result));
  });
  test(`TUNs that do not seal (every packet through the core's single-packet path): ${STEPS.toLocaleString('en')} random steps; the same invariants`, { timeout }, async (tc) => {
    const result = await runModel('core path only', SEED + 2, STEPS, false);
    tc.diagnostic(JSON.stringify(result));
  });
});
