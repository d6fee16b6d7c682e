/**
 * `roamguard selftest`: checks that this machine and runtime can run roamguard's protocol core.
 * It picks the crypto providers (each passes known-answer tests first), runs a full handshake
 * between two in-memory WireGuard cores, moves packets both ways and reports the rates.
 */
import type { Command } from '../roamguard.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { cryptoSelection, loadDataplaneSettings } from '../../dataplane/settings.ts';
import { WireGuardCore } from '../../dataplane/core.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';

function ipv4Packet(src: number[], dst: number[], size: number): Uint8Array {
  const p = new Uint8Array(size);
  p[0] = 0x45; p[2] = size >> 8; p[3] = size & 0xff; p[8] = 64; p[9] = 17;
  p.set(src, 12); p.set(dst, 16);
  return p;
}

export const selftest: Command = {
  summary: 'check crypto providers and run an in-memory handshake and transfer',
  usage: 'roamguard selftest [--packets N] [--size BYTES]',
  async run(args) {
    const opt = (name: string, def: number) => {
      const i = args.indexOf(name);
      const v = i >= 0 ? Number(args[i + 1]) : def;
      if (!Number.isInteger(v) || v <= 0) throw new Error(`${name} needs a positive whole number`);
      return v;
    };
    const packets = opt('--packets', 20_000);
    const size = opt('--size', 1400);
    const runtime = typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined' ? `bun ${process.versions.bun}` : `node ${process.versions.node}`;
    // The providers the daemon would pick here (ROAMGUARD_CRYPTO, ROAMGUARD_LIBSODIUM).
    const crypto = await selectCrypto(cryptoSelection(loadDataplaneSettings()));
    console.log(`runtime:   ${runtime}`);
    for (const [group, provider] of Object.entries(crypto.providers)) console.log(`crypto:    ${group.padEnd(7)} ${provider}`);

    let delivered = 0;
    const queue: { to: 'a' | 'b'; bytes: Uint8Array; from: Endpoint }[] = [];
    const epA = new Endpoint('192.0.2.1', 51820), epB = new Endpoint('192.0.2.2', 51820);
    const make = (self: Endpoint, other: 'a' | 'b') => new WireGuardCore({
      crypto, privateKey: generatePrivateKey(crypto),
      outputs: {
        sendDatagram: (_to, d) => { queue.push({ to: other, bytes: Uint8Array.from(d), from: self }); },
        deliverPacket: () => { delivered++; },
      },
    });
    const a = make(epA, 'b'), b = make(epB, 'a');
    a.addPeer(b.ourPublicKey!, { endpoint: epB, allowedIps: ['10.0.0.2/32'] });
    b.addPeer(a.ourPublicKey!, { endpoint: epA, allowedIps: ['10.0.0.1/32'] });
    const pump = () => { for (let m = queue.shift(); m; m = queue.shift()) (m.to === 'a' ? a : b).receiveDatagram(m.bytes, m.from); };

    const t0 = performance.now();
    a.sendPacket(ipv4Packet([10, 0, 0, 1], [10, 0, 0, 2], size));
    pump();
    const handshakeMs = performance.now() - t0;
    if (delivered !== 1) { console.error('selftest: FAILED: the first packet did not arrive after the handshake'); return 1; }
    console.log(`handshake: ${handshakeMs.toFixed(1)} ms (initiation, response, first packet)`);

    const packet = ipv4Packet([10, 0, 0, 1], [10, 0, 0, 2], size);
    const t1 = performance.now();
    for (let i = 0; i < packets; i++) { a.sendPacket(packet); if (queue.length >= 64) pump(); }
    pump();
    const seconds = (performance.now() - t1) / 1000;
    if (delivered !== packets + 1) { console.error(`selftest: FAILED: ${delivered - 1} of ${packets} packets arrived`); return 1; }
    const rate = packets / seconds;
    console.log(`transfer:  ${packets} × ${size} B sealed and opened on one thread: ${Math.round(rate)} packets/s (${(rate * size * 8 / 1e9).toFixed(2)} Gbit/s)`);
    console.log('selftest: ok');
    return 0;
  },
};
