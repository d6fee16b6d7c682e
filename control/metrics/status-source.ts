/**
 * What the metrics and health endpoints read from the agent: a narrow, read-only view, so the
 * metrics code never reaches into the agent's internals and tests can hand in a fake.
 * The agent (control/agent/agent.ts) implements it with fields it mostly has already.
 */
import type { MeshState } from '../mesh/desired-peers.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DeviceStats } from '../../dataplane/uapi/uapi-stats.ts';
import type { PairCounters } from '../relay/forward-core.ts';

/** The data plane as the metrics read it: a UapiClient (dataplane/uapi/uapi-client.ts) fits. */
export interface DataplaneReader {
  get(): Promise<DeviceSnapshot>;
  /** roamguard's counters; undefined when the data plane has none (wireguard-go). */
  stats(): Promise<DeviceStats | undefined>;
}

/** The Node informer as the metrics read it: a NodeWatcher (control/kube/node-watcher.ts) fits. */
export interface InformerView {
  readonly state: 'starting' | 'synced' | 'error' | 'stopped';
  readonly synced: boolean;
  /** How often the watch was restarted after an error. */
  readonly restarts: number;
}

export interface AgentStatusSource {
  readonly nodeName: string;
  readonly state: 'starting' | 'running' | 'stopped';
  /** The informer synced and the tunnel is configured (the agent's first complete pass). */
  readonly ready: boolean;
  /** The mesh of the last reconcile pass (peers by public key with their node names, rejections). */
  readonly lastMesh: MeshState | undefined;
  /** Successful reconcile passes. */
  readonly reconciles: number;
  /** Failed reconcile passes. */
  readonly reconcileErrors: number;
  /** Duration of every pass so far, successful or failed, added up (ms). */
  readonly reconcileDurationMsTotal: number;
  /** Duration of the last pass (ms); undefined before the first one. */
  readonly lastReconcileDurationMs: number | undefined;
  /** Undefined until the informer starts. */
  readonly informer: InformerView | undefined;
  /** Undefined when there is no tunnel (FIREWALL_ONLY) or before the agent set it up. */
  readonly dataplane: DataplaneReader | undefined;
  /**
   * Base64 keys of the peers the agent judges to have no working session (the ones it logs as
   * "may be unreachable"). Without it, the metrics judge for themselves: a peer expected to
   * handshake that has not been connected for 30 s.
   */
  readonly unreachable?: ReadonlySet<string>;
  /** Claims of other Nodes refused, route conflicts left alone, own annotations restored (see the agent). */
  readonly refusedClaims?: number;
  readonly routeConflicts?: number;
  readonly annotationsRestored?: number;
  /** The tunnel's MTU (0 before it is set up) and each peer's learned path MTU through it (base64 key). */
  readonly tunnelMtu?: number;
  readonly pathMtus?: ReadonlyMap<string, { readonly mtu: number | undefined }>;
  readonly pathMtuProbes?: number;
  /** As a relay: forwarding counters per relayed pair, by `nodeA,nodeB` (control/agent/relays.ts). */
  relayCounters?(): ReadonlyMap<string, PairCounters>;
  /** Liveness probes sent to relays while a peer needed one (control/agent/relay-probe.ts). */
  readonly relayProbes?: number;
}
