/**
 * The agent's Prometheus metrics (prom-client). Everything is read at scrape time from an
 * {@link AgentStatusSource}: the agent's own state, and the data plane through its control socket
 * — `get=1` (per-peer bytes, handshake time, endpoint: every UAPI data plane) and roamguard's
 * `get=roamguard-stats` (drops by reason, handshake attempts and failures, roams, worker queue:
 * dataplane/uapi/uapi-stats.ts; absent for wireguard-go, whose series are then simply missing).
 *
 * Per-peer series are labelled `node` (the Node that publishes the key; empty for a peer no Node
 * claims) and `key` (the public key's first 8 base64 characters): never a whole key.
 * Counters that come from the data plane restart from zero when it restarts or re-adds a peer;
 * Prometheus' rate() handles that as a counter reset.
 *
 * A scrape costs the data plane two control-socket queries, and the endpoint listens on every
 * address: so scrapes share one reading. While a reading runs, every scrape waits for it; after
 * it settled, its result (text or error) answers every scrape for `cacheMs` (default 1 s). However
 * many scrapes arrive, the data plane sees at most one reading in flight and at most one started
 * per `cacheMs` plus the time a reading takes.
 */
import { Counter, Gauge, Registry, collectDefaultMetrics, type Metric } from 'prom-client';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DeviceStats, PeerStats } from '../../dataplane/uapi/uapi-stats.ts';
import { PEER_STATES, UNREACHABLE_AFTER_MS, handshakeExpected, peerState } from '../status/peer-state.ts';
import type { AgentStatusSource } from './status-source.ts';
import type { PairCounters } from '../relay/forward-core.ts';

const PEER = ['node', 'key'] as const;
const AGENT_STATES = ['starting', 'running', 'stopped'] as const;
const INFORMER_STATES = ['starting', 'synced', 'error', 'stopped'] as const;

export interface AgentMetricsOptions {
  /** Also the process and Node.js runtime metrics of prom-client (default true). */
  defaultMetrics?: boolean;
  now?: () => number;
  /** A handshake-expecting peer not connected for this long counts as unreachable. */
  unreachableAfterMs?: number;
  /** How long a settled reading answers later scrapes (default {@link SCRAPE_CACHE_MS}). */
  cacheMs?: number;
  /** The monotonic clock the cache runs on, in ms (default performance.now). */
  monotonicMs?: () => number;
}

/** Scrapes within this long after a reading settled get that reading: at most ~1 reading/s. */
export const SCRAPE_CACHE_MS = 1000;

/** One reading of agent and data plane, rendered; shared by every scrape that asks meanwhile. */
interface Reading {
  text: Promise<string>;
  /** Monotonic ms when it settled; undefined while it runs. */
  settledAt: number | undefined;
}

/** What one scrape read from the data plane. */
export interface DataplaneReading {
  snapshot?: DeviceSnapshot;
  stats?: DeviceStats;
  error?: string;
}

/** The metric names, for the README and the tests. */
export const METRIC_HELP: Record<string, string> = {
  roamguard_agent_ready: '1 once the Node informer synced and the tunnel is configured (what /readyz answers)',
  roamguard_agent_state: 'the agent\'s lifecycle state (1 for the current one)',
  roamguard_informer_synced: '1 when the Node informer has a complete list',
  roamguard_informer_state: 'the Node informer\'s state (1 for the current one)',
  roamguard_informer_restarts_total: 'Node watches restarted after an error',
  roamguard_reconcile_duration_seconds: 'duration of reconcile passes (successful and failed): _sum and _count',
  roamguard_reconcile_last_duration_seconds: 'duration of the last reconcile pass',
  roamguard_reconciles_total: 'reconcile passes that succeeded',
  roamguard_reconcile_errors_total: 'reconcile passes that failed (retried on the next pass)',
  roamguard_mesh_peers: 'peers in the desired mesh (Nodes with usable annotations)',
  roamguard_mesh_rejected_nodes: 'Nodes left out because their annotations are not usable',
  roamguard_mesh_waiting_nodes: 'Nodes without a roamguard public key yet',
  roamguard_mesh_refused_claims_total: 'claims of Nodes refused (a pod CIDR or node address the cluster did not give that node), each counted once while it lasts',
  roamguard_route_conflicts_total: 'pod CIDR routes not installed because a route that is not the agent\'s goes there (never replaced)',
  roamguard_own_annotations_restored_total: 'annotations of this Node put back after someone else changed them',
  roamguard_tunnel_mtu_bytes: 'MTU of the tunnel interface (WG_MTU, or the uplink\'s less WireGuard\'s overhead)',
  roamguard_path_mtu_probes_total: 'DF-set probe packets sizes tried to learn peers\' path MTUs',
  roamguard_peer_path_mtu_bytes: 'largest packet that reaches the peer through the tunnel and back, as last probed (set on the routes to its pod CIDRs when below the tunnel MTU)',
  roamguard_peers_unreachable: 'peers without a working session (as the agent logs them: no first handshake within three keepalive periods, or none for 180 s + keepalive)',
  roamguard_dataplane_up: '1 when the data plane answers on its control socket',
  roamguard_dataplane_counters_available: '1 when the data plane answers roamguard\'s counters (0 for wireguard-go)',
  roamguard_dataplane_peers: 'peers configured in the data plane',
  roamguard_dataplane_dropped_packets_total: 'packets the data plane dropped, by reason',
  roamguard_dataplane_worker_threads: 'threads of the data plane that seal (its TUN readers, one per queue; 0 = main thread)',
  roamguard_peer_receive_bytes_total: 'bytes received from the peer (as wg show reports)',
  roamguard_peer_transmit_bytes_total: 'bytes sent to the peer (as wg show reports)',
  roamguard_peer_last_handshake_timestamp_seconds: 'Unix time of the last completed handshake (0 = never)',
  roamguard_peer_last_handshake_age_seconds: 'seconds since the last completed handshake (+Inf = never)',
  roamguard_peer_endpoint_changes_total: 'endpoint changes because the peer roamed (NAT rebinding, new address)',
  roamguard_peer_handshake_attempts_total: 'handshake initiations sent to the peer',
  roamguard_peer_handshake_failures_total: 'handshake initiations the peer did not answer',
  roamguard_peer_handshakes_total: 'handshakes completed with the peer',
  roamguard_peer_state: 'the peer\'s state: connected, handshaking, stale, no endpoint (1 for the current one)',
  roamguard_peer_unreachable: '1 when the peer has no working session (see roamguard_peers_unreachable)',
  roamguard_peer_relayed: '1 when the peer is reached through a relay node (label via: that node)',
  roamguard_relay_pairs: 'pairs of nodes this node relays now',
  roamguard_relay_forwarded_datagrams_total: 'datagrams this node relayed for a pair (label pair: the two nodes)',
  roamguard_relay_forwarded_bytes_total: 'bytes this node relayed for a pair',
  roamguard_relay_dropped_datagrams_total: 'datagrams this node did not relay for a pair, by reason',
  roamguard_relay_probes_total: 'liveness probes this node sent to relays through the tunnel while a peer needed a relay',
  roamguard_metrics_refused_connections_total: 'connections to this endpoint closed at accept because it already had its maximum (a scrape flood)',
};

export class AgentMetrics {
  readonly registry = new Registry();
  private readonly now: () => number;
  private readonly unreachableAfterMs: number;
  /** Base64 key → since when (wall ms) the peer has not been connected. */
  private readonly notConnectedSince = new Map<string, number>();
  private readonly cacheMs: number;
  private readonly monotonicMs: () => number;
  private latest: Reading | undefined;

  private readonly gauges = new Map<string, Gauge<string>>();
  private readonly counters = new Map<string, Counter<string>>();
  /** Kept by the server, not read from the source: outside the maps update() resets. */
  private readonly refusedConnections: Counter<string>;

  constructor(private readonly source: AgentStatusSource, options: AgentMetricsOptions = {}) {
    this.now = options.now ?? Date.now;
    this.unreachableAfterMs = options.unreachableAfterMs ?? UNREACHABLE_AFTER_MS;
    this.cacheMs = options.cacheMs ?? SCRAPE_CACHE_MS;
    this.monotonicMs = options.monotonicMs ?? (() => performance.now());
    const gauge = (name: string, labelNames: readonly string[] = []) => {
      this.gauges.set(name, new Gauge({ name, help: METRIC_HELP[name], labelNames: [...labelNames], registers: [this.registry] }));
    };
    const counter = (name: string, labelNames: readonly string[] = []) => {
      this.counters.set(name, new Counter({ name, help: METRIC_HELP[name], labelNames: [...labelNames], registers: [this.registry] }));
    };
    gauge('roamguard_agent_ready');
    gauge('roamguard_agent_state', ['state']);
    gauge('roamguard_informer_synced');
    gauge('roamguard_informer_state', ['state']);
    counter('roamguard_informer_restarts_total');
    this.registry.registerMetric(this.reconcileSummary());
    gauge('roamguard_reconcile_last_duration_seconds');
    counter('roamguard_reconciles_total');
    counter('roamguard_reconcile_errors_total');
    gauge('roamguard_mesh_peers');
    gauge('roamguard_mesh_rejected_nodes');
    gauge('roamguard_mesh_waiting_nodes');
    for (const name of ['roamguard_mesh_refused_claims_total', 'roamguard_route_conflicts_total', 'roamguard_own_annotations_restored_total']) counter(name);
    gauge('roamguard_tunnel_mtu_bytes');
    counter('roamguard_path_mtu_probes_total');
    gauge('roamguard_peer_path_mtu_bytes', PEER);
    gauge('roamguard_peers_unreachable');
    gauge('roamguard_dataplane_up');
    gauge('roamguard_dataplane_counters_available');
    gauge('roamguard_dataplane_peers');
    counter('roamguard_dataplane_dropped_packets_total', ['reason']);
    gauge('roamguard_dataplane_worker_threads');
    counter('roamguard_peer_receive_bytes_total', PEER);
    counter('roamguard_peer_transmit_bytes_total', PEER);
    gauge('roamguard_peer_last_handshake_timestamp_seconds', PEER);
    gauge('roamguard_peer_last_handshake_age_seconds', PEER);
    counter('roamguard_peer_endpoint_changes_total', PEER);
    counter('roamguard_peer_handshake_attempts_total', PEER);
    counter('roamguard_peer_handshake_failures_total', PEER);
    counter('roamguard_peer_handshakes_total', PEER);
    gauge('roamguard_peer_state', [...PEER, 'state']);
    gauge('roamguard_peer_unreachable', PEER);
    gauge('roamguard_peer_relayed', [...PEER, 'via']);
    gauge('roamguard_relay_pairs');
    counter('roamguard_relay_forwarded_datagrams_total', ['pair']);
    counter('roamguard_relay_forwarded_bytes_total', ['pair']);
    counter('roamguard_relay_dropped_datagrams_total', ['pair', 'reason']);
    counter('roamguard_relay_probes_total');
    this.refusedConnections = new Counter({
      name: 'roamguard_metrics_refused_connections_total', help: METRIC_HELP.roamguard_metrics_refused_connections_total, registers: [this.registry],
    });
    if (options.defaultMetrics ?? true) collectDefaultMetrics({ register: this.registry });
  }

  /** The server closed a connection at accept (control/metrics/server.ts). */
  countRefusedConnection(): void {
    this.refusedConnections.inc();
  }

  /** A summary without quantiles (`_sum` and `_count`), from the agent's running totals. */
  private reconcileSummary(): Metric<string> {
    const name = 'roamguard_reconcile_duration_seconds';
    const help = METRIC_HELP[name];
    const source = this.source;
    return {
      name, help, type: 'summary', aggregator: 'sum',
      get: async () => ({
        name, help, type: 'summary', aggregator: 'sum',
        values: [
          { metricName: `${name}_sum`, labels: {}, value: source.reconcileDurationMsTotal / 1000 },
          { metricName: `${name}_count`, labels: {}, value: source.reconciles + source.reconcileErrors },
        ],
      }),
      reset: () => {},
    } as unknown as Metric<string>;
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  /**
   * The exposition text: the running reading if there is one, else the last one if it settled
   * less than `cacheMs` ago, else a new reading of the agent and the data plane.
   */
  scrape(): Promise<string> {
    const latest = this.latest;
    if (latest && (latest.settledAt === undefined || this.monotonicMs() - latest.settledAt < this.cacheMs)) return latest.text;
    const reading: Reading = { text: this.read(), settledAt: undefined };
    const settle = () => { reading.settledAt = this.monotonicMs(); };
    reading.text.then(settle, settle);
    this.latest = reading;
    return reading.text;
  }

  private async read(): Promise<string> {
    this.update(await this.readDataplane());
    return this.registry.metrics();
  }

  private async readDataplane(): Promise<DataplaneReading> {
    const dataplane = this.source.dataplane;
    if (!dataplane) return {};
    try {
      const snapshot = await dataplane.get();
      let stats: DeviceStats | undefined;
      try {
        stats = await dataplane.stats();
      } catch {
        stats = undefined; // the counters are extra: a failure here must not hide get's series
      }
      return { snapshot, stats };
    } catch (err) {
      return { error: (err as Error).message };
    }
  }

  private g(name: string): Gauge<string> {
    return this.gauges.get(name)!;
  }

  private c(name: string): Counter<string> {
    return this.counters.get(name)!;
  }

  /** Sets every series from the source and one data plane reading (exported for tests). */
  update(reading: DataplaneReading): void {
    const s = this.source;
    const now = this.now();
    for (const metric of [...this.gauges.values(), ...this.counters.values()]) metric.reset();

    this.g('roamguard_agent_ready').set(s.ready ? 1 : 0);
    for (const state of AGENT_STATES) this.g('roamguard_agent_state').set({ state }, s.state === state ? 1 : 0);
    const informer = s.informer;
    this.g('roamguard_informer_synced').set(informer?.synced ? 1 : 0);
    for (const state of INFORMER_STATES) this.g('roamguard_informer_state').set({ state }, informer?.state === state ? 1 : 0);
    this.c('roamguard_informer_restarts_total').inc(informer?.restarts ?? 0);
    if (s.lastReconcileDurationMs !== undefined) this.g('roamguard_reconcile_last_duration_seconds').set(s.lastReconcileDurationMs / 1000);
    this.c('roamguard_reconciles_total').inc(s.reconciles);
    this.c('roamguard_reconcile_errors_total').inc(s.reconcileErrors);
    const mesh = s.lastMesh;
    this.g('roamguard_mesh_peers').set(mesh?.peers.size ?? 0);
    this.g('roamguard_mesh_rejected_nodes').set(mesh?.rejected.length ?? 0);
    this.g('roamguard_mesh_waiting_nodes').set(mesh?.waiting.length ?? 0);
    this.c('roamguard_mesh_refused_claims_total').inc(s.refusedClaims ?? 0);
    this.c('roamguard_route_conflicts_total').inc(s.routeConflicts ?? 0);
    this.c('roamguard_own_annotations_restored_total').inc(s.annotationsRestored ?? 0);
    this.g('roamguard_tunnel_mtu_bytes').set(s.tunnelMtu ?? 0);
    this.c('roamguard_path_mtu_probes_total').inc(s.pathMtuProbes ?? 0);
    for (const [key, known] of s.pathMtus ?? []) {
      if (known.mtu !== undefined) this.g('roamguard_peer_path_mtu_bytes').set({ node: mesh?.peers.get(key)?.nodeName ?? '', key: key.slice(0, 8) }, known.mtu);
    }

    const { snapshot, stats } = reading;
    this.g('roamguard_dataplane_up').set(snapshot ? 1 : 0);
    this.g('roamguard_dataplane_counters_available').set(stats ? 1 : 0);
    let unreachable = 0;
    if (snapshot) {
      this.g('roamguard_dataplane_peers').set(snapshot.peers.length);
      const peerStats = new Map<string, PeerStats>((stats?.peers ?? []).map((p) => [keyToBase64(p.publicKey), p]));
      const seen = new Set<string>();
      for (const peer of snapshot.peers) {
        const key = keyToBase64(peer.publicKey);
        seen.add(key);
        const labels = { node: mesh?.peers.get(key)?.nodeName ?? '', key: key.slice(0, 8) };
        const counters = peerStats.get(key);
        this.c('roamguard_peer_receive_bytes_total').inc(labels, peer.rxBytes);
        this.c('roamguard_peer_transmit_bytes_total').inc(labels, peer.txBytes);
        const last = peer.lastHandshakeWallMs;
        this.g('roamguard_peer_last_handshake_timestamp_seconds').set(labels, last > 0 ? last / 1000 : 0);
        this.g('roamguard_peer_last_handshake_age_seconds').set(labels, last > 0 ? Math.max(0, (now - last) / 1000) : Infinity);
        if (counters) {
          this.c('roamguard_peer_endpoint_changes_total').inc(labels, counters.endpointChanges);
          this.c('roamguard_peer_handshake_attempts_total').inc(labels, counters.handshakeAttempts);
          this.c('roamguard_peer_handshake_failures_total').inc(labels, counters.handshakeFailures);
          this.c('roamguard_peer_handshakes_total').inc(labels, counters.handshakesCompleted);
        }
        const state = peerState({ hasEndpoint: peer.endpoint !== undefined, lastHandshakeWallMs: last, handshakePending: counters?.handshakePending }, now);
        for (const st of PEER_STATES) this.g('roamguard_peer_state').set({ ...labels, state: st }, st === state ? 1 : 0);
        let down = false;
        if (state === 'connected') this.notConnectedSince.delete(key);
        else {
          const since = this.notConnectedSince.get(key) ?? now;
          this.notConnectedSince.set(key, since);
          const expected = handshakeExpected({ persistentKeepalive: peer.persistentKeepalive, stagedPackets: counters?.stagedPackets });
          down = expected && now - since >= this.unreachableAfterMs;
        }
        // The agent's own judgement wins when it has one (the same peers its log names).
        if (s.unreachable) down = s.unreachable.has(key);
        this.g('roamguard_peer_unreachable').set(labels, down ? 1 : 0);
        if (down) unreachable++;
      }
      for (const key of [...this.notConnectedSince.keys()]) if (!seen.has(key)) this.notConnectedSince.delete(key);
    }
    this.g('roamguard_peers_unreachable').set(unreachable);
    for (const peer of mesh?.peers.values() ?? []) {
      if (peer.endpointSource === 'relay' && peer.relayVia) this.g('roamguard_peer_relayed').set({ node: peer.nodeName, key: peer.publicKey.slice(0, 8), via: peer.relayVia }, 1);
    }
    const relayed: ReadonlyMap<string, PairCounters> = s.relayCounters?.() ?? new Map();
    this.g('roamguard_relay_pairs').set(relayed.size);
    this.c('roamguard_relay_probes_total').inc(s.relayProbes ?? 0);
    for (const [pair, c] of relayed) {
      this.c('roamguard_relay_forwarded_datagrams_total').inc({ pair }, c.datagrams[0] + c.datagrams[1]);
      this.c('roamguard_relay_forwarded_bytes_total').inc({ pair }, c.bytes[0] + c.bytes[1]);
      for (const [reason, n] of Object.entries(c.dropped)) if (n > 0) this.c('roamguard_relay_dropped_datagrams_total').inc({ pair, reason }, n);
    }
    if (stats) {
      for (const [reason, n] of Object.entries(stats.drops)) this.c('roamguard_dataplane_dropped_packets_total').inc({ reason }, n);
      this.g('roamguard_dataplane_worker_threads').set(stats.workerThreads);
    }
  }
}
