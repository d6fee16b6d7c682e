/**
 * Interop: roamguard's protocol core against Debian's wireguard-go, over real UDP between two
 * network namespaces.
 *
 *   namespace A: core-driver.ts (WireGuardCore + node:dgram, no TUN), inner 10.77.0.1 / fd77::1
 *   namespace B: wireguard-go with its TUN, configured with `wg`, inner 10.77.0.2 / fd77::2
 *
 * For outer IPv4 and outer IPv6 endpoints:
 *   (a) our core initiates; echo requests we craft reach B's kernel through wireguard-go and the
 *       kernel's replies come back decrypted through our core, for inner IPv4 and IPv6;
 *   (b) wireguard-go initiates (B pings our inner addresses); the driver answers the echo requests,
 *       and B's ping gets its replies;
 *   (c) `wg show B dump` shows our endpoint and a recent handshake; our core reports one too.
 *
 * Needs root, iproute2, wireguard-tools, wireguard-go, iputils-ping and /dev/net/tun.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPair, joinHostPort, reapStale, requireRoot, Scope, type PairTopology } from './netns.ts';
import { isEchoReplyTo, fromHex, toHex } from './packets.ts';
import { generateKeyPair, type KeyPair, WireGuardGo } from './wireguard-go.ts';
import { CoreDriver, type DriverEvent } from './core-driver.ts';

const INNER_A = { ipv4: '10.77.0.1', ipv6: 'fd77::1' };
const INNER_B = { ipv4: '10.77.0.2', ipv6: 'fd77::2' };
const PORT_B = 51821;
const TEST_TIMEOUT_MS = 90_000;

interface Setup {
  scope: Scope;
  topo: PairTopology;
  keysA: KeyPair;
  keysB: KeyPair;
  driver: CoreDriver;
  wgB: WireGuardGo;
  /** Our core's outer endpoint as B sees it. */
  ourEndpoint: string;
}

/**
 * Namespaces A and B, wireguard-go in B (with or without our endpoint configured) and the core
 * driver in A (knowing B's endpoint), for outer family `outer`.
 */
async function setup(scope: Scope, outer: 4 | 6, bKnowsOurEndpoint: boolean): Promise<Setup> {
  const topo = await createPair(scope);
  const outerA = outer === 4 ? topo.linkA.ipv4 : topo.linkA.ipv6;
  const outerB = outer === 4 ? topo.linkB.ipv4 : topo.linkB.ipv6;
  const keysA = await generateKeyPair();
  const keysB = await generateKeyPair();

  const driver = await CoreDriver.start(scope, topo.a, {
    privateKey: keysA.privateKey,
    bind: { address: outerA, port: 0 },
    peers: [{
      publicKey: keysB.publicKey,
      endpoint: joinHostPort(outerB, PORT_B),
      allowedIps: [`${INNER_B.ipv4}/32`, `${INNER_B.ipv6}/128`],
    }],
    localAddresses: [INNER_A.ipv4, INNER_A.ipv6],
  });
  assert.equal(driver.publicKey, keysA.publicKey, 'the core derives the same public key as `wg pubkey`');
  assert.ok(driver.port > 0);
  const ourEndpoint = joinHostPort(outerA, driver.port);

  const wgB = await WireGuardGo.start(scope, topo.b);
  await wgB.configure({
    privateKey: keysB.privateKey,
    listenPort: PORT_B,
    peers: [{
      publicKey: keysA.publicKey,
      allowedIps: [`${INNER_A.ipv4}/32`, `${INNER_A.ipv6}/128`],
      ...(bKnowsOurEndpoint ? { endpoint: ourEndpoint } : {}),
    }],
  });
  await wgB.addAddress(`${INNER_B.ipv4}/24`);
  await wgB.addAddress(`${INNER_B.ipv6}/64`);
  await wgB.up();
  return { scope, topo, keysA, keysB, driver, wgB, ourEndpoint };
}

/** (c): B's view of us, and ours of B. */
async function assertHandshakeRecorded(s: Setup): Promise<void> {
  const dump = await s.wgB.dump();
  assert.equal(dump.peers.length, 1);
  const peer = dump.peers[0];
  assert.equal(peer.publicKey, s.keysA.publicKey);
  assert.equal(peer.endpoint, s.ourEndpoint, `wg show dump endpoint: ${JSON.stringify(peer)}`);
  const ageS = Date.now() / 1000 - peer.latestHandshake;
  assert.ok(peer.latestHandshake > 0 && ageS < 60 && ageS > -5, `recent handshake in wg show dump: ${JSON.stringify(peer)}`);
  assert.ok(peer.rxBytes > 0 && peer.txBytes > 0, `traffic counted by wireguard-go: ${JSON.stringify(peer)}`);

  const state = await s.driver.state();
  const ours = state.peers[0];
  assert.equal(ours.publicKey, s.keysB.publicKey);
  assert.equal(ours.hasSession, true, `our session: ${JSON.stringify(state)}`);
  assert.ok(Math.abs(Date.now() - ours.lastHandshakeWallMs) < 60_000, `our handshake time: ${JSON.stringify(ours)}`);
  assert.ok(ours.txBytes > 0 && ours.rxBytes > 0, `our counters: ${JSON.stringify(ours)}`);
}

function diagnostics(s: Setup): string {
  return `\n${s.driver.process.describe()}\n${s.wgB.describe()}`;
}

describe('interop: roamguard core <-> wireguard-go', () => {
  before(async () => {
    await requireRoot({ binaries: ['wg', 'wireguard-go', 'ping'], tun: true });
    await reapStale();
  });

  const scopes: Scope[] = [];
  after(async () => {
    for (const scope of scopes) await scope.cleanup();
  });

  for (const outer of [4, 6] as const) {
    test(`outer IPv${outer}: our core initiates; crafted echo requests are answered by B's kernel`, { timeout: TEST_TIMEOUT_MS }, async () => {
      const scope = new Scope();
      scopes.push(scope);
      const s = await setup(scope, outer, false);
      try {
        const mark = s.driver.events.length;
        await s.driver.request({ cmd: 'initiate' });
        await s.driver.waitForEvent((e) => e.event === 'handshake', 10_000, 'the handshake with wireguard-go', mark);

        let seq = 0;
        for (const [src, dst] of [[INNER_A.ipv4, INNER_B.ipv4], [INNER_A.ipv6, INNER_B.ipv6]] as const) {
          const payload = new TextEncoder().encode(`roamguard interop ${src} -> ${dst}`);
          const ident = 0x5200 + outer;
          seq++;
          const since = s.driver.events.length;
          await s.driver.request({ cmd: 'ping', src, dst, ident, seq, payload: toHex(payload) });
          const reply = await s.driver.waitForEvent<Extract<DriverEvent, { event: 'delivered' }>>(
            (e) => e.event === 'delivered' && e.echo?.kind === 'reply' && e.echo.seq === seq,
            10_000, `the echo reply from ${dst} (seq ${seq})`, since,
          );
          assert.equal(reply.peer, s.keysB.publicKey);
          assert.ok(isEchoReplyTo(fromHex(reply.packet), { src, dst, id: ident, seq, payload }),
            `reply matches the request: ${JSON.stringify(reply.echo)}`);
          assert.equal(reply.echo?.checksumsOk, true);
        }
        await assertHandshakeRecorded(s);
        assert.deepEqual(s.driver.events.filter((e) => e.event === 'error'), []);
      } catch (err) {
        (err as Error).message += diagnostics(s);
        throw err;
      }
    });

    test(`outer IPv${outer}: wireguard-go initiates; B's ping is answered through our core`, { timeout: TEST_TIMEOUT_MS }, async () => {
      const scope = new Scope();
      scopes.push(scope);
      const s = await setup(scope, outer, true);
      try {
        for (const dst of [INNER_A.ipv4, INNER_A.ipv6]) {
          const since = s.driver.events.length;
          const ping = await s.topo.b.exec('ping', ['-c', '3', '-W', '1', dst], { allowFailure: true, timeoutMs: 20_000 });
          assert.equal(ping.code, 0, `ping ${dst} from B:\n${ping.stdout}${ping.stderr}`);
          assert.match(ping.stdout, /[1-3] received/);
          const answered = s.driver.events.slice(since).filter((e) => e.event === 'echo-answered');
          assert.ok(answered.length >= 1, `the driver answered echo requests to ${dst}`);
        }
        // wireguard-go sent the initiation: our core was the responder.
        const state = await s.driver.state();
        assert.equal(state.peers[0].endpoint, joinHostPort(outer === 4 ? s.topo.linkB.ipv4 : s.topo.linkB.ipv6, PORT_B));
        await assertHandshakeRecorded(s);
        assert.deepEqual(s.driver.events.filter((e) => e.event === 'error'), []);
      } catch (err) {
        (err as Error).message += diagnostics(s);
        throw err;
      }
    });
  }
});
