/**
 * wg-quick with roamguard as its userspace implementation, against wireguard-go.
 *
 * This kernel has no WireGuard module, so Debian's wg-quick, after `ip link add IF type wireguard`
 * fails, runs `$WG_QUICK_USERSPACE_IMPLEMENTATION IF` (here bin/roamguard-wg, which runs
 * `roamguard wg IF`: it detaches and returns once the interface and control socket exist), then
 * configures it with `wg setconf`, adds addresses, sets the MTU and routes. `wg-quick down`
 * deletes the interface, and the daemon must then exit and remove its socket.
 *
 *   namespace A: `ip netns exec A wg-quick up|down DIR/IF.conf` (file mode 0600, IF unique)
 *   namespace B: wireguard-go configured with `wg`
 *
 * AllowedIPs are host routes of the peer's inner addresses, so wg-quick does no default-route
 * handling (no fwmark rules, nft tables or sysctl), and there is no DNS line (no resolvconf).
 *
 * Needs root, iproute2, wireguard-tools (wg, wg-quick), wireguard-go, iputils-ping, ss and
 * /dev/net/tun.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createPair, joinHostPort, reapStale, Scope, uniqueName, waitFor, WG_SOCKET_DIR } from './netns.ts';
import { generateKeyPair } from './wireguard-go.ts';
import {
  assertPing, commandLine, INNER, isAlive, killAtCleanup, PORT_A, PORT_B, requireDaemonPrerequisites, ROAMGUARD_WG_BIN,
  socketOwnerPids, UserspaceWg,
} from './userspace-wg.ts';

describe('daemon: wg-quick up/down with WG_QUICK_USERSPACE_IMPLEMENTATION=roamguard-wg', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go'], ['wg-quick', 'bash']);
    await reapStale();
  });

  const scopes: Scope[] = [];
  after(async () => {
    for (const scope of scopes) await scope.cleanup();
  });

  test('up: tunnel to wireguard-go works and wg show has the config; down: interface, socket and daemon gone', { timeout: 90_000 }, async () => {
    const scope = new Scope();
    scopes.push(scope);
    const topo = await createPair(scope);
    const [keysA, keysB] = await Promise.all([generateKeyPair(), generateKeyPair()]);
    const endpointA = joinHostPort(topo.linkA.ipv4, PORT_A);
    const endpointB = joinHostPort(topo.linkB.ipv4, PORT_B);

    const peerB = await UserspaceWg.start(scope, topo.b, { implementation: 'wireguard-go' });
    await peerB.configure({
      privateKey: keysB.privateKey,
      listenPort: PORT_B,
      peers: [{ publicKey: keysA.publicKey, endpoint: endpointA, allowedIps: [`${INNER.a.ipv4}/32`, `${INNER.a.ipv6}/128`] }],
    });
    await peerB.addAddress(`${INNER.b.ipv4}/24`);
    await peerB.addAddress(`${INNER.b.ipv6}/64`);
    await peerB.up();

    const ifname = uniqueName('rgq');
    const socketPath = join(WG_SOCKET_DIR, `${ifname}.sock`);
    scope.removeFileAtCleanup(socketPath); // runs last: after the daemon is stopped
    const dir = scope.tempDir('roamguard-wg-quick-');
    const conf = join(dir, `${ifname}.conf`);
    writeFileSync(conf, [
      '[Interface]',
      `PrivateKey = ${keysA.privateKey}`,
      `ListenPort = ${PORT_A}`,
      `Address = ${INNER.a.ipv4}/24, ${INNER.a.ipv6}/64`,
      '',
      '[Peer]',
      `PublicKey = ${keysB.publicKey}`,
      `Endpoint = ${endpointB}`,
      `AllowedIPs = ${INNER.b.ipv4}/32, ${INNER.b.ipv6}/128`,
      '',
    ].join('\n'), { mode: 0o600 });
    assert.equal(statSync(conf).mode & 0o777, 0o600);

    // LOG_LEVEL=silent: a logging daemon would keep wg-quick's output pipes (like wireguard-go).
    const env = { WG_QUICK_USERSPACE_IMPLEMENTATION: ROAMGUARD_WG_BIN, LOG_LEVEL: 'silent' };
    const up = await topo.a.exec('wg-quick', ['up', conf], { env, timeoutMs: 45_000, allowFailure: true });
    const upLog = `${up.stderr}${up.stdout}`;
    // Whatever happens next, the detached daemon is stopped by its pid at cleanup.
    const pids = await socketOwnerPids(topo.a, ifname);
    for (const pid of pids) killAtCleanup(scope, pid, new RegExp(`\\bwg\\b.*\\b${ifname}\\b`));
    assert.equal(up.code, 0, `wg-quick up failed:\n${upLog}`);
    assert.ok(upLog.includes(`${ROAMGUARD_WG_BIN} ${ifname}`), `wg-quick ran our userspace implementation:\n${upLog}`);

    assert.equal(pids.length, 1, `one process serves ${socketPath}: ${JSON.stringify(pids)}`);
    const pid = pids[0];
    const cmd = commandLine(pid) ?? '';
    assert.match(cmd, /(roamguard\.ts|launch\.mjs) wg --foreground/, `the detached daemon's command line: ${cmd}`);
    assert.ok(cmd.endsWith(ifname), `the daemon serves ${ifname}: ${cmd}`);

    // The config as wg shows it, and the link as wg-quick set it up.
    const dump = (await topo.a.exec('wg', ['show', ifname, 'dump'])).stdout.trim().split('\n').map((l) => l.split('\t'));
    assert.equal(dump[0][0], keysA.privateKey, 'private key');
    assert.equal(dump[0][1], keysA.publicKey, 'public key');
    assert.equal(dump[0][2], String(PORT_A), 'listen port');
    assert.equal(dump.length, 2, `one peer: ${JSON.stringify(dump)}`);
    assert.equal(dump[1][0], keysB.publicKey);
    assert.equal(dump[1][2], endpointB);
    assert.deepEqual(dump[1][3].split(',').sort(), [`${INNER.b.ipv4}/32`, `${INNER.b.ipv6}/128`].sort());
    const link = (await topo.a.ip(['-o', 'link', 'show', 'dev', ifname])).stdout;
    assert.match(link, /\bUP\b/, `wg-quick brought ${ifname} up: ${link}`);
    assert.match(link, /mtu 1420\b/, `wg-quick set the MTU (veth 1500 - 80): ${link}`);
    const addrs = (await topo.a.ip(['-o', 'addr', 'show', 'dev', ifname])).stdout;
    assert.ok(addrs.includes(`${INNER.a.ipv4}/24`) && addrs.includes(`${INNER.a.ipv6}/64`), `addresses: ${addrs}`);

    const ctx = `\nwg-quick up:\n${upLog}\n${peerB.describe()}`;
    await assertPing(topo.a, INNER.b.ipv4, { count: 3 }, ctx);
    await assertPing(topo.a, INNER.b.ipv6, { count: 3 }, ctx);
    await assertPing(topo.b, INNER.a.ipv4, { count: 3 }, ctx);
    const shown = (await topo.a.exec('wg', ['show', ifname])).stdout;
    assert.match(shown, /latest handshake: (Now|.*ago)/, `wg show reports a handshake:\n${shown}`);
    assert.match(shown, /transfer: .*received, .*sent/, `wg show reports transfer:\n${shown}`);

    const down = await topo.a.exec('wg-quick', ['down', conf], { env, timeoutMs: 30_000, allowFailure: true });
    assert.equal(down.code, 0, `wg-quick down failed:\n${down.stderr}${down.stdout}`);
    const gone = await topo.a.ip(['link', 'show', 'dev', ifname], { allowFailure: true });
    assert.notEqual(gone.code, 0, `${ifname} is deleted by wg-quick down`);
    await waitFor(() => !existsSync(socketPath) && !isAlive(pid), 10_000, {
      description: `the daemon (pid ${pid}) to exit and remove ${socketPath} after wg-quick down`,
    });
    const listed = (await topo.a.exec('wg', ['show', 'interfaces'])).stdout;
    assert.ok(!listed.split(/\s+/).includes(ifname), `wg no longer lists ${ifname}: ${listed}`);
  });
});
