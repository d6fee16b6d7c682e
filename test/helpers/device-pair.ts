/**
 * Two Devices over in-memory TUNs and an in-memory UDP network, each the other's peer: A is
 * 192.0.2.1 with inner 10.0.0.1, B is 192.0.2.2 with inner 10.0.0.2. Used by the device tests.
 */
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { Device, type DeviceOptions } from '../../dataplane/device/device.ts';
import { MemoryNetwork } from '../../dataplane/bind/memory-bind.ts';
import { MemoryTun } from '../../dataplane/tun/memory-tun.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';

type PairOptions = Pick<DeviceOptions, 'timings' | 'logger' | 'clock'> & {
  /** false: the TUNs do not seal themselves (MemoryTunOptions.sealsItself), so every packet takes the core's single-packet path. */
  tunSeals?: boolean;
};

/** `options` apply to both devices; `only` to one of them (e.g. TUNs that do not seal on B only). */
export async function makeDevicePair(crypto: Crypto, options: PairOptions = {}, only: { a?: PairOptions; b?: PairOptions } = {}) {
  const network = new MemoryNetwork();
  const make = async (host: string, own: PairOptions | undefined) => {
    const { tunSeals, ...deviceOptions } = { ...options, ...own };
    const tun = new MemoryTun('rgmem0', 1420, { sealsItself: tunSeals });
    const bind = network.bind(host);
    const device = new Device({ tun, bind, crypto, ...deviceOptions });
    device.core.setPrivateKey(generatePrivateKey(crypto));
    await device.start(0);
    return { tun, bind, device };
  };
  const a = await make('192.0.2.1', only.a);
  const b = await make('192.0.2.2', only.b);
  a.device.core.addPeer(b.device.core.ourPublicKey!, { endpoint: new Endpoint('192.0.2.2', b.bind.port), allowedIps: ['10.0.0.2/32'] });
  b.device.core.addPeer(a.device.core.ourPublicKey!, { endpoint: new Endpoint('192.0.2.1', a.bind.port), allowedIps: ['10.0.0.1/32'] });
  return { network, a, b, close: async () => { await a.device.close(); await b.device.close(); } };
}
