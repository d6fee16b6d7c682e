/**
 * Two WireGuardCores back to back over an in-memory "network", with one manual clock.
 * Datagrams are queued, not delivered at once, so a test can inspect, drop, capture, tamper with
 * or replay them before `pump()` delivers them.
 */
import { ManualClock } from '../../dataplane/clock.ts';
import { WireGuardCore, type Peer } from '../../dataplane/core.ts';
import type { Timings } from '../../dataplane/constants.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';

export interface InFlight {
  from: 'a' | 'b';
  to: Endpoint;
  source: Endpoint;
  bytes: Uint8Array;
}

export interface Side {
  core: WireGuardCore;
  /** This side's view of the other side. */
  peer: Peer;
  endpoint: Endpoint;
  /** Inner packets delivered to this side's "TUN". */
  delivered: Uint8Array[];
}

export interface CorePair {
  clock: ManualClock;
  a: Side;
  b: Side;
  /** Datagrams sent but not yet delivered. */
  wire: InFlight[];
  /** Every datagram ever sent (copies), for replay tests. */
  log: InFlight[];
  /** Delivers queued datagrams (and whatever they cause) until the wire is quiet. Returns how many. */
  pump(filter?: (d: InFlight) => boolean): number;
  /** Moves time forward in steps, ticking both cores and pumping the wire after each step. */
  advance(ms: number, stepMs?: number): void;
}

export const A_INNER = '10.0.0.1';
export const B_INNER = '10.0.0.2';

export function makeCorePair(crypto: Crypto, options: { timings?: Partial<Timings>; persistentKeepalive?: number; presharedKey?: Uint8Array } = {}): CorePair {
  const clock = new ManualClock();
  const wire: InFlight[] = [];
  const log: InFlight[] = [];
  const aEndpoint = new Endpoint('192.0.2.1', 51820);
  const bEndpoint = new Endpoint('198.51.100.2', 51821);
  const aKey = generatePrivateKey(crypto);
  const bKey = generatePrivateKey(crypto);
  const delivered = { a: [] as Uint8Array[], b: [] as Uint8Array[] };

  const makeCore = (name: 'a' | 'b', privateKey: Uint8Array, self: Endpoint) => new WireGuardCore({
    crypto, clock, privateKey, timings: options.timings,
    outputs: {
      sendDatagram(to, datagram) {
        const d = { from: name, to, source: self, bytes: Uint8Array.from(datagram) };
        wire.push(d);
        log.push({ ...d, bytes: Uint8Array.from(datagram) });
      },
      deliverPacket(packet) { delivered[name].push(Uint8Array.from(packet)); },
    },
  });
  const aCore = makeCore('a', aKey, aEndpoint);
  const bCore = makeCore('b', bKey, bEndpoint);
  const aPeer = aCore.addPeer(bCore.ourPublicKey!, {
    endpoint: bEndpoint, allowedIps: [`${B_INNER}/32`, 'fd00::2/128'],
    persistentKeepalive: options.persistentKeepalive, presharedKey: options.presharedKey,
  });
  const bPeer = bCore.addPeer(aCore.ourPublicKey!, {
    endpoint: aEndpoint, allowedIps: [`${A_INNER}/32`, 'fd00::1/128'], presharedKey: options.presharedKey,
  });
  const a: Side = { core: aCore, peer: aPeer, endpoint: aEndpoint, delivered: delivered.a };
  const b: Side = { core: bCore, peer: bPeer, endpoint: bEndpoint, delivered: delivered.b };

  const pump = (filter?: (d: InFlight) => boolean): number => {
    let n = 0;
    for (let guard = 0; wire.length > 0 && guard < 100_000; guard++) {
      const d = wire.shift()!;
      if (filter && !filter(d)) continue;
      const target = d.from === 'a' ? bCore : aCore;
      target.receiveDatagram(d.bytes, d.source);
      n++;
    }
    return n;
  };
  const advance = (ms: number, stepMs = 100): void => {
    for (let t = 0; t < ms; t += stepMs) {
      clock.advance(Math.min(stepMs, ms - t));
      aCore.tick();
      bCore.tick();
      pump();
    }
  };
  return { clock, a, b, wire, log, pump, advance };
}
