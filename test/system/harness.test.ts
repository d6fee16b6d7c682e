/**
 * Self-test of the system-test harness: two namespaces joined by a veth, Debian's wireguard-go
 * on both sides configured only with `wg`, ping across the tunnel over inner IPv4 and IPv6, with
 * outer IPv4 and outer IPv6 endpoints. Proves netns.ts / wireguard-go.ts work before roamguard's
 * own implementation is plugged in, and that cleanup leaves nothing behind.
 *
 * Needs root, iproute2, wireguard-tools, wireguard-go, iputils-ping and /dev/net/tun: their absence
 * fails the test (the test command installs them).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { createPair, joinHostPort, ownNamespaces, reapStale, requireRoot, Scope } from './netns.ts';
import { generateKeyPair, WireGuardGo } from './wireguard-go.ts';

const INNER = {
  a: { ipv4: '10.77.0.1', ipv6: 'fd77::1' },
  b: { ipv4: '10.77.0.2', ipv6: 'fd77::2' },
};
const PORT_A = 51820;
const PORT_B = 51821;

describe('system harness: wireguard-go <-> wireguard-go across namespaces', () => {
  before(async () => {
    await requireRoot({ binaries: ['wg', 'wireguard-go', 'ping'], tun: true });
    await reapStale();
  });

  // Safety net in case a test failed before its own cleanup: never leaves anything behind.
  const scopes: Scope[] = [];
  after(async () => {
    for (const scope of scopes) await scope.cleanup();
  });

  for (const outer of [4, 6] as const) {
    test(`outer IPv${outer}: ping over the tunnel with inner IPv4 and IPv6`, async () => {
      const scope = new Scope();
      scopes.push(scope);
      const { a, b, linkA, linkB } = await createPair(scope);
      const outerA = outer === 4 ? linkA.ipv4 : linkA.ipv6;
      const outerB = outer === 4 ? linkB.ipv4 : linkB.ipv6;

      const keysA = await generateKeyPair();
      const keysB = await generateKeyPair();
      const wgA = await WireGuardGo.start(scope, a);
      const wgB = await WireGuardGo.start(scope, b);
      assert.notEqual(wgA.ifname, wgB.ifname);

      await wgA.configure({
        privateKey: keysA.privateKey,
        listenPort: PORT_A,
        peers: [{
          publicKey: keysB.publicKey,
          allowedIps: [`${INNER.b.ipv4}/32`, `${INNER.b.ipv6}/128`],
          endpoint: joinHostPort(outerB, PORT_B),
        }],
      });
      await wgB.configure({
        privateKey: keysB.privateKey,
        listenPort: PORT_B,
        peers: [{ publicKey: keysA.publicKey, allowedIps: [`${INNER.a.ipv4}/32`, `${INNER.a.ipv6}/128`] }],
      });
      for (const [wg, inner] of [[wgA, INNER.a], [wgB, INNER.b]] as const) {
        await wg.addAddress(`${inner.ipv4}/24`);
        await wg.addAddress(`${inner.ipv6}/64`);
        await wg.up();
      }

      const before = await wgA.dump();
      assert.equal(before.publicKey, keysA.publicKey);
      assert.equal(before.listenPort, PORT_A);
      assert.equal(before.peers.length, 1);
      assert.equal(before.peers[0].publicKey, keysB.publicKey);
      assert.equal(before.peers[0].latestHandshake, 0, 'no handshake before any traffic');
      assert.deepEqual(before.peers[0].allowedIps.sort(), [`${INNER.b.ipv4}/32`, `${INNER.b.ipv6}/128`].sort());

      // A initiates (it knows B's endpoint); then B pings back over the established session.
      for (const [from, to] of [[a, INNER.b], [b, INNER.a]] as const) {
        for (const dst of [to.ipv4, to.ipv6]) {
          const ping = await from.exec('ping', ['-c', '3', '-i', '0.2', '-W', '2', dst], { allowFailure: true, timeoutMs: 20_000 });
          assert.equal(ping.code, 0, `ping ${dst} from ${from.name} failed:\n${ping.stdout}${ping.stderr}\n${wgA.describe()}\n${wgB.describe()}`);
        }
      }

      const now = Date.now() / 1000;
      const dumpA = await wgA.dump();
      const dumpB = await wgB.dump();
      const peerOfA = dumpA.peers[0];
      const peerOfB = dumpB.peers[0];
      assert.equal(peerOfB.publicKey, keysA.publicKey);
      for (const peer of [peerOfA, peerOfB]) {
        assert.ok(peer.latestHandshake > 0 && Math.abs(now - peer.latestHandshake) < 60, `recent handshake: ${JSON.stringify(peer)}`);
        assert.ok(peer.rxBytes > 0 && peer.txBytes > 0, `traffic counted: ${JSON.stringify(peer)}`);
      }
      assert.equal(peerOfA.endpoint, joinHostPort(outerB, PORT_B));
      // B learned A's endpoint from the authenticated initiation.
      assert.equal(peerOfB.endpoint, joinHostPort(outerA, PORT_A));

      // Teardown leaves nothing: no namespace, no process, no control socket.
      const sockets = [wgA.socketPath, wgB.socketPath];
      const problems = await scope.cleanup();
      assert.deepEqual(problems, []);
      assert.deepEqual(await scope.cleanup(), [], 'cleanup is idempotent');
      assert.deepEqual(await ownNamespaces(), []);
      for (const path of sockets) assert.equal(existsSync(path), false, `${path} removed`);
      for (const proc of [wgA.process, wgB.process]) assert.equal(proc.running, false, `${proc.label} stopped`);
    });
  }
});
