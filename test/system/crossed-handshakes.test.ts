/**
 * Two handshake initiations that cross: each side starts a handshake at the same moment, so each
 * initiation is sent before the other arrives (crossing-relay.ts holds the first until the second
 * comes, then sends both on). A key rotation provokes exactly this: the rotating node's kick and
 * the peer's handshake to its new key (control/agent/key-rotation.ts).
 *
 * wireguard-go and the kernel let the peer's initiation overwrite their own, then each drops the
 * other's response and both wait REKEY_TIMEOUT (5 s) for a retry: the control pair shows it. A
 * roamguard side keeps its own initiation while it answers the peer's (Handshake.
 * setAsideOwnInitiation), so the handshake completes at once, whichever implementation the other
 * side runs.
 *
 * Needs root, iproute2, wireguard-tools, iputils-ping, /dev/net/tun and Debian's wireguard-go
 * (the modern build beside the checkout when it is there).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { createPair, reapStale, Scope, waitFor } from './netns.ts';
import {
  assertPing, describeTunnel, hasWireGuardGoModern, INNER, PORT_A, PORT_B, requireDaemonPrerequisites, startTunnel,
  type Implementation, type Tunnel,
} from './userspace-wg.ts';

const RELAY_PATH = fileURLToPath(new URL('./crossing-relay.ts', import.meta.url));
const FRONT_A_PORT = 41001;
const FRONT_B_PORT = 41002;

/** Seconds from both sides' initiations to a handshake on both sides, through the crossing relay. */
async function crossedHandshakeSeconds(scope: Scope, a: Implementation, b: Implementation): Promise<{ seconds: number; tunnel: Tunnel }> {
  const topo = await createPair(scope);
  const tunnel = await startTunnel(scope, topo, { a: { implementation: a }, b: { implementation: b } });
  // The relay lives in A's namespace: A reaches it on loopback, B on A's link address.
  const relay = scope.spawn(topo.a, process.execPath, ['--import', 'tsx', RELAY_PATH,
    `127.0.0.1:${FRONT_A_PORT}`, `${topo.linkA.ipv4}:${FRONT_B_PORT}`, `127.0.0.1:${PORT_A}`, `${topo.linkB.ipv4}:${PORT_B}`,
  ], { label: 'crossing relay' });
  await waitFor(() => relay.stdout.includes('ready') || !relay.running, 20_000, { description: 'the crossing relay to listen' });
  assert.ok(relay.running, relay.describe());
  await tunnel.a.wg(['set', tunnel.a.ifname, 'peer', tunnel.keysB.publicKey, 'endpoint', `127.0.0.1:${FRONT_A_PORT}`]);
  await tunnel.b.wg(['set', tunnel.b.ifname, 'peer', tunnel.keysA.publicKey, 'endpoint', `${topo.linkA.ipv4}:${FRONT_B_PORT}`]);

  // Turning keepalive on sends one at once: with no session yet, a handshake initiation.
  const started = performance.now();
  await Promise.all([
    tunnel.a.wg(['set', tunnel.a.ifname, 'peer', tunnel.keysB.publicKey, 'persistent-keepalive', '1']),
    tunnel.b.wg(['set', tunnel.b.ifname, 'peer', tunnel.keysA.publicKey, 'persistent-keepalive', '1']),
  ]);
  await waitFor(async () => {
    const [pa, pb] = await Promise.all([tunnel.a.peer(tunnel.keysB.publicKey), tunnel.b.peer(tunnel.keysA.publicKey)]);
    return (pa?.latestHandshake ?? 0) > 0 && (pb?.latestHandshake ?? 0) > 0;
  }, 15_000, { description: `a handshake on both sides (${a} and ${b})`, intervalMs: 20 });
  const seconds = (performance.now() - started) / 1000;
  assert.match(relay.stdout, /crossed/, `the relay made the two initiations cross\n${relay.describe()}`);
  return { seconds, tunnel };
}

describe('crossed handshake initiations', { timeout: 180_000 }, () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'roamguard-bun', 'wireguard-go']);
    await reapStale();
  });
  const scopes: Scope[] = [];
  after(async () => { for (const scope of scopes) await scope.cleanup(); });

  test('control: two wireguard-go daemons wait for a retry (REKEY_TIMEOUT, 5 s)', async (t) => {
    // wireguard-go hands handshake messages to several goroutines, so now and then one side takes
    // the other's response before its initiation and escapes the stall (once in about five runs:
    // 0.02 s). The control shows the stall in at most three crossings.
    const took: string[] = [];
    for (let attempt = 1; attempt <= 3; attempt++) {
      const scope = new Scope();
      scopes.push(scope);
      const { seconds } = await crossedHandshakeSeconds(scope, 'wireguard-go', 'wireguard-go');
      await scope.cleanup();
      took.push(`${seconds.toFixed(2)} s`);
      t.diagnostic(`wireguard-go ↔ wireguard-go, crossing ${attempt}: handshake on both sides after ${seconds.toFixed(2)} s`);
      if (seconds >= 4) return;
    }
    assert.fail(`the crossing costs wireguard-go a retry timer; it took ${took.join(', ')}`);
  });

  const pairs: Array<[Implementation, Implementation]> = [
    ['roamguard-node', 'wireguard-go'],
    ['wireguard-go', 'roamguard-bun'],
    ['roamguard-node', 'roamguard-bun'],
  ];
  if (hasWireGuardGoModern()) pairs.push(['roamguard-node', 'wireguard-go-modern']);
  for (const [a, b] of pairs) {
    test(`${a} ↔ ${b}: the handshake completes at once, and traffic flows both ways`, async (t) => {
      const scope = new Scope();
      scopes.push(scope);
      const { seconds, tunnel } = await crossedHandshakeSeconds(scope, a, b);
      t.diagnostic(`${a} ↔ ${b}: handshake on both sides after ${seconds.toFixed(2)} s`);
      assert.ok(seconds < 2, `no retry timer waited for: ${seconds.toFixed(2)} s${describeTunnel(tunnel)}`);
      await assertPing(tunnel.topo.a, INNER.b.ipv4, { count: 2, deadlineS: 5 }, 'A → B');
      await assertPing(tunnel.topo.b, INNER.a.ipv4, { count: 2, deadlineS: 5 }, 'B → A');
      await scope.cleanup();
    });
  }
});
