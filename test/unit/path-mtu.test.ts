/**
 * Path MTU decisions (control/agent/path-mtu.ts) on an injected clock, the search against a model
 * of a narrow path that pads like WireGuard, the routes that carry what was learned, and the
 * uplink-derived tunnel MTU (control/host/uplink-mtu.ts) from `ip -j` output.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { keyFromBase64, keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot, PeerSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DesiredPeer } from '../../control/mesh/desired-peers.ts';
import {
  dueProbes, NO_ANSWER_RETRY_MS, recordProbe, REPROBE_INTERVAL_MS, routesWithPathMtu, searchLargestFit, STALL_REPROBE_AFTER_MS, type PathMtuMemory,
} from '../../control/agent/path-mtu.ts';
import { chooseUplinkMtu } from '../../control/host/uplink-mtu.ts';
import { pingArguments } from '../../control/host/ping-probe.ts';

const NOW = Date.UTC(2026, 11, 3, 12, 0, 0);
const [K1, K2, K3] = Array.from({ length: 3 }, () => keyToBase64(randomBytes(32)));

function peer(key: string, nodeName: string, allowedIps: string[]): DesiredPeer {
  return { nodeName, publicKey: key, publicKeyBytes: keyFromBase64(key), addresses: [], allowedIps, persistentKeepalive: 25 };
}
const mesh = new Map([
  [K1, peer(K1, 'home-1', ['10.244.2.0/24', '203.0.113.20/32', 'fd00:10:244:2::/64'])],
  [K2, peer(K2, 'cloud-1', ['fd00:10:244:3::/64'])],
  [K3, peer(K3, 'native', ['10.244.4.0/24'])],
]);
const tunnelRoutes = ['10.244.2.0/24', 'fd00:10:244:2::/64', 'fd00:10:244:3::/64'];

function device(peers: Array<{ key: string; endpoint?: string; handshake?: number; tx?: number; rx?: number }>): DeviceSnapshot {
  return {
    listenPort: 51820, fwmark: 0,
    peers: peers.map((p): PeerSnapshot => ({
      publicKey: keyFromBase64(p.key), presharedKey: new Uint8Array(32), endpoint: p.endpoint ? Endpoint.parse(p.endpoint) : undefined,
      lastHandshakeWallMs: p.handshake ?? 0, txBytes: p.tx ?? 0, rxBytes: p.rx ?? 0, persistentKeepalive: 25, allowedIps: [],
    })),
  };
}

/** A path whose outer MTU is `pathMtu`, behind a tunnel of `tunnelMtu` with IPv4 endpoints: WireGuard pads to 16, never past the tunnel MTU. */
function narrowPath(pathMtu: number, tunnelMtu = 1420) {
  const tried: number[] = [];
  const fits = async (size: number) => {
    tried.push(size);
    const padded = Math.min(Math.ceil(size / 16) * 16, tunnelMtu);
    return size <= tunnelMtu && padded + 60 <= pathMtu;
  };
  return { fits, tried };
}

describe('path MTU: when to probe (injected clock)', () => {
  test('a peer is probed once its session works; not again until its endpoint changes, traffic stalls or the interval passes', () => {
    const memory: PathMtuMemory = new Map();
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, device([{ key: K1, endpoint: '203.0.113.20:51824' }]), memory, NOW), [], 'no session yet: nothing to learn');
    const working = { key: K1, endpoint: '203.0.113.20:51824', handshake: NOW - 1000 };
    const first = dueProbes(mesh, tunnelRoutes, device([working]), memory, NOW);
    assert.deepEqual(first, [{ key: K1, nodeName: 'home-1', address: '10.244.2.1', reason: 'first' }]);
    recordProbe(memory, first[0], '203.0.113.20:51824', 1216, NOW);
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, device([working]), memory, NOW + 5000), []);
    // A roam (new NAT mapping): maybe another path.
    const roamed = dueProbes(mesh, tunnelRoutes, device([{ ...working, endpoint: '203.0.113.20:40000' }]), memory, NOW + 10_000);
    assert.deepEqual(roamed.map((t) => t.reason), ['endpoint-changed']);
    recordProbe(memory, roamed[0], '203.0.113.20:40000', 1216, NOW + 10_000);
    const here = { ...working, endpoint: '203.0.113.20:40000', handshake: NOW + 9000 };
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, device([{ ...here, handshake: NOW + 10_000 - 1 + REPROBE_INTERVAL_MS }]), memory, NOW + 10_000 + REPROBE_INTERVAL_MS).map((t) => t.reason), ['periodic']);
  });

  test('a stall (bytes out, none in, two looks in a row) re-probes, but not within 30 s of the last probe; answers in between reset it', () => {
    const memory: PathMtuMemory = new Map();
    const at = (t: number, tx: number, rx: number) => device([{ key: K1, endpoint: '203.0.113.20:51824', handshake: t - 1000, tx, rx }]);
    const [first] = dueProbes(mesh, tunnelRoutes, at(NOW, 0, 0), memory, NOW);
    recordProbe(memory, first, '203.0.113.20:51824', 1420, NOW);
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, at(NOW + 5000, 100_000, 0), memory, NOW + 5000), [], 'one flat look');
    dueProbes(mesh, tunnelRoutes, at(NOW + 5100, 110_000, 0), memory, NOW + 5100);
    assert.equal(memory.get(K1)!.flatLooks, 1, 'a look 100 ms after the last (a burst of passes) does not count');
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, at(NOW + 10_000, 200_000, 0), memory, NOW + 10_000), [], 'two flat looks, but the last probe was 10 s ago');
    const stalled = dueProbes(mesh, tunnelRoutes, at(NOW + STALL_REPROBE_AFTER_MS, 300_000, 0), memory, NOW + STALL_REPROBE_AFTER_MS);
    assert.deepEqual(stalled.map((t) => t.reason), ['stall']);
    recordProbe(memory, stalled[0], '203.0.113.20:51824', 1216, NOW + STALL_REPROBE_AFTER_MS);
    const later = NOW + 3 * STALL_REPROBE_AFTER_MS;
    dueProbes(mesh, tunnelRoutes, at(later, 400_000, 0), memory, later);
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, at(later + 5000, 500_000, 10), memory, later + 5000), [], 'something came back: no stall');
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, at(later + 10_000, 500_100, 10), memory, later + 10_000), [], 'a trickle out is no stall');
  });

  test('a probe nobody answered is tried again after 10 s; an answered one is not', () => {
    const memory: PathMtuMemory = new Map();
    const at = (t: number) => device([{ key: K1, endpoint: '203.0.113.20:51824', handshake: t - 1000 }]);
    const [first] = dueProbes(mesh, tunnelRoutes, at(NOW), memory, NOW);
    recordProbe(memory, first, '203.0.113.20:51824', undefined, NOW);
    assert.equal(memory.get(K1)!.mtu, undefined, 'no answer at any size: nothing learned');
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, at(NOW + NO_ANSWER_RETRY_MS - 1), memory, NOW + NO_ANSWER_RETRY_MS - 1), []);
    const again = dueProbes(mesh, tunnelRoutes, at(NOW + NO_ANSWER_RETRY_MS), memory, NOW + NO_ANSWER_RETRY_MS);
    assert.deepEqual(again.map((t) => t.reason), ['no-answer'], 'the peer may not have had its route back to us yet');
    recordProbe(memory, again[0], '203.0.113.20:51824', 1216, NOW + NO_ANSWER_RETRY_MS);
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, at(NOW + 3 * NO_ANSWER_RETRY_MS), memory, NOW + 3 * NO_ANSWER_RETRY_MS), []);
  });

  test('a peer without routed pod CIDRs is not probed (no tunnel gateway address); gone peers are forgotten', () => {
    const memory: PathMtuMemory = new Map();
    const all = device([K1, K2, K3].map((key) => ({ key, endpoint: '203.0.113.9:51820', handshake: NOW })));
    assert.deepEqual(dueProbes(mesh, tunnelRoutes, all, memory, NOW).map((t) => t.nodeName), ['home-1', 'cloud-1']);
    dueProbes(new Map([[K2, mesh.get(K2)!]]), tunnelRoutes, all, memory, NOW + 1);
    assert.deepEqual([...memory.keys()], [K2]);
  });
});

describe('path MTU: the search', () => {
  test('a 1280 hop behind a 1420 tunnel: 1216, the largest size whose padded datagram fits (1217..1232 pad to 1232 and do not)', async () => {
    const path = narrowPath(1280);
    assert.equal(await searchLargestFit(1200, 1420, path.fits), 1216);
    assert.ok(path.tried.length <= 10, `few probes: ${path.tried.join(' ')}`);
  });

  test('a path that carries the whole tunnel MTU costs one probe; one that carries nothing gives no answer', async () => {
    const wide = narrowPath(1500);
    assert.equal(await searchLargestFit(1200, 1420, wide.fits), 1420);
    assert.deepEqual(wide.tried, [1420]);
    assert.equal(await searchLargestFit(1200, 1420, async () => false), undefined);
    for (const pathMtu of [1492, 1450, 1400, 1300, 1281]) {
      const got = await searchLargestFit(1200, 1420, narrowPath(pathMtu).fits);
      assert.ok(got !== undefined && Math.min(Math.ceil(got / 16) * 16, 1420) + 60 <= pathMtu && Math.min(Math.ceil((got + 1) / 16) * 16, 1420) + 60 > pathMtu || got === 1420, `${pathMtu}: ${got}`);
    }
    await assert.rejects(searchLargestFit(1420, 1200, wide.fits), /bad search range/);
  });

  test('ping arguments: DF set, exact packet size per family', () => {
    assert.deepEqual(pingArguments('10.244.2.1', 1216), ['-4', '-n', '-q', '-c', '3', '-i', '0.2', '-W', '1', '-M', 'do', '-s', '1188', '10.244.2.1']);
    assert.deepEqual(pingArguments('fd00::1', 1280).slice(-3), ['-s', '1232', 'fd00::1']);
    assert.throws(() => pingArguments('10.0.0.1', 10), /probe size/);
  });
});

describe('path MTU: routes', () => {
  test('a learned MTU below the tunnel\'s goes on every routed pod CIDR of that peer; each peer gets a probe host route without MTU', () => {
    const memory: PathMtuMemory = new Map([[K1, { mtu: 1216, probedAtMs: NOW, reason: 'first', endpoint: undefined, lastTx: 0, lastRx: 0, lastLookMs: NOW, flatLooks: 0 }],
      [K2, { mtu: 1420, probedAtMs: NOW, reason: 'first', endpoint: undefined, lastTx: 0, lastRx: 0, lastLookMs: NOW, flatLooks: 0 }]]);
    assert.deepEqual(routesWithPathMtu(tunnelRoutes, mesh, memory, 1420, true), [
      { dst: '10.244.2.0/24', mtu: 1216 }, { dst: 'fd00:10:244:2::/64', mtu: 1216 }, { dst: 'fd00:10:244:3::/64' },
      { dst: '10.244.2.1/32' }, { dst: 'fd00:10:244:3::1/128' },
    ]);
    assert.deepEqual(routesWithPathMtu(tunnelRoutes, mesh, memory, 1420, false), tunnelRoutes.map((dst) => ({ dst })), 'discovery off: plain routes');
  });
});

describe('tunnel MTU from the uplink', () => {
  const links = JSON.stringify([
    { ifname: 'lo', mtu: 65536, addr_info: [{ family: 'inet', local: '127.0.0.1' }] },
    { ifname: 'eth0', mtu: 1500, addr_info: [{ family: 'inet', local: '198.51.100.7' }] },
    { ifname: 'ens10', mtu: 1400, addr_info: [{ family: 'inet', local: '10.0.0.7' }, { family: 'inet6', local: 'fd00::7' }] },
  ]);
  const defaults = [JSON.stringify([{ dst: 'default', gateway: '198.51.100.1', dev: 'eth0' }]), ''];

  test('the link holding the node\'s address, not the default route\'s; 60 bytes for IPv4 endpoints, 80 otherwise', () => {
    assert.deepEqual(chooseUplinkMtu(links, defaults, ['10.0.0.7'], 'ipv4'), { link: 'ens10', linkMtu: 1400, tunnelMtu: 1340, how: 'node-address' });
    assert.equal(chooseUplinkMtu(links, defaults, ['10.0.0.7', 'fd00::7'], 'dualstack').tunnelMtu, 1320);
    assert.equal(chooseUplinkMtu(links, defaults, ['198.51.100.7'], 'ipv4').tunnelMtu, 1440);
    assert.equal(chooseUplinkMtu(links, defaults, ['198.51.100.7', '10.0.0.7'], 'dualstack').tunnelMtu, 1320, 'several: the smallest');
    assert.equal(chooseUplinkMtu(links, defaults, ['fd00::7'], 'ipv4').link, 'eth0', 'an IPv6 address does not decide for IPv4 endpoints');
  });

  test('addresses not on this host: the default route\'s link; nothing known: 1500 assumed; never below 1280', () => {
    assert.deepEqual(chooseUplinkMtu(links, defaults, ['203.0.113.5'], 'dualstack'), { link: 'eth0', linkMtu: 1500, tunnelMtu: 1420, how: 'default-route' });
    assert.deepEqual(chooseUplinkMtu('[]', ['', ''], [], 'dualstack'), { link: undefined, linkMtu: 1500, tunnelMtu: 1420, how: 'assumed' });
    const tiny = JSON.stringify([{ ifname: 'ppp0', mtu: 1300, addr_info: [{ local: '10.0.0.9' }] }]);
    assert.equal(chooseUplinkMtu(tiny, [], ['10.0.0.9'], 'ipv4').tunnelMtu, 1280);
    assert.throws(() => chooseUplinkMtu('{}', [], [], 'ipv4'), /expected a JSON array/);
  });
});
