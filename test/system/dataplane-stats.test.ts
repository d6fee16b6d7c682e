/**
 * The data plane's counters (`get=roamguard-stats` on the control socket) against real daemons:
 * A is `roamguard wg`, B is Debian's wireguard-go, configured with `wg`, over a namespace pair.
 *
 * - A answers the counters: a completed handshake, bytes, a roam when B changes its port, drops.
 * - B (wireguard-go) does not know the operation: the client reports "not supported" and B keeps
 *   serving `get=1` (its process is unaffected).
 * - `wg show` works as before and lists exactly the tunnel's interfaces: the counters add no
 *   socket (a second `*.sock` in /var/run/wireguard would appear as a bogus interface).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import { UapiClient } from '../../dataplane/uapi/uapi-client.ts';
import { createPair, run, Scope, waitFor, WG_SOCKET_DIR } from './netns.ts';
import { assertPing, describeTunnel, INNER, requireDaemonPrerequisites, startTunnel, type Tunnel } from './userspace-wg.ts';

const ROAMGUARD = fileURLToPath(new URL('../../bin/roamguard', import.meta.url));
const scope = new Scope();
let tunnel: Tunnel;

before(async () => {
  await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go']);
  const topo = await createPair(scope);
  tunnel = await startTunnel(scope, topo, { a: { implementation: 'roamguard-node', threads: 1 }, b: { implementation: 'wireguard-go' } });
});
after(async () => { await scope.cleanup(); });

describe('data plane counters over the control socket', { timeout: 120_000 }, () => {
  test('roamguard answers its counters: handshake, bytes, a roam, every drop reason', async () => {
    await assertPing(tunnel.a.ns, INNER.b.ipv4, { count: 2, deadlineS: 10 }, `A → B${describeTunnel(tunnel)}`);
    const client = UapiClient.forInterface(WG_SOCKET_DIR, tunnel.a.ifname);
    const stats = await client.stats();
    assert.ok(stats, 'roamguard answers get=roamguard-stats');
    assert.equal(stats.version, 1);
    assert.equal(stats.workerThreads, 1);
    assert.equal(stats.workerQueueDepth, undefined, 'no crypto pool, no queue to report');
    // The watchdog's counters (dataplane/watchdog.ts): a healthy daemon has seen no stall.
    assert.equal(stats.pipelineStalls, 0);
    assert.equal(stats.pipelineStalledMs, 0);
    assert.equal(stats.workerRestarts, undefined);
    assert.equal(stats.tunQueueReads?.length, 1, '--threads 1: one TUN queue');
    assert.ok('keypair-retired' in stats.drops && 'zero-key' in stats.drops, 'every reason, zeros included');
    assert.ok('bad-mac1' in stats.drops && 'replay' in stats.drops && 'no-route' in stats.drops && 'allowed-ips-mismatch' in stats.drops, JSON.stringify(stats.drops));
    assert.equal(stats.peers.length, 1);
    const peer = stats.peers[0];
    assert.equal(keyToBase64(peer.publicKey), tunnel.keysB.publicKey);
    assert.equal(peer.handshakesCompleted, 1);
    assert.equal(peer.handshakeAttempts, 1, 'A initiated (it sent the first ping)');
    assert.equal(peer.handshakeFailures, 0);
    assert.equal(peer.endpointChanges, 0);
    const dump = await tunnel.a.peer(tunnel.keysB.publicKey);
    assert.ok(peer.rxBytes > 0 && peer.txBytes > 0);
    assert.ok(Math.abs(peer.rxBytes - dump!.rxBytes) < 1000, `stats rx ${peer.rxBytes} ≈ wg show rx ${dump!.rxBytes}`);

    // B moves to another UDP port: A learns the new endpoint from B's next authenticated packet.
    await tunnel.b.wg(['set', tunnel.b.ifname, 'listen-port', '51899']);
    await assertPing(tunnel.b.ns, INNER.a.ipv4, { count: 1, deadlineS: 10 }, 'B → A from its new port');
    await waitFor(async () => (await client.stats())!.peers[0].endpointChanges === 1, 5000, { description: 'the roam counted' });
    assert.match((await tunnel.a.peer(tunnel.keysB.publicKey))!.endpoint ?? '', /:51899$/);

    // A datagram with a bad MAC to A's port is dropped and counted under its reason.
    const before = (await client.stats())!.drops['bad-mac1'];
    const junk = `const s=require('node:dgram').createSocket('udp4');const b=Buffer.alloc(148);b[0]=1;s.send(b,51820,${JSON.stringify(tunnel.topo.linkA.ipv4)},()=>s.close());`;
    await tunnel.b.ns.exec(process.execPath, ['-e', junk]);
    await waitFor(async () => (await client.stats())!.drops['bad-mac1'] === before + 1, 5000, { description: 'the bad-mac1 drop counted' });
  });

  test('A answers idle pings from the thread that received them: the replies are counted in tun_replies_read', async () => {
    // After a quiet spell the UDP reader, having written B's echo request to the TUN, reads the
    // kernel's reply itself (dataplane/tun/reply-reader.ts). Should the wiring stop handing it the
    // queue, the replies would still flow, through the queue's thread: only this count notices.
    const client = UapiClient.forInterface(WG_SOCKET_DIR, tunnel.a.ifname);
    const before = (await client.stats())!;
    const pings = 40;
    await assertPing(tunnel.b.ns, INNER.a.ipv4, { count: pings, intervalS: 0.02, deadlineS: 20 }, `B → A${describeTunnel(tunnel)}`);
    const after = (await client.stats())!;
    assert.equal(after.tunRepliesRead?.length, 1, 'one count per TUN queue');
    const replies = after.tunRepliesRead![0] - before.tunRepliesRead![0];
    const reads = after.tunQueueReads![0] - before.tunQueueReads![0];
    assert.ok(replies <= reads, `${replies} replies read by the UDP reader, of ${reads} packets read from the queue`);
    // The queue's thread, woken by the same reply, races the UDP reader to it and wins now and
    // then: about 1 in 20 with roamguard pinging, 2 in 5 with wireguard-go (whose scheduler keeps
    // a CPU awake, so the queue's thread wakes sooner). Without the wiring none are read here.
    assert.ok(replies >= pings / 4, `${replies} of ${pings} echo replies read by the UDP reader (${reads} packets read from the queue)`);
  });

  test('wireguard-go does not know the operation: "not supported", and it keeps serving get=1', async () => {
    const client = UapiClient.forInterface(WG_SOCKET_DIR, tunnel.b.ifname);
    assert.equal(await client.stats(), undefined);
    const snapshot = await client.get();
    assert.equal(keyToBase64(snapshot.peers[0].publicKey), tunnel.keysA.publicKey);
    assert.ok(tunnel.b.process.running, 'wireguard-go still runs');
  });

  test('the liveness probe (`roamguard health`, deploy/roamguard.yaml) passes against the running daemon and fails without one', async () => {
    const probe = (ifname: string) => new Promise<number>((resolve) => {
      execFile(ROAMGUARD, ['health', '--max-stall', '10', ifname], { env: { ...process.env, WG_SOCKET_DIR }, timeout: 30_000 }, (err) => {
        resolve(err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1);
      });
    });
    assert.equal(await probe(tunnel.a.ifname), 0, 'a healthy roamguard daemon');
    assert.equal(await probe(tunnel.b.ifname), 0, 'wireguard-go: judged by its answer');
    assert.equal(await probe('rgt-nothing'), 1, 'no daemon');
  });

  test('`wg show` works unchanged and lists no extra interface', async () => {
    const interfaces = (await run('wg', ['show', 'interfaces'])).stdout.trim().split(/\s+/);
    assert.ok(interfaces.includes(tunnel.a.ifname) && interfaces.includes(tunnel.b.ifname), interfaces.join(' '));
    assert.equal(interfaces.filter((name) => name.startsWith(tunnel.a.ifname)).length, 1, `only ${tunnel.a.ifname} itself: ${interfaces.join(' ')}`);
    const ours = readdirSync(WG_SOCKET_DIR).filter((f) => f.startsWith(tunnel.a.ifname));
    assert.deepEqual(ours, [`${tunnel.a.ifname}.sock`], 'one socket per interface');
    const dump = await tunnel.a.dump();
    assert.equal(dump.listenPort, 51820);
    assert.equal(dump.peers[0].publicKey, tunnel.keysB.publicKey);
    const shown = (await tunnel.a.wg(['show', tunnel.a.ifname])).stdout;
    assert.match(shown, /latest handshake: (Now|.* ago)/);
    assert.match(shown, /transfer: .* received, .* sent/);
  });
});
