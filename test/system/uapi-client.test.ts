/**
 * The UAPI client the agent drives data planes with, against real daemons: roamguard's and
 * Debian's wireguard-go. Both must come out of the agent's reconcile plans in the same state,
 * including wireguard-go builds that predate `allowed_ip=-prefix` removal.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import { UapiClient, UapiError } from '../../dataplane/uapi/uapi-client.ts';
import { newReconcileMemory, planReconcile } from '../../control/mesh/reconcile.ts';
import type { DesiredPeer } from '../../control/mesh/desired-peers.ts';
import { Scope } from './netns.ts';
import { requireDaemonPrerequisites, UserspaceWg, type Implementation } from './userspace-wg.ts';

const scope = new Scope();
before(async () => { await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go']); });
after(async () => { await scope.cleanup(); });

function peer(name: string, allowedIps: string[], endpoint = '192.0.2.9:51820'): DesiredPeer {
  const bytes = randomBytes(32);
  return { nodeName: name, publicKey: keyToBase64(bytes), publicKeyBytes: new Uint8Array(bytes), endpoint, allowedIps, persistentKeepalive: 25 };
}

for (const implementation of ['roamguard-node', 'wireguard-go'] as Implementation[]) {
  describe(`UAPI client against ${implementation}`, () => {
    test('get, set, errno errors, and reconcile plans converge (set differences or the replace fallback)', async () => {
      const ns = await scope.namespace();
      const daemon = await UserspaceWg.start(scope, ns, { implementation });
      const client = UapiClient.forInterface('/var/run/wireguard', daemon.ifname);
      assert.equal(await client.alive(), true);
      const privateKey = new Uint8Array(randomBytes(32));
      privateKey[0] &= 248; privateKey[31] = (privateKey[31] & 127) | 64;
      await client.set({ privateKey, listenPort: 0, replacePeers: false, peers: [] });
      assert.equal(keyToBase64((await client.get()).privateKey!), keyToBase64(privateKey));

      // A request the daemon refuses comes back as a UapiError with its errno.
      await assert.rejects(client.exchange('set=1\nbogus_key=1\n\n').then((text) => {
        const errno = Number(/errno=(-?\d+)/.exec(text)?.[1]);
        if (errno !== 0) throw new UapiError('refused', errno);
      }), (err: UapiError) => err.errno !== undefined && err.errno < 0);

      const canRemove = await client.supportsAllowedIpRemoval();
      // roamguard removes single prefixes; Debian's wireguard-go (0.0.20220316) predates that.
      assert.equal(canRemove, implementation === 'roamguard-node');
      assert.equal((await client.get()).peers.length, 0, 'the probe created no peer');

      const a = peer('a', ['10.244.1.0/24', '10.245.1.0/24']);
      const b = peer('b', ['10.244.2.0/24']);
      const memory = newReconcileMemory();
      const apply = async (desired: DesiredPeer[]) => {
        const plan = planReconcile(new Map(desired.map((p) => [p.publicKey, p])), await client.get(), memory, { collectGarbage: true, canRemoveAllowedIp: canRemove, nowWallMs: Date.now() });
        if (plan.request) await client.set(plan.request);
      };
      const state = async () => new Map((await client.get()).peers.map((p) => [keyToBase64(p.publicKey), { allowed: p.allowedIps.map(formatPrefix).sort(), endpoint: p.endpoint?.toString(), keepalive: p.persistentKeepalive }]));

      await apply([a, b]);
      let s = await state();
      assert.deepEqual(s.get(a.publicKey), { allowed: ['10.244.1.0/24', '10.245.1.0/24'], endpoint: '192.0.2.9:51820', keepalive: 25 });
      assert.deepEqual(s.get(b.publicKey)?.allowed, ['10.244.2.0/24']);

      // Remove one prefix from a, move b's prefix to a, then delete b.
      await apply([{ ...a, allowedIps: ['10.244.1.0/24', '10.244.2.0/24'] }, { ...b, allowedIps: [] }]);
      s = await state();
      assert.deepEqual(s.get(a.publicKey)?.allowed, ['10.244.1.0/24', '10.244.2.0/24']);
      assert.deepEqual(s.get(b.publicKey)?.allowed, []);
      await apply([{ ...a, allowedIps: ['10.244.1.0/24', '10.244.2.0/24'] }]);
      s = await state();
      assert.equal(s.size, 1);
      assert.equal(s.has(b.publicKey), false);
    });
  });
}
