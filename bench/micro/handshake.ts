/**
 * Handshakes per second on one core: two WireGuardCores back to back in memory, on a manual clock.
 * One handshake is everything both sides do for a new session: A creates the initiation, B
 * consumes it and creates the response, A consumes the response and sends the key-confirming
 * keepalive, B opens it (mac1 checks, X25519, BLAKE2s, AEAD, index tables included). The clock
 * moves 6 s between handshakes so neither the one-initiation-per-RekeyTimeout rule nor the flood
 * check nor the under-load (cookie) mode ever kicks in.
 */
import { ManualClock } from '../../dataplane/clock.ts';
import { WireGuardCore } from '../../dataplane/core.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';
import type { TimingOptions } from './measure.ts';

export interface HandshakeFigure {
  handshakesPerSecond: number;
  /** Handshakes completed in the best run. */
  count: number;
}

/** A pair of cores and a function that runs one complete handshake between them. */
export function makeHandshakeLoop(crypto: Crypto): { once: () => void; completed: () => number } {
  const clock = new ManualClock();
  const aEndpoint = new Endpoint('192.0.2.1', 51820);
  const bEndpoint = new Endpoint('192.0.2.2', 51820);
  const wire: Array<{ to: 'a' | 'b'; bytes: Uint8Array; source: Endpoint }> = [];
  let completed = 0;
  const a: WireGuardCore = new WireGuardCore({
    crypto, clock, privateKey: generatePrivateKey(crypto),
    outputs: {
      sendDatagram(_to, datagram) { wire.push({ to: 'b', bytes: Uint8Array.from(datagram), source: aEndpoint }); },
      deliverPacket() { /* no data */ },
      handshakeCompleted() { completed++; },
    },
  });
  const b: WireGuardCore = new WireGuardCore({
    crypto, clock, privateKey: generatePrivateKey(crypto),
    outputs: {
      sendDatagram(_to, datagram) { wire.push({ to: 'a', bytes: Uint8Array.from(datagram), source: bEndpoint }); },
      deliverPacket() { /* no data */ },
    },
  });
  const peerOfA = a.addPeer(b.ourPublicKey!, { endpoint: bEndpoint, allowedIps: ['10.0.0.2/32'] });
  b.addPeer(a.ourPublicKey!, { endpoint: aEndpoint, allowedIps: ['10.0.0.1/32'] });
  const once = () => {
    clock.advance(6000);
    peerOfA.initiateHandshake();
    for (let guard = 0; wire.length > 0 && guard < 16; guard++) {
      const d = wire.shift()!;
      (d.to === 'a' ? a : b).receiveDatagram(d.bytes, d.source);
    }
  };
  return { once, completed: () => completed };
}

/** Complete handshakes per second, best of `timing.runs` runs; throws if a handshake does not complete. */
export function measureHandshakes(crypto: Crypto, timing: TimingOptions): HandshakeFigure {
  const loop = makeHandshakeLoop(crypto);
  for (let i = 0; i < 20; i++) loop.once(); // warm-up
  if (loop.completed() !== 20) throw new Error(`warm-up: ${loop.completed()} of 20 handshakes completed`);
  let best: HandshakeFigure = { handshakesPerSecond: 0, count: 0 };
  for (let run = 0; run < timing.runs; run++) {
    const before = loop.completed();
    let attempts = 0;
    const start = performance.now();
    let now = start;
    while (now - start < timing.measureMs) {
      for (let i = 0; i < 10; i++) loop.once();
      attempts += 10;
      now = performance.now();
    }
    const count = loop.completed() - before;
    if (count !== attempts) throw new Error(`${attempts - count} of ${attempts} handshakes did not complete`);
    const rate = (count * 1000) / (now - start);
    if (rate > best.handshakesPerSecond) best = { handshakesPerSecond: rate, count };
  }
  return best;
}
