/**
 * Memory per peer inside one process: the JavaScript heap a WireGuardCore grows by when `peers`
 * peers are added (each with a public key, an endpoint and one /32 of allowed IPs), measured
 * between two full garbage collections. Needs a collectable heap (Node with --expose-gc, or Bun).
 */
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { WireGuardCore } from '../../dataplane/core.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';
import { collectGarbage } from './measure.ts';

export interface PeerMemoryFigure {
  peers: number;
  heapBytesPerPeer: number;
  /** The heap with the core alone and with every peer added, bytes. */
  heapBefore: number;
  heapAfter: number;
}

/** The `n`-th inner /32 of the peer set: 10.x.y.z counting from 10.0.0.1. */
export function peerInnerAddress(n: number): string {
  const v = n + 1;
  return `10.${(v >>> 16) & 255}.${(v >>> 8) & 255}.${v & 255}`;
}

export function measurePeerMemory(crypto: Crypto, peers: number): PeerMemoryFigure {
  const core = new WireGuardCore({
    crypto, privateKey: generatePrivateKey(crypto),
    outputs: { sendDatagram() { /* none */ }, deliverPacket() { /* none */ } },
  });
  // The keys exist before the first reading (the core keeps a copy, which counts); the endpoint
  // and the allowed-IPs entry are made per peer, as the control socket does.
  const keys = Array.from({ length: peers }, () => crypto.publicKey(generatePrivateKey(crypto)));
  if (!collectGarbage()) throw new Error('no garbage collector to call (run Node with --expose-gc)');
  const heapBefore = process.memoryUsage().heapUsed;
  for (let i = 0; i < peers; i++) {
    const endpoint = new Endpoint(`198.19.${(i / 250) | 0}.${(i % 250) + 1}`, 51820);
    core.addPeer(keys[i], { endpoint, allowedIps: [`${peerInnerAddress(i)}/32`] });
  }
  collectGarbage();
  const heapAfter = process.memoryUsage().heapUsed;
  // Read after the second measurement, so the keys cannot have been collected in between.
  if (core.peerCount !== peers || keys.length !== peers) throw new Error(`the core holds ${core.peerCount} peers, not ${peers}`);
  return { peers, heapBytesPerPeer: (heapAfter - heapBefore) / peers, heapBefore, heapAfter };
}
