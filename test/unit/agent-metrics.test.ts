/**
 * The agent's metrics and health endpoints (control/metrics/) against a fake AgentStatusSource
 * and a fake data plane: every series, labels (node and short key, never a whole key), peers
 * that stay down, data planes without counters, and /healthz and /readyz over real HTTP.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import type { DeviceSnapshot, PeerSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DeviceStats } from '../../dataplane/uapi/uapi-stats.ts';
import type { MeshState } from '../../control/mesh/desired-peers.ts';
import { AgentMetrics, METRIC_HELP } from '../../control/metrics/metrics.ts';
import { parseListenAddress, startMetricsServer, type MetricsServer } from '../../control/metrics/server.ts';
import type { AgentStatusSource, DataplaneReader, InformerView } from '../../control/metrics/status-source.ts';
import { newCounters } from '../../control/relay/forward-core.ts';

const NOW = 1_800_000_000_000;
const KEY_1 = new Uint8Array(32).fill(1);
const KEY_2 = new Uint8Array(32).fill(2);
const KEY_3 = new Uint8Array(32).fill(3);
const B64 = [KEY_1, KEY_2, KEY_3].map(keyToBase64);

function peer(publicKey: Uint8Array, overrides: Partial<PeerSnapshot> = {}): PeerSnapshot {
  return {
    publicKey, presharedKey: new Uint8Array(32), endpoint: new Endpoint('192.0.2.1', 51820), lastHandshakeWallMs: NOW - 10_000,
    txBytes: 1000, rxBytes: 2000, persistentKeepalive: 25, allowedIps: [], ...overrides,
  };
}

class FakeDataplane implements DataplaneReader {
  snapshot: DeviceSnapshot = {
    listenPort: 51820, fwmark: 0,
    peers: [
      peer(KEY_1),
      peer(KEY_2, { lastHandshakeWallMs: 0, rxBytes: 0, txBytes: 148 }),
      peer(KEY_3, { endpoint: undefined, lastHandshakeWallMs: 0, rxBytes: 0, txBytes: 0, persistentKeepalive: 0 }),
    ],
  };
  counters: DeviceStats | undefined = {
    version: 1, workerThreads: 2, workerQueueDepth: 5,
    drops: { 'bad-mac1': 3, replay: 1, 'no-route': 0, 'allowed-ips-mismatch': 7 },
    peers: [
      { publicKey: KEY_1, rxBytes: 2000, txBytes: 1000, handshakeAttempts: 4, handshakesCompleted: 3, handshakeFailures: 1, handshakePending: false, endpointChanges: 2, stagedPackets: 0 },
      { publicKey: KEY_2, rxBytes: 0, txBytes: 148, handshakeAttempts: 9, handshakesCompleted: 0, handshakeFailures: 8, handshakePending: true, endpointChanges: 0, stagedPackets: 1 },
    ],
  };
  failGet = false;
  async get(): Promise<DeviceSnapshot> {
    if (this.failGet) throw new Error('connect ENOENT /var/run/wireguard/x.sock');
    return this.snapshot;
  }
  async stats(): Promise<DeviceStats | undefined> {
    return this.counters;
  }
}

function mesh(): MeshState {
  const desired = (key: string, nodeName: string) => ({ nodeName, publicKey: key, publicKeyBytes: new Uint8Array(32), allowedIps: [], persistentKeepalive: 25 });
  return {
    peers: new Map([[B64[0], desired(B64[0], 'node-2')], [B64[1], desired(B64[1], 'node-3')]]),
    rejected: [{ node: 'node-9', reason: 'bad' }], waiting: ['node-7', 'node-8'], clusterPodCidrs: [], tunnelRoutes: [],
  };
}

class FakeSource implements AgentStatusSource {
  nodeName = 'node-1';
  state: AgentStatusSource['state'] = 'running';
  ready = true;
  lastMesh: MeshState | undefined = mesh();
  reconciles = 10;
  reconcileErrors = 2;
  reconcileDurationMsTotal = 1500;
  lastReconcileDurationMs: number | undefined = 120;
  informer: InformerView | undefined = { state: 'synced', synced: true, restarts: 1 };
  dataplane: FakeDataplane | undefined = new FakeDataplane();
}

/** `name{labels} value` lines of the exposition as a map. */
function series(text: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    out.set(line.slice(0, at), line.slice(at + 1));
  }
  return out;
}

describe('agent metrics', () => {
  test('path MTU: the tunnel\'s, probes tried, and each probed peer\'s learned path MTU (node and short key)', async () => {
    const source = Object.assign(new FakeSource(), {
      tunnelMtu: 1420, pathMtuProbes: 9,
      pathMtus: new Map([[B64[0], { mtu: 1216 }], [B64[1], { mtu: undefined }]]),
    });
    const s = series(await new AgentMetrics(source, { defaultMetrics: false, now: () => NOW }).scrape());
    assert.equal(s.get('roamguard_tunnel_mtu_bytes'), '1420');
    assert.equal(s.get('roamguard_path_mtu_probes_total'), '9');
    assert.equal(s.get(`roamguard_peer_path_mtu_bytes{node="node-2",key="${B64[0].slice(0, 8)}"}`), '1216');
    assert.ok(![...s.keys()].some((k) => k.startsWith('roamguard_peer_path_mtu_bytes{node="node-3"')), 'not probed yet: no series');
  });

  test('agent, informer, reconcile and mesh series', async () => {
    const metrics = new AgentMetrics(new FakeSource(), { defaultMetrics: false, now: () => NOW });
    const s = series(await metrics.scrape());
    assert.equal(s.get('roamguard_agent_ready'), '1');
    assert.equal(s.get('roamguard_agent_state{state="running"}'), '1');
    assert.equal(s.get('roamguard_agent_state{state="starting"}'), '0');
    assert.equal(s.get('roamguard_informer_synced'), '1');
    assert.equal(s.get('roamguard_informer_state{state="synced"}'), '1');
    assert.equal(s.get('roamguard_informer_restarts_total'), '1');
    assert.equal(s.get('roamguard_reconcile_duration_seconds_sum'), '1.5');
    assert.equal(s.get('roamguard_reconcile_duration_seconds_count'), '12');
    assert.equal(s.get('roamguard_reconcile_last_duration_seconds'), '0.12');
    assert.equal(s.get('roamguard_reconciles_total'), '10');
    assert.equal(s.get('roamguard_reconcile_errors_total'), '2');
    assert.equal(s.get('roamguard_mesh_peers'), '2');
    assert.equal(s.get('roamguard_mesh_rejected_nodes'), '1');
    assert.equal(s.get('roamguard_mesh_waiting_nodes'), '2');
  });

  test('data plane and per-peer series, labelled by node and short key', async () => {
    const metrics = new AgentMetrics(new FakeSource(), { defaultMetrics: false, now: () => NOW });
    const text = await metrics.scrape();
    const s = series(text);
    const p1 = `node="node-2",key="${B64[0].slice(0, 8)}"`;
    const p2 = `node="node-3",key="${B64[1].slice(0, 8)}"`;
    const p3 = `node="",key="${B64[2].slice(0, 8)}"`;
    assert.equal(s.get('roamguard_dataplane_up'), '1');
    assert.equal(s.get('roamguard_dataplane_counters_available'), '1');
    assert.equal(s.get('roamguard_dataplane_peers'), '3');
    assert.equal(s.get('roamguard_dataplane_dropped_packets_total{reason="bad-mac1"}'), '3');
    assert.equal(s.get('roamguard_dataplane_dropped_packets_total{reason="allowed-ips-mismatch"}'), '7');
    assert.equal(s.get('roamguard_dataplane_dropped_packets_total{reason="no-route"}'), '0');
    assert.equal(s.get('roamguard_dataplane_worker_threads'), '2');
    assert.equal(s.get('roamguard_dataplane_worker_queue_depth'), undefined, 'no crypto pool: no queue depth series');
    assert.equal(s.get(`roamguard_peer_receive_bytes_total{${p1}}`), '2000');
    assert.equal(s.get(`roamguard_peer_transmit_bytes_total{${p1}}`), '1000');
    assert.equal(s.get(`roamguard_peer_last_handshake_age_seconds{${p1}}`), '10');
    assert.equal(s.get(`roamguard_peer_last_handshake_timestamp_seconds{${p1}}`), String((NOW - 10_000) / 1000));
    assert.equal(s.get(`roamguard_peer_last_handshake_age_seconds{${p2}}`), '+Inf');
    assert.equal(s.get(`roamguard_peer_endpoint_changes_total{${p1}}`), '2');
    assert.equal(s.get(`roamguard_peer_handshake_attempts_total{${p2}}`), '9');
    assert.equal(s.get(`roamguard_peer_handshake_failures_total{${p2}}`), '8');
    assert.equal(s.get(`roamguard_peer_handshakes_total{${p1}}`), '3');
    assert.equal(s.get(`roamguard_peer_state{${p1},state="connected"}`), '1');
    assert.equal(s.get(`roamguard_peer_state{${p2},state="handshaking"}`), '1');
    assert.equal(s.get(`roamguard_peer_state{${p3},state="no endpoint"}`), '1');
    assert.equal(s.get(`roamguard_peer_state{${p3},state="connected"}`), '0');
    for (const key of B64) assert.ok(!text.includes(key), 'no whole key in the exposition');
    for (const name of Object.keys(METRIC_HELP)) assert.match(text, new RegExp(`# HELP ${name} `), name);
  });

  test('without the agent\'s view, a peer expected to handshake counts as unreachable once it stayed down for the grace period', async () => {
    let now = NOW;
    const metrics = new AgentMetrics(new FakeSource(), { defaultMetrics: false, now: () => now, monotonicMs: () => now, unreachableAfterMs: 30_000 });
    const p2 = `node="node-3",key="${B64[1].slice(0, 8)}"`;
    const p3 = `node="",key="${B64[2].slice(0, 8)}"`;
    let s = series(await metrics.scrape());
    assert.equal(s.get('roamguard_peers_unreachable'), '0', 'just seen: within the grace period');
    now += 31_000;
    s = series(await metrics.scrape());
    assert.equal(s.get(`roamguard_peer_unreachable{${p2}}`), '1', 'keepalive on, no handshake for 31 s');
    assert.equal(s.get(`roamguard_peer_unreachable{${p3}}`), '0', 'no keepalive and nothing waiting: not expected');
    assert.equal(s.get('roamguard_peers_unreachable'), '1');
  });

  test('the agent\'s own list of unreachable peers is what the metrics report, when it has one', async () => {
    const source = new FakeSource();
    const agentView = new Set([B64[0]]);
    (source as { unreachable?: ReadonlySet<string> }).unreachable = agentView;
    const metrics = new AgentMetrics(source, { defaultMetrics: false, now: () => NOW, unreachableAfterMs: 0 });
    const s = series(await metrics.scrape());
    assert.equal(s.get(`roamguard_peer_unreachable{node="node-2",key="${B64[0].slice(0, 8)}"}`), '1');
    assert.equal(s.get(`roamguard_peer_unreachable{node="node-3",key="${B64[1].slice(0, 8)}"}`), '0', 'not in the agent\'s list');
    assert.equal(s.get('roamguard_peers_unreachable'), '1');
  });

  test('without roamguard counters (wireguard-go) the get series remain; a dead data plane is dataplane_up 0', async () => {
    const source = new FakeSource();
    source.dataplane!.counters = undefined;
    let monotonic = 0;
    const metrics = new AgentMetrics(source, { defaultMetrics: false, now: () => NOW, monotonicMs: () => monotonic });
    let s = series(await metrics.scrape());
    assert.equal(s.get('roamguard_dataplane_counters_available'), '0');
    assert.equal(s.get(`roamguard_peer_receive_bytes_total{node="node-2",key="${B64[0].slice(0, 8)}"}`), '2000');
    assert.ok(![...s.keys()].some((k) => k.startsWith('roamguard_peer_handshake_attempts_total{')));
    assert.ok(![...s.keys()].some((k) => k.startsWith('roamguard_dataplane_dropped_packets_total{')));
    assert.equal(s.get(`roamguard_peer_state{node="node-3",key="${B64[1].slice(0, 8)}",state="handshaking"}`), '1', 'never handshaked, no counters');

    source.dataplane!.failGet = true;
    monotonic += 1000; // past the scrape cache
    s = series(await metrics.scrape());
    assert.equal(s.get('roamguard_dataplane_up'), '0');
    assert.ok(![...s.keys()].some((k) => k.startsWith('roamguard_peer_')), 'old peer series are gone');
  });

  test('relayed peers carry the relay\'s name; a relay reports its pairs\' forwarding counters', async () => {
    const source = new FakeSource();
    const m = mesh();
    m.peers.set(B64[1], { ...m.peers.get(B64[1])!, endpointSource: 'relay', relayVia: 'cloud-1' });
    source.lastMesh = m;
    const counters = newCounters();
    counters.datagrams = [10, 12];
    counters.bytes = [1000, 1500];
    counters.dropped['unknown-source'] = 3;
    const relaySource = Object.assign(source, { relayCounters: () => new Map([['node-2,node-3', counters]]) });
    const s = series(await new AgentMetrics(relaySource, { defaultMetrics: false, now: () => NOW }).scrape());
    assert.equal(s.get(`roamguard_peer_relayed{node="node-3",key="${B64[1].slice(0, 8)}",via="cloud-1"}`), '1');
    assert.equal([...s.keys()].filter((k) => k.startsWith('roamguard_peer_relayed')).length, 1, 'direct peers have no series');
    assert.equal(s.get('roamguard_relay_pairs'), '1');
    assert.equal(s.get('roamguard_relay_forwarded_datagrams_total{pair="node-2,node-3"}'), '22');
    assert.equal(s.get('roamguard_relay_forwarded_bytes_total{pair="node-2,node-3"}'), '2500');
    assert.equal(s.get('roamguard_relay_dropped_datagrams_total{pair="node-2,node-3",reason="unknown-source"}'), '3');
  });

  test('listen addresses', () => {
    assert.deepEqual(parseListenAddress(':9474'), { host: undefined, port: 9474 });
    assert.deepEqual(parseListenAddress('127.0.0.1:0'), { host: '127.0.0.1', port: 0 });
    assert.deepEqual(parseListenAddress('[::1]:9474'), { host: '::1', port: 9474 });
    assert.deepEqual(parseListenAddress('localhost:80'), { host: 'localhost', port: 80 });
    for (const bad of ['9474', ':99999', '::1:9474', 'a b:1', '']) assert.throws(() => parseListenAddress(bad), /listen address/, bad);
  });
});

function get(port: number, path: string): Promise<{ status: number; body: string; type: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, method: 'GET' }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, type: String(res.headers['content-type']) }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('metrics server', () => {
  const source = new FakeSource();
  let server: MetricsServer;
  after(async () => { await server?.close(); });

  test('/metrics, /healthz and /readyz over HTTP', async () => {
    source.ready = false;
    source.informer = { state: 'starting', synced: false, restarts: 0 };
    server = await startMetricsServer({ address: '127.0.0.1:0', source, now: () => NOW });
    assert.ok(server.port > 0);
    const metrics = await get(server.port, '/metrics');
    assert.equal(metrics.status, 200);
    assert.match(metrics.type, /^text\/plain; version=0\.0\.4/);
    assert.match(metrics.body, /^roamguard_agent_ready 0$/m);
    assert.match(metrics.body, /^process_cpu_seconds_total /m, 'the default process metrics');

    assert.equal((await get(server.port, '/healthz')).status, 200);
    const notReady = await get(server.port, '/readyz');
    assert.equal(notReady.status, 503);
    assert.match(notReady.body, /Node list is not synced/);
    source.informer = { state: 'synced', synced: true, restarts: 0 };
    assert.match((await get(server.port, '/readyz')).body, /tunnel is not configured/);
    source.ready = true;
    assert.equal((await get(server.port, '/readyz')).status, 200);
    source.state = 'stopped';
    assert.equal((await get(server.port, '/healthz')).status, 503);
    assert.equal((await get(server.port, '/nope')).status, 404);
  });
});
