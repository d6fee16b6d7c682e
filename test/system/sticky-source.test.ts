/**
 * Sticky source addresses, IPv4 and IPv6: A (roamguard) has two addresses on its one interface;
 * B (wireguard-go) is told to reach A at the second one, which is not the address the kernel
 * would pick as source towards B (IPv4: a secondary address; IPv6: a deprecated one, as an aged
 * temporary address is; the test checks this with `ip route get`). A answers from the address B
 * talks to, so B's view of A's endpoint stays the second address through handshake and traffic
 * both ways (without sticky sources B would see A roam to the first at once). Then the second
 * address is removed from A: A's next packets leave from the first (the kernel refuses the old
 * source; A clears it), B follows them there, and traffic goes on both ways.
 *
 * Needs root, iproute2, wireguard-tools, wireguard-go, iputils-ping and /dev/net/tun.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPair, joinHostPort, reapStale, Scope, waitFor } from './netns.ts';
import {
  assertPing, describeTunnel, INNER, PORT_A, requireDaemonPrerequisites, UserspaceWg,
} from './userspace-wg.ts';
import { generateKeyPair } from './wireguard-go.ts';

/** Per family: B's address, A's first (the kernel's pick) and second address, and how to add the second. */
const FAMILIES = {
  4: { b: '192.0.2.2', first: '192.0.2.1', second: '192.0.2.11', add: ['addr', 'add', '192.0.2.11/24'], del: ['addr', 'del', '192.0.2.11/24'] },
  6: {
    b: '2001:db8:77::2', first: '2001:db8:77::1', second: '2001:db8:77::11',
    // nodad: usable at once; preferred_lft 0: deprecated, so never the kernel's choice of source.
    add: ['-6', 'addr', 'add', '2001:db8:77::11/64', 'nodad', 'preferred_lft', '0'], del: ['-6', 'addr', 'del', '2001:db8:77::11/64'],
  },
} as const;

describe('daemon: sticky source addresses — replies leave from the address the peer talks to', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go']);
    await reapStale();
  });

  const scopes: Scope[] = [];
  after(async () => {
    for (const scope of scopes) await scope.cleanup();
  });

  for (const family of [4, 6] as const) {
    const f = FAMILIES[family];
    test(`IPv${family}: B talks to A's second address and keeps seeing it; once it is removed, traffic moves to the first`, { timeout: 90_000 }, async (tc) => {
      const scope = new Scope();
      scopes.push(scope);
      const topo = await createPair(scope);
      const a = topo.a, b = topo.b;
      const dev = topo.linkA.ifname;
      await a.ip([...f.add, 'dev', dev]);
      const route = await a.ip([...(family === 6 ? ['-6'] : []), 'route', 'get', f.b]);
      assert.match(route.stdout, new RegExp(`src ${f.first.replace(/\./g, '\\.')} `),
        `precondition: the kernel's own choice of source towards B is A's first address, not the second:\n${route.stdout}`);

      const [keysA, keysB] = await Promise.all([generateKeyPair(), generateKeyPair()]);
      const [wgA, wgB] = await Promise.all([
        UserspaceWg.start(scope, a, { implementation: 'roamguard-node' }),
        UserspaceWg.start(scope, b, { implementation: 'wireguard-go' }),
      ]);
      const t = { a: wgA, b: wgB };
      const ctx = () => describeTunnel(t);
      await wgA.configure({
        privateKey: keysA.privateKey, listenPort: PORT_A,
        peers: [{ publicKey: keysB.publicKey, allowedIps: [`${INNER.b.ipv4}/32`, `${INNER.b.ipv6}/128`] }],
      });
      const second = joinHostPort(f.second, PORT_A);
      const first = joinHostPort(f.first, PORT_A);
      await wgB.configure({
        privateKey: keysB.privateKey,
        peers: [{ publicKey: keysA.publicKey, endpoint: second, allowedIps: [`${INNER.a.ipv4}/32`, `${INNER.a.ipv6}/128`] }],
      });
      for (const [d, inner] of [[wgA, INNER.a], [wgB, INNER.b]] as const) {
        await d.addAddress(`${inner.ipv4}/24`);
        await d.addAddress(`${inner.ipv6}/64`);
        await d.up();
      }
      const endpointOfA = async () => (await wgB.peer(keysA.publicKey))?.endpoint;

      // B initiates (to the second address); traffic both ways; B's view of A stays the second address.
      await assertPing(b, INNER.a.ipv4, { count: 3 }, ctx());
      assert.equal(await endpointOfA(), second, `B's view of A after the handshake${ctx()}`);
      await assertPing(a, INNER.b.ipv4, { count: 10, intervalS: 0.05 }, ctx());
      await assertPing(b, INNER.a.ipv6, { count: 10, intervalS: 0.05 }, ctx());
      assert.equal(await endpointOfA(), second, `B's view of A after traffic both ways${ctx()}`);

      // The second address goes away: A's packets leave from the first, and B follows them there.
      await a.ip([...f.del, 'dev', dev]);
      const movedAt = Date.now();
      await assertPing(a, INNER.b.ipv4, { count: 3 }, ctx());
      const moved = await waitFor(async () => ((await endpointOfA()) === first ? first : undefined), 10_000,
        { description: `B to see A at its first address ${first}` });
      tc.diagnostic(`B's view of A: ${second} -> ${moved} ${Date.now() - movedAt} ms after the removal`);
      await assertPing(b, INNER.a.ipv4, { count: 3 }, ctx());
      await assertPing(a, INNER.b.ipv6, { count: 3 }, ctx());
      const dump = await wgA.peer(keysB.publicKey);
      assert.equal(dump?.endpoint, joinHostPort(f.b, (await wgB.dump()).listenPort), `A's view of B never changed${ctx()}`);
    });
  }
});
