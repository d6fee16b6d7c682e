/**
 * `roamguard status` without I/O: peer states, names from Node objects matched by public key,
 * roaming (the data plane's endpoint differs from the published one), peers a Node publishes but
 * the data plane lacks, the API being unreachable, and the table and JSON output.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { parsePrefix } from '../../dataplane/net/ip.ts';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot, PeerSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DeviceStats } from '../../dataplane/uapi/uapi-stats.ts';
import type { NodeObject } from '../../control/mesh/annotations.ts';
import { alignColumns, formatStatusJson, formatStatusTable } from '../../control/status/format.ts';
import { formatAge, formatBytes, handshakeExpected, peerState } from '../../control/status/peer-state.ts';
import { buildStatus, type StatusInput } from '../../control/status/status.ts';

const NOW = 1_800_000_000_000;
const OWN = keyToBase64(new Uint8Array(32).fill(9));
const K2 = keyToBase64(new Uint8Array(32).fill(2));
const K3 = keyToBase64(new Uint8Array(32).fill(3));
const K4 = keyToBase64(new Uint8Array(32).fill(4));
const K5 = keyToBase64(new Uint8Array(32).fill(5));

function node(name: string, key: string, ip: string, podCidr: string, extra: Record<string, string> = {}): NodeObject {
  return {
    metadata: { name, creationTimestamp: '2026-01-01T00:00:00Z', annotations: { 'roamguard.io/public-key': key, 'roamguard.io/listen-port': '51820', 'roamguard.io/pod-cidrs': JSON.stringify([podCidr]), ...extra } },
    spec: { podCIDRs: [podCidr] },
    status: { addresses: [{ type: 'InternalIP', address: ip }] },
  };
}

const NODES: NodeObject[] = [
  node('node-1', OWN, '10.0.0.1', '10.244.1.0/24'),
  node('node-2', K2, '10.0.0.2', '10.244.2.0/24'),
  node('node-3', K3, '10.0.0.3', '10.244.3.0/24'),
  node('node-4', K4, '10.0.0.4', '10.244.4.0/24'),
];

function peer(key: string, endpoint: string | undefined, lastHandshakeWallMs: number, allowed: string[]): PeerSnapshot {
  return {
    publicKey: Buffer.from(key, 'base64'), presharedKey: new Uint8Array(32), endpoint: endpoint ? Endpoint.parse(endpoint) : undefined,
    lastHandshakeWallMs, txBytes: 3 * 1024, rxBytes: 1.2 * 1024 * 1024, persistentKeepalive: 25, allowedIps: allowed.map((a) => parsePrefix(a)),
  };
}

const SNAPSHOT: DeviceSnapshot = {
  listenPort: 51820, fwmark: 0,
  peers: [
    peer(K2, '10.0.0.2:51820', NOW - 12_000, ['10.0.0.2/32', '10.244.2.0/24']),
    peer(K3, '203.0.113.9:40012', NOW - 200_000, ['10.244.3.0/24']),
    peer(K5, undefined, 0, []),
  ],
};

function input(overrides: Partial<StatusInput> = {}): StatusInput {
  return {
    interfaceName: 'roamguard0', snapshot: SNAPSHOT, publicKey: OWN, nodes: NODES, wgIpFamily: 'dualstack', defaultListenPort: 51820, nowWallMs: NOW, ...overrides,
  };
}

describe('peer state', () => {
  test('connected, handshaking, stale, no endpoint (with and without roamguard counters)', () => {
    const at = (ago: number) => (ago < 0 ? 0 : NOW - ago);
    assert.equal(peerState({ hasEndpoint: true, lastHandshakeWallMs: at(179_000) }, NOW), 'connected');
    assert.equal(peerState({ hasEndpoint: true, lastHandshakeWallMs: at(181_000) }, NOW), 'stale');
    assert.equal(peerState({ hasEndpoint: true, lastHandshakeWallMs: at(-1) }, NOW), 'handshaking', 'never, no counters');
    assert.equal(peerState({ hasEndpoint: true, lastHandshakeWallMs: at(-1), handshakePending: false }, NOW), 'stale', 'never, nothing in flight');
    assert.equal(peerState({ hasEndpoint: true, lastHandshakeWallMs: at(500_000), handshakePending: true }, NOW), 'handshaking');
    assert.equal(peerState({ hasEndpoint: false, lastHandshakeWallMs: at(-1) }, NOW), 'no endpoint');
    assert.equal(peerState({ hasEndpoint: false, lastHandshakeWallMs: at(1000) }, NOW), 'connected', 'a fresh session counts even without an endpoint');
    assert.equal(handshakeExpected({ persistentKeepalive: 25 }), true);
    assert.equal(handshakeExpected({ persistentKeepalive: 0 }), false);
    assert.equal(handshakeExpected({ persistentKeepalive: 0, stagedPackets: 2 }), true);
  });

  test('ages and byte counts', () => {
    assert.equal(formatAge(0, NOW), 'never');
    assert.equal(formatAge(NOW - 12_400, NOW), '12s ago');
    assert.equal(formatAge(NOW - 184_000, NOW), '3m 4s ago');
    assert.equal(formatAge(NOW - (2 * 3600 + 5 * 60) * 1000, NOW), '2h 5m ago');
    assert.equal(formatAge(NOW - (3 * 86400 + 3600) * 1000, NOW), '3d 1h ago');
    assert.equal(formatBytes(592), '592 B');
    assert.equal(formatBytes(3 * 1024), '3.00 KiB');
    assert.equal(formatBytes(1.2 * 1024 * 1024), '1.20 MiB');
  });
});

describe('buildStatus', () => {
  test('names by public key, roaming, not-configured peers, own node, rejected nodes', () => {
    const nodes = [...NODES, node('node-bad', K5, '10.0.0.5', '10.244.2.0/25')];
    const report = buildStatus(input({ nodes }));
    assert.equal(report.node, 'node-1');
    assert.equal(report.api.reachable, true);
    const byKey = new Map(report.peers.map((p) => [p.key, p]));
    const p2 = byKey.get(K2.slice(0, 8))!;
    assert.deepEqual([p2.node, p2.endpoint, p2.expectedEndpoint, p2.expectedSource, p2.roamed, p2.state], ['node-2', '10.0.0.2:51820', '10.0.0.2:51820', 'published', false, 'connected']);
    assert.deepEqual(p2.allowedIps, ['10.0.0.2/32', '10.244.2.0/24']);
    const p3 = byKey.get(K3.slice(0, 8))!;
    assert.deepEqual([p3.node, p3.expectedEndpoint, p3.roamed, p3.state], ['node-3', '10.0.0.3:51820', true, 'stale']);
    const p4 = byKey.get(K4.slice(0, 8))!;
    assert.deepEqual([p4.node, p4.state, p4.expectedEndpoint], ['node-4', 'not configured', '10.0.0.4:51820']);
    const p5 = byKey.get(K5.slice(0, 8))!;
    assert.deepEqual([p5.node, p5.state], ['node-bad', 'no endpoint'], 'a rejected node still names its key');
    assert.deepEqual(report.rejected.map((r) => r.node), ['node-bad']);
    assert.deepEqual(report.peers.map((p) => p.node), ['node-2', 'node-3', 'node-4', 'node-bad']);
  });

  test('a forced endpoint, or one other nodes discovered behind NAT, is the expected one: not "roamed"', () => {
    const forced = NODES.map((n) => (n.metadata?.name === 'node-3' ? node('node-3', K3, '10.0.0.3', '10.244.3.0/24', { 'roamguard.io/force-endpoint': '203.0.113.9:40012' }) : n));
    const p3 = buildStatus(input({ nodes: forced })).peers.find((p) => p.node === 'node-3')!;
    assert.deepEqual([p3.roamed, p3.expectedSource], [false, 'forced']);
    // node-2 sees node-3 at the NAT's address: every node then expects node-3 there.
    const discovered = NODES.map((n) => (n.metadata?.name === 'node-2'
      ? node('node-2', K2, '10.0.0.2', '10.244.2.0/24', { 'roamguard.io/discovered-endpoints': JSON.stringify({ [K3]: '203.0.113.9:40012' }) }) : n));
    const seen = buildStatus(input({ nodes: discovered })).peers.find((p) => p.node === 'node-3')!;
    assert.deepEqual([seen.roamed, seen.expectedEndpoint, seen.expectedSource], [false, '203.0.113.9:40012', 'discovered']);
  });

  test('API unreachable: every name is "-", nothing is "not configured", and the reason is kept', () => {
    const report = buildStatus(input({ nodes: undefined, apiError: 'connect ECONNREFUSED 127.0.0.1:6443' }));
    assert.deepEqual(report.api, { reachable: false, error: 'connect ECONNREFUSED 127.0.0.1:6443' });
    assert.deepEqual(report.peers.map((p) => p.node), ['-', '-', '-']);
    assert.ok(report.peers.every((p) => !p.roamed && p.state !== 'not configured'));
    assert.equal(report.node, null);
  });

  test('roamguard counters refine the state and are reported', () => {
    const stats: DeviceStats = {
      version: 1, workerThreads: 0, workerQueueDepth: 0, drops: { 'bad-mac1': 2, replay: 0 },
      peers: [{ publicKey: Buffer.from(K3, 'base64'), rxBytes: 0, txBytes: 0, handshakeAttempts: 6, handshakeFailures: 5, handshakesCompleted: 1, handshakePending: true, endpointChanges: 3, stagedPackets: 0 }],
    };
    const report = buildStatus(input({ stats }));
    const p3 = report.peers.find((p) => p.node === 'node-3')!;
    assert.equal(p3.state, 'handshaking');
    assert.deepEqual(p3.counters, { handshakeAttempts: 6, handshakeFailures: 5, handshakesCompleted: 1, endpointChanges: 3 });
    assert.deepEqual(report.drops, { 'bad-mac1': 2 });
    assert.equal(report.countersAvailable, true);
  });
});

describe('status output', () => {
  test('the table: header, aligned columns, roamed marker, notes', () => {
    const text = formatStatusTable(buildStatus(input()), NOW);
    const lines = text.trimEnd().split('\n');
    assert.equal(lines[0], `interface roamguard0 · node node-1 · key ${OWN.slice(0, 8)} · port 51820 · 4 peers`);
    assert.equal(lines[1], 'NODE    KEY       ENDPOINT                    ALLOWED IPS                HANDSHAKE   TRANSFER                  STATE');
    assert.equal(lines[2], `node-2  ${K2.slice(0, 8)}  10.0.0.2:51820              10.0.0.2/32,10.244.2.0/24  12s ago     rx 1.20 MiB, tx 3.00 KiB  connected`);
    assert.equal(lines[3], `node-3  ${K3.slice(0, 8)}  203.0.113.9:40012 (roamed)  10.244.3.0/24              3m 20s ago  rx 1.20 MiB, tx 3.00 KiB  stale`);
    assert.equal(lines[4], `node-4  ${K4.slice(0, 8)}  (none)                      10.0.0.4/32,10.244.4.0/24  -           -                         not configured`);
    assert.equal(lines[5], `-       ${K5.slice(0, 8)}  (none)                      (none)                     never       rx 1.20 MiB, tx 3.00 KiB  no endpoint`);
    // Every row's STATE starts in the same column as the header's.
    const column = lines[1].indexOf('STATE');
    for (const line of lines.slice(2, 6)) assert.match(line.slice(column), /^(connected|stale|not configured|no endpoint)$/, line);
    assert.ok(text.includes(`node-3 ${K3.slice(0, 8)}: 10.0.0.3:51820 (published)`), 'the expected endpoint of a roamed peer');
    assert.ok(!text.includes(K2), 'only short keys in the table');
  });

  test('with the routes readable: each peer\'s path MTU (its routes\' MTU, else the tunnel\'s) in a PATH MTU column', () => {
    const report = buildStatus(input({ routes: { tunnelMtu: 1420, own: [{ dst: '10.244.2.0/24', mtu: 1216 }, { dst: '10.244.3.0/24' }] } }));
    assert.equal(report.tunnelMtu, 1420);
    assert.deepEqual(report.peers.map((p) => [p.node, p.pathMtu]), [['node-2', 1216], ['node-3', 1420], ['node-4', undefined], ['-', 1420]]);
    const lines = formatStatusTable(report, NOW).split('\n');
    assert.match(lines[1], /ALLOWED IPS +PATH MTU +HANDSHAKE/);
    assert.match(lines[2], /10\.244\.2\.0\/24 +1216 \(path\) +12s ago/);
    assert.match(lines[3], /10\.244\.3\.0\/24 +1420 +3m 20s ago/);
  });

  test('the table without the API says why names are missing', () => {
    const text = formatStatusTable(buildStatus(input({ nodes: undefined, apiError: 'no answer' })), NOW);
    assert.match(text, /node names unavailable: cannot read Nodes from the API server \(no answer\)/);
    assert.match(text.split('\n')[2], /^- {2}/);
  });

  test('JSON for scripts: full public keys, endpoints, states, ISO times', () => {
    const parsed = JSON.parse(formatStatusJson(buildStatus(input())));
    assert.equal(parsed.interface, 'roamguard0');
    assert.equal(parsed.peers[0].publicKey, K2);
    assert.equal(parsed.peers[0].lastHandshake, new Date(NOW - 12_000).toISOString());
    assert.equal(parsed.peers[1].roamed, true);
    assert.equal(parsed.peers[2].lastHandshake, null);
    assert.deepEqual(Object.keys(parsed).sort(), ['api', 'countersAvailable', 'drops', 'interface', 'listenPort', 'node', 'peers', 'publicKey', 'rejected']);
  });

  test('alignColumns pads all but the last column', () => {
    assert.deepEqual(alignColumns([['a', 'bb', 'c'], ['ddd', 'e', 'ffff']]), ['a    bb  c', 'ddd  e   ffff']);
  });
});

describe('relayed peers', () => {
  test('a peer sent to at its relay port shows as "relay via NODE", not as roamed', () => {
    // node-2 is a public relay (203.0.113.2) that allocated ports for (this node, node-4).
    const pair = OWN < K4 ? `${OWN},${K4}` : `${K4},${OWN}`;
    const ours = OWN < K4 ? 51900 : 51901;
    const nodes = [
      node('node-1', OWN, '192.168.1.1', '10.244.1.0/24'),
      node('node-2', K2, '203.0.113.2', '10.244.2.0/24', { 'roamguard.io/relay-allocations': JSON.stringify({ [pair]: [51900, 51901] }) }),
      node('node-4', K4, '192.168.4.4', '10.244.4.0/24'),
    ];
    const snapshot: DeviceSnapshot = { listenPort: 51820, fwmark: 0, peers: [
      peer(K2, '203.0.113.2:51820', NOW - 3000, ['10.244.2.0/24']),
      peer(K4, `203.0.113.2:${ours}`, NOW - 3000, ['10.244.4.0/24']),
    ] };
    const report = buildStatus(input({ nodes, snapshot }));
    const relayed = report.peers.find((p) => p.node === 'node-4')!;
    assert.equal(relayed.relayVia, 'node-2');
    assert.equal(relayed.roamed, false);
    assert.equal(report.peers.find((p) => p.node === 'node-2')!.relayVia, null);
    assert.match(formatStatusTable(report, NOW), new RegExp(`node-4 .*203\\.0\\.113\\.2:${ours} \\(relay via node-2\\)`));
    // The other member's port is not ours: a data plane sending there is not "our" relay path.
    const wrong = buildStatus(input({ nodes, snapshot: { ...snapshot, peers: [peer(K4, `203.0.113.2:${ours === 51900 ? 51901 : 51900}`, NOW, [])] } }));
    assert.equal(wrong.peers[0].relayVia, null);
  });
});
