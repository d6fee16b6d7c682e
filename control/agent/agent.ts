/**
 * `roamguard agent`: wiring of the node agent. Everything that decides lives elsewhere and is
 * tested on its own (settings, annotations, desired peers, reconcile plan, nftables/CNI/route
 * rendering); this file only orders the steps and keeps them running:
 *
 *   start:    settings → key file → own Node → local pod CIDRs and addresses → data plane up
 *             (started when absent) → CNI conflist → publish own annotations → watch Nodes
 *   on every change (debounced) and every RESYNC_INTERVAL:
 *             Nodes → desired mesh → `set` plan → wanted routes and nftables to the host lane
 *   stop:     leave everything in place (pods keep working); `--cleanup` removes it.
 *
 * What keeps a Node change cheap at 5 000 peers (docs/performance.md, issue 18):
 * - it is planned against a model of the data plane (device-model.ts: the last get=1 with the
 *   sets since applied), skipping peers whose desired state and entry are unchanged
 *   (ReconcileMemory.settled);
 * - the data plane is read (a 2 MB get=1) beside the passes, and the sets sent meanwhile are
 *   replayed on the answer (readingBeside);
 * - routes and nftables are applied beside the passes, by difference (host-lane.ts);
 * - commands start from a small helper process (control/host/spawner.ts).
 *
 * Failures of one step are logged and retried on the next pass; the mesh as it is keeps working
 * meanwhile (fail static). The agent never removes a peer before the Node list has synced.
 */
import type { KubeConfig } from '../kube/kube-client.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { keyToBase64, shortKey } from '../../dataplane/noise/keys.ts';
import type { Settings } from '../config/settings.ts';
import { loadOrCreatePrivateKey } from '../identity/private-key.ts';
import type { AgentLogger } from '../log.ts';
import { ANNOTATION, formatDiscoveredEndpoints, type NodeObject } from '../mesh/annotations.ts';
import { MeshTracker } from '../mesh/mesh-tracker.ts';
import { snapshotInterning } from '../mesh/interned.ts';
import { sortAddresses, specPodCidrs, type DesiredPeer, type MeshState } from '../mesh/desired-peers.ts';
import { parseAllowedRanges, podCidrRefusal } from '../mesh/claims.ts';
import { parsePrefix } from '../../dataplane/net/ip.ts';
import { newReconcileMemory, peersToKick, planReconcile, type ReconcileMemory } from '../mesh/reconcile.ts';
import { applySetToSnapshot } from '../mesh/device-model.ts';
import { judgeReachability, type ReachabilityMemory } from './reachability.ts';
import { keepLiveEndpoints, observedEndpoints, workingAtOwnAddress } from './observed-endpoints.ts';
import { annotationDrift, forceEndpointChange, ownAnnotations, ownForcedFamily, restorePatch, type AnnotationPatch } from './own-annotations.ts';
import { newOnes, type Once } from './once.ts';
import { followKeyFile, kickRequest, rotationPendingAtStart, watchKeyFile } from './key-rotation.ts';
import type { DeviceSnapshot, SetRequest } from '../../dataplane/uapi/uapi-protocol.ts';
import { UapiClient, type UapiTraffic } from '../../dataplane/uapi/uapi-client.ts';
import { renderConflist, writeConflistAtomically } from '../host/cni-config.ts';
import { removeTable } from '../host/nftables.ts';
import { HostLane, type HostState } from './host-lane.ts';
import { splitCidrsByFamily } from '../host/cidrs.ts';
import { systemRunner, type CommandRunner } from '../host/runner.ts';
import { CommandSpawner } from '../host/spawner.ts';
import { globalUnicastAddresses } from '../host/node-addresses.ts';
import { podCidrsFromSpec, readPodCidrFile, watchPodCidrFile, type PodCidrFileWatch } from '../host/pod-cidr-source.ts';
import { configureTunnelInterface, removeRoutes } from '../host/routes.ts';
import { detectUplinkMtu } from '../host/uplink-mtu.ts';
import { pingFits } from '../host/ping-probe.ts';
import { dueProbes, MIN_PROBED_MTU, recordProbe, routesWithPathMtu, searchLargestFit, type PathMtuMemory, type ProbeTarget } from './path-mtu.ts';
import { loadKubeConfig } from '../kube/kube-config.ts';
import { NodeWatcher } from '../kube/node-watcher.ts';
import { patchNodeAnnotations, readNode } from '../kube/node-patch.ts';
import { enableForwarding } from '../host/sysctl.ts';
import { ensureDataplane } from './dataplane-process.ts';
import { installCniPlugins } from '../host/cni-install.ts';
import type { AgentStatusSource } from '../metrics/status-source.ts';
import { AgentRelays } from './relays.ts';

export interface AgentDeps {
  settings: Settings;
  log: AgentLogger;
  runner?: CommandRunner;
  kubeConfig?: KubeConfig;
  /** Environment for a data plane the agent starts (tests pass shortened timers). */
  dataplaneEnv?: NodeJS.ProcessEnv;
  /** Debounce for bursts of Node events. */
  debounceMs?: number;
}

/** What the agent knows about its own node. */
interface LocalView {
  podCidrs: string[];
  addresses: string[];
  interfaceAddresses: string[];
}

export type AgentState = 'starting' | 'running' | 'stopped';

/** A get=1 sent while passes go on (see Agent.readingBeside). */
interface BesideRead {
  /** Every set sent since the read started, in order: replayed on its answer. */
  sets: SetRequest[];
  done: boolean;
  /** The answer; undefined when the read failed. */
  snapshot?: DeviceSnapshot;
  /** What the read cost on the control socket. */
  traffic?: UapiTraffic;
}

/**
 * How often the agent reads its data plane between Node events: endpoints learned by roaming
 * (a NAT mapping that changed) reach the `discovered-endpoints` annotation this fast.
 */
export const DISCOVERY_INTERVAL_MS = 5000;

/** Under constant Node churn the data plane is still read at least this often. */
export const MAX_MODEL_AGE_MS = 30_000;
/**
 * From this many peers on, Node changes are planned against the model of the data plane and the
 * discovery read yields to them (a get=1 is 2 MB at 5 000 peers). Below it a read costs little,
 * and every pass reads: relay decisions and liveness need the peers' counters, which only a read
 * has, and they should not wait for a quiet moment in the Node events.
 */
export const MODEL_PEER_THRESHOLD = 256;

export class Agent implements AgentStatusSource {
  state: AgentState = 'starting';
  /** Set once the informer synced and the tunnel is configured (readiness). */
  ready = false;
  lastMesh: MeshState | undefined;
  reconcileErrors = 0;
  reconciles = 0;
  reconcileDurationMsTotal = 0;
  lastReconcileDurationMs: number | undefined;
  /** Claims of other Nodes refused so far (each counted once while it persists). */
  refusedClaims = 0;
  /** Wanted routes left alone because a route that is not ours goes there (each counted once). */
  routeConflicts = 0;
  /** Annotations of this Node put back after someone else changed them. */
  annotationsRestored = 0;
  /** Key rotations this agent completed (published and switched). */
  keyRotations = 0;
  /** The tunnel's MTU: WG_MTU, or derived from the uplink (0 until the tunnel is set up). */
  tunnelMtu = 0;
  /** Each peer's learned path MTU through the tunnel (PATH_MTU_DISCOVERY; see path-mtu.ts). */
  readonly pathMtus: PathMtuMemory = new Map();
  /** Path-MTU probes run so far. */
  pathMtuProbes = 0;
  get nodeName(): string { return this.settings.nodeName; }
  get informer(): NodeWatcher | undefined { return this.watcher; }
  get dataplane(): UapiClient | undefined { return this.uapi; }
  relayCounters() { return this.relays.counters(); }
  get relayProbes(): number { return this.relays.prober.sent; }

  private readonly settings: Settings;
  private readonly log: AgentLogger;
  /** Relays: peers reached through one, and pairs this node relays (control/agent/relays.ts). */
  readonly relays: AgentRelays;
  private readonly runner: CommandRunner;
  private readonly spawner: CommandSpawner | undefined;
  private kc!: KubeConfig;
  private publicKey = '';
  private privateKey: Uint8Array | undefined;
  /** This start created the key file (there was none). */
  private keyCreated = false;
  private uapi: UapiClient | undefined;
  private canRemoveAllowedIp: boolean | undefined;
  private readonly memory: ReconcileMemory = newReconcileMemory();
  private watcher: NodeWatcher | undefined;
  private fileWatch: PodCidrFileWatch | undefined;
  private keyFileWatch: { close(): void } | undefined;
  private readonly keyFileReported = new Set<string>();
  /** The public key of a rotation not yet published (see followKeyFile). */
  private pendingPublicKey: string | undefined;
  private local: LocalView = { podCidrs: [], addresses: [], interfaceAddresses: [] };
  private published = '';
  private publishedDiscovered: string | undefined;
  /** Every annotation of this Node the agent wrote, as it wrote it (what a tamperer's change is measured against). */
  private written: AnnotationPatch = {};
  /** This Node's force-endpoint at the last look (undefined before the first). */
  private seenForceEndpoint: string | null | undefined;
  /** Peers without a working session: nodes that cannot reach each other (for status and metrics). */
  readonly unreachable = new Set<string>();
  private readonly reachability: ReachabilityMemory = { configuredAt: new Map(), unreachable: this.unreachable };
  /** Peers answering at one of their own addresses at the last look (observations cannot move them). */
  private workingHere = new Set<string>();
  private readonly refusedLogged: Once = new Set();
  private readonly conflictsLogged: Once = new Set();
  private readonly ownRefusalsLogged: Once = new Set();
  private discoveryTimer: NodeJS.Timeout | undefined;
  private writtenConflist = '';
  /** Routes and nftables, applied beside the passes (host-lane.ts). */
  private readonly hostLane: HostLane;
  private readonly rejectedLogged: Once = new Set();
  /** Peers (base64 keys) with a path-MTU probe in flight. */
  private readonly probing = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private resyncTimer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  /** Milliseconds of each step of the pass in progress (for the 'reconciled' debug line). */
  private steps: Record<string, number> = {};
  private again = false;
  private forceNext = false;
  private readNext = true;
  /** The discovery interval has passed since the last read (a read is wanted, not required). */
  private discoveryDue = false;
  /** Node changes arrived since the last pass started. */
  private nodeEventsPending = false;
  private lastReadAt = 0;
  /**
   * The data plane as the last `get=1` showed it with every `set` since applied (device-model.ts):
   * what a pass for a Node change plans against.
   */
  private deviceModel: DeviceSnapshot | undefined;
  /** A get=1 running beside the passes (readingBeside), and the sets sent since it started. */
  private beside: BesideRead | undefined;
  /** The control-socket client of those reads: its traffic is counted to the pass that takes one. */
  private besideClient: UapiClient | undefined;
  /** Traffic of the read beside the passes that the pass in progress took. */
  private besideTraffic: UapiTraffic | undefined;
  /** The device as setUpTunnel read it, when it set nothing after (taken by the pass that follows). */
  private tunnelRead: DeviceSnapshot | undefined;
  /** The desired mesh from pass to pass: a Node change decides that Node (mesh-tracker.ts). */
  private readonly meshTracker = new MeshTracker();
  /** Nodes the last pass decided (all of them in a full one), for the pass log. */
  private meshDecided = 0;

  constructor(private readonly deps: AgentDeps) {
    this.settings = deps.settings;
    this.log = deps.log;
    // Commands start from a small helper process: from the agent, at 5 000 Nodes, each blocked it for 6-20 ms (spawner.ts).
    if (deps.runner) this.runner = deps.runner;
    else {
      this.spawner = new CommandSpawner();
      this.runner = this.spawner.run;
    }
    this.relays = new AgentRelays(deps.settings, deps.log);
    this.hostLane = new HostLane({
      runner: this.runner, log: this.log,
      onRouteConflicts: (list) => {
        const conflicts = newOnes(this.conflictsLogged, list.map((c) => ({ id: `${c.dst}\n${c.existing}`, item: c })));
        for (const c of conflicts) this.log.warn('not routing a pod CIDR into the tunnel: a route that is not the agent\'s already goes there, and the agent never replaces one', { destination: c.dst, existing: c.existing });
        this.routeConflicts += conflicts.length;
      },
      onError: (err) => {
        this.reconcileErrors++;
        this.log.error('could not apply routes or nftables rules; a pass shortly retries', { error: err.message });
        setTimeout(() => this.schedule(false, false), 1000).unref();
      },
    });
  }

  async start(): Promise<void> {
    const s = this.settings;
    this.kc = this.deps.kubeConfig ?? loadKubeConfig({ kubeconfigPath: s.kubeconfig || undefined, apiServer: s.apiServer || undefined });
    if (!s.firewallOnly) {
      const key = loadOrCreatePrivateKey(s.privateKeyPath);
      this.privateKey = key.privateKey;
      this.keyCreated = key.created;
      const crypto = await selectCrypto();
      this.publicKey = keyToBase64(crypto.publicKey(key.privateKey));
      this.log.info(key.created ? 'created a new private key' : 'loaded the private key', { path: s.privateKeyPath, key: shortKey(crypto.publicKey(key.privateKey)) });
      // Reads share their prefixes with the mesh's and one zero preshared key (interned.ts).
      this.uapi = UapiClient.forInterface(s.socketDir, s.interfaceName, undefined, snapshotInterning);
      this.besideClient = UapiClient.forInterface(s.socketDir, s.interfaceName, undefined, snapshotInterning);
      // A rotation replaces the file (rotate-key, KEY_ROTATION_INTERVAL): follow it at once.
      this.keyFileWatch = watchKeyFile(s.privateKeyPath, () => this.schedule(false));
    }
    const own = await this.readOwnNodeWithRetry();
    this.warnOnReplacedKey(own);
    if (!s.firewallOnly) await this.keepRunningKeyWhileRotationPending(own);
    this.local = await this.computeLocal(own);
    if (!s.firewallOnly) {
      await this.setUpTunnel();
      // In the image the standard plugins ride along; a host without them gets them installed.
      const cni = await installCniPlugins();
      if (cni.installed.length > 0) this.log.info('installed CNI plugins on the host', { dir: cni.targetDir, plugins: cni.installed });
      if (cni.bundled && cni.unavailable.length > 0) this.log.warn('CNI plugins missing on the host and not bundled', { dir: cni.targetDir, plugins: cni.unavailable });
    }
    await this.publish();
    if (s.podCidrSource.ipv4 === 'file' || s.podCidrSource.ipv6 === 'file') {
      this.fileWatch = watchPodCidrFile(s.podCidrSourcePath, () => {
        this.log.info('pod CIDR file changed', { path: s.podCidrSourcePath });
        this.schedule(true);
      });
    }
    this.watcher = new NodeWatcher(this.kc, { log: this.log });
    // A Node change is planned against the model of the data plane (no read of every peer).
    this.watcher.onChange(() => {
      this.nodeEventsPending = true;
      this.schedule(false, !this.largeMesh());
    });
    await this.watcher.start();
    this.state = 'running';
    this.resyncTimer = setInterval(() => this.schedule(true), s.resyncInterval * 1000);
    if (!s.firewallOnly) {
      this.discoveryTimer = setInterval(() => {
        this.discoveryDue = true;
        this.schedule(false, false);
      }, DISCOVERY_INTERVAL_MS);
    }
    this.schedule(true);
  }

  async stop(): Promise<void> {
    this.state = 'stopped';
    clearTimeout(this.timer);
    clearInterval(this.resyncTimer);
    clearInterval(this.discoveryTimer);
    this.fileWatch?.close();
    this.keyFileWatch?.close();
    await this.watcher?.stop();
    await this.running;
    await this.hostLane.idle();
    this.relays.close();
    this.spawner?.close();
  }

  /** Waits for the pass in progress and any scheduled one (tests, shutdown). */
  async settle(): Promise<void> {
    while (this.running || this.timer) {
      await this.running;
      if (this.timer) await new Promise((r) => setTimeout(r, (this.deps.debounceMs ?? 50) + 5));
    }
    await this.hostLane.idle();
  }

  private async readOwnNodeWithRetry(): Promise<NodeObject> {
    for (let delay = 1000; ; delay = Math.min(delay * 2, 30_000)) {
      try {
        return await readNode(this.kc, this.settings.nodeName) as NodeObject;
      } catch (err) {
        this.log.warn('cannot read this node\'s Node object; retrying', { node: this.settings.nodeName, error: (err as Error).message, retryInMs: delay });
        await new Promise((r) => setTimeout(r, delay));
      }
    }
  }

  private async computeLocal(own: NodeObject): Promise<LocalView> {
    const s = this.settings;
    const podCidrs: string[] = [];
    for (const family of ['ipv4', 'ipv6'] as const) {
      const source = s.podCidrSource[family];
      if (source === 'spec') podCidrs.push(...podCidrsFromSpec(own, family === 'ipv4' ? 4 : 6));
      else if (source === 'file') {
        const read = await readPodCidrFile(s.podCidrSourcePath, family === 'ipv4' ? 4 : 6);
        for (const bad of read.errors) this.log.warn('ignoring a line of the pod CIDR file', { path: s.podCidrSourcePath, problem: bad });
        podCidrs.push(...read.cidrs);
      }
    }
    this.warnOnClaimsOthersRefuse(own, podCidrs);
    const interfaceAddresses = s.nodeIpInterfaces.length > 0 ? await globalUnicastAddresses(s.nodeIpInterfaces, this.runner) : [];
    const statusAddresses = (own.status?.addresses ?? [])
      .filter((a) => (a.type === 'InternalIP' || a.type === 'ExternalIP') && typeof a.address === 'string')
      .map((a) => a.address!);
    return { podCidrs: sortAddresses(podCidrs), addresses: sortAddresses([...statusAddresses, ...interfaceAddresses]), interfaceAddresses: sortAddresses(interfaceAddresses) };
  }

  /**
   * Every other agent checks this node's pod CIDRs against its spec or POD_CIDR_ALLOWED_RANGES
   * (control/mesh/claims.ts); one they will refuse is said here, once, where it can be fixed.
   */
  private warnOnClaimsOthersRefuse(own: NodeObject, podCidrs: readonly string[]): void {
    const spec = specPodCidrs(own);
    const allowed = parseAllowedRanges(this.settings.podCidrAllowedRanges);
    const refusals = podCidrs.flatMap((c) => {
      const reason = podCidrRefusal(parsePrefix(c), { spec, allowed, nodeAddresses: [], held: [] });
      return reason === undefined ? [] : [{ id: `${c}\n${reason}`, item: { claim: c, reason } }];
    });
    for (const r of newOnes(this.ownRefusalsLogged, refusals)) {
      this.log.warn('the other nodes will refuse this pod CIDR of this node (set POD_CIDR_ALLOWED_RANGES on every agent, or use the spec source)', { node: this.settings.nodeName, claim: r.claim, reason: `${r.claim} ${r.reason}` });
    }
  }

  /**
   * Brings the data plane up (starting it when absent) and gives it our key and port. Returns
   * true when the data plane is fresh (just started, or it had lost its key): its interface has
   * no routes and its device no peers yet.
   */
  private async setUpTunnel(read?: DeviceSnapshot): Promise<boolean> {
    const s = this.settings;
    // A data plane that answers a get=1 is running: no second 2 MB read to find that out.
    let device = read ?? await this.uapi!.get().catch(() => undefined);
    let status: Awaited<ReturnType<typeof ensureDataplane>> = 'running';
    if (device === undefined) {
      status = await ensureDataplane({
        choice: s.dataplane, ifname: s.interfaceName, client: this.uapi!, env: this.deps.dataplaneEnv,
        onLog: (line) => this.log.error('the data plane says', { interface: s.interfaceName, line }),
      });
      if (status === 'started') this.log.info('started the data plane', { interface: s.interfaceName, dataplane: s.dataplane });
      device = await this.uapi!.get();
    }
    const keyMatches = device.privateKey !== undefined && keyToBase64(device.privateKey) === keyToBase64(this.privateKey!);
    this.tunnelRead = undefined;
    if (!keyMatches || device.listenPort !== s.listenPort) {
      // Only when different: re-setting the key would expire every session.
      await this.setDevice({ privateKey: keyMatches ? undefined : this.privateKey, listenPort: s.listenPort, replacePeers: false, peers: [] });
    } else {
      this.tunnelRead = device;
    }
    this.canRemoveAllowedIp ??= await this.uapi!.supportsAllowedIpRemoval();
    const families = splitCidrsByFamily(this.local.podCidrs);
    const enabled = await enableForwarding({ ipv4: families.v4.length > 0, ipv6: families.v6.length > 0 });
    if (enabled.length > 0) this.log.info('turned packet forwarding on', { families: enabled });
    await this.chooseTunnelMtu();
    await configureTunnelInterface({ device: s.interfaceName, mtu: this.tunnelMtu, localPodCidrs: this.local.podCidrs, runner: this.runner });
    await this.writeCni();
    return status === 'started' || !keyMatches;
  }

  /** WG_MTU, or the uplink's MTU less WireGuard's overhead (uplink-mtu.ts); said when it changes. */
  private async chooseTunnelMtu(): Promise<void> {
    const s = this.settings;
    if (s.mtu !== undefined) {
      this.tunnelMtu = s.mtu;
      return;
    }
    const uplink = await detectUplinkMtu(this.local.addresses, s.wgIpFamily, this.runner);
    if (uplink.tunnelMtu === this.tunnelMtu) return;
    this.log.info('tunnel MTU from the uplink', { mtu: uplink.tunnelMtu, link: uplink.link ?? '(none found: 1500 assumed)', linkMtu: uplink.linkMtu, how: uplink.how, wgIpFamily: s.wgIpFamily });
    this.tunnelMtu = uplink.tunnelMtu;
  }

  private async writeCni(): Promise<void> {
    const s = this.settings;
    if (s.firewallOnly || this.local.podCidrs.length === 0) return;
    const text = renderConflist({ name: 'roamguard', mtu: this.tunnelMtu, podCidrs: this.local.podCidrs, dataDir: s.cniIpamDataDir || undefined });
    if (text === this.writtenConflist) return;
    if (await writeConflistAtomically(s.cniConfigPath, text)) this.log.info('wrote the CNI config', { path: s.cniConfigPath, podCidrs: this.local.podCidrs });
    this.writtenConflist = text;
  }

  /**
   * A key file that vanished (a wiped disk, a changed hostPath) while this Node still advertises a
   * key: the new key is published and peers follow it by public key, but this is never silent.
   */
  private warnOnReplacedKey(own: NodeObject): void {
    if (!this.keyCreated || !this.publicKey) return;
    const advertised = own.metadata?.annotations?.[ANNOTATION.publicKey];
    if (!advertised || advertised === this.publicKey) return;
    this.log.warn('the private key file was missing, so a new key replaces the one this Node advertised; peers switch to it within one watch event, traffic to this node pauses until they do', {
      path: this.settings.privateKeyPath, previousKey: advertised.slice(0, 8), newKey: this.publicKey.slice(0, 8),
    });
  }

  /** See rotationPendingAtStart (key-rotation.ts): the first pass publishes the file's key, then switches. */
  private async keepRunningKeyWhileRotationPending(own: NodeObject): Promise<void> {
    const held = (await this.uapi!.get().catch(() => undefined))?.privateKey;
    if (!held || held.every((b) => b === 0)) return;
    const crypto = await selectCrypto();
    const heldPublic = keyToBase64(crypto.publicKey(held));
    if (!rotationPendingAtStart(this.publicKey, heldPublic, own.metadata?.annotations?.[ANNOTATION.publicKey])) {
      held.fill(0);
      return;
    }
    this.log.info('the key file holds a rotated key that this Node does not publish yet: keeping the running key until the new one is published', { running: heldPublic.slice(0, 8), file: this.publicKey.slice(0, 8) });
    this.privateKey!.fill(0);
    this.privateKey = held;
    this.publicKey = heldPublic;
  }

  private async publish(publicKey = this.publicKey): Promise<void> {
    const s = this.settings;
    const annotations = ownAnnotations({
      publicKey, listenPort: s.listenPort, podCidrs: this.local.podCidrs, nodeIps: this.local.interfaceAddresses, firewallOnly: s.firewallOnly,
    });
    const text = JSON.stringify(annotations);
    if (text === this.published) return;
    await patchNodeAnnotations(this.kc, s.nodeName, annotations);
    this.published = text;
    this.written = { ...this.written, ...annotations };
    this.log.info('published this node\'s annotations', { node: s.nodeName, key: publicKey ? publicKey.slice(0, 8) : undefined, podCidrs: this.local.podCidrs });
  }

  /**
   * Puts back this Node's annotations that someone else changed (see own-annotations.ts), and
   * says so when the operator's force-endpoint changed. The watch cache may trail the agent's
   * own last patch, so a difference is confirmed by a fresh read before it counts as tampering.
   */
  private async restoreOwnAnnotations(own: NodeObject | undefined): Promise<void> {
    const name = this.settings.nodeName;
    if (!own || Object.keys(this.written).length === 0) return;
    const cached = own.metadata?.annotations;
    const change = forceEndpointChange(this.seenForceEndpoint, cached);
    this.seenForceEndpoint = cached?.[ANNOTATION.forceEndpoint] ?? null;
    if (change) {
      this.log.warn('this Node\'s force-endpoint changed: it is the operator\'s, so the agent leaves it, but every peer now sends this node\'s traffic there', {
        node: name, field: ANNOTATION.forceEndpoint, from: change.from, to: change.to,
      });
    }
    if (annotationDrift(this.written, cached).length === 0) return;
    const fresh = await readNode(this.kc, name) as NodeObject;
    const drift = annotationDrift(this.written, fresh.metadata?.annotations)
      .filter((d) => !(d.field === ANNOTATION.publicKey && d.found !== null && d.found === this.pendingPublicKey));
    if (drift.length === 0) return;
    const shown = (v: string | null) => (v === null ? '(absent)' : v.length > 120 ? `${v.slice(0, 120)}…` : v);
    for (const d of drift) {
      this.log.warn('someone else changed an annotation of this Node; restoring what the agent published', { node: name, field: d.field, found: shown(d.found), restored: shown(d.expected) });
    }
    await patchNodeAnnotations(this.kc, name, restorePatch(drift));
    this.annotationsRestored += drift.length;
  }

  /**
   * Publishes where the data plane sees peers that are not at any of their own addresses (they
   * are behind NAT), so nodes that cannot observe them can use the mapping (Kilo's approach).
   */
  private async publishDiscovered(mesh: MeshState, device: DeviceSnapshot, relayEndpoints: ReadonlySet<string>): Promise<void> {
    const observed = observedEndpoints(mesh.peers, device, Date.now());
    // A peer heard through a relay is at the relay's port, not behind a NAT of its own; and where
    // a peer that needs a relay is seen says nothing others can use (it flips with every direct
    // trial, which would make every node's view of it flip too).
    const relayed = this.relays.relayedPeers();
    for (const [key, endpoint] of observed) if (relayEndpoints.has(endpoint) || relayed.has(key)) observed.delete(key);
    const text = formatDiscoveredEndpoints(observed);
    if (text === this.publishedDiscovered) return;
    const value = observed.size > 0 ? text : null;
    await patchNodeAnnotations(this.kc, this.settings.nodeName, { [ANNOTATION.discoveredEndpoints]: value });
    this.publishedDiscovered = text;
    this.written = { ...this.written, [ANNOTATION.discoveredEndpoints]: value };
    this.log.debug('published discovered endpoints', { peers: observed.size });
  }

  /** A rotated key in the key file: published, then the data plane's (key-rotation.ts); the old key wiped. */
  private async followKeyFile(): Promise<void> {
    const s = this.settings;
    const crypto = await selectCrypto();
    const switched = await followKeyFile({
      path: s.privateKeyPath, intervalS: s.keyRotationInterval, inUse: this.privateKey!, publicKeyOf: (k) => crypto.publicKey(k),
      publish: (publicKey) => this.publish(publicKey), dataplane: this.uapi!, log: this.log, reported: this.keyFileReported,
      onPublishPending: (publicKey) => { this.pendingPublicKey = publicKey; },
    });
    if (!switched) return;
    // The switch went to the data plane directly: a read beside the passes no longer shows it.
    this.beside = undefined;
    this.privateKey!.fill(0);
    this.privateKey = switched.privateKey;
    this.publicKey = switched.publicKey;
    this.keyRotations++;
  }

  /**
   * Finds a peer's path MTU in the background (path-mtu.ts): DF-set pings to its gateway address,
   * largest answered size wins. The pass that follows puts it on the peer's routes.
   */
  private probePathMtu(target: ProbeTarget, snapshot: DeviceSnapshot): void {
    if (this.probing.has(target.key) || this.state === 'stopped') return;
    this.probing.add(target.key);
    const endpoint = snapshot.peers.find((p) => keyToBase64(p.publicKey) === target.key)?.endpoint?.toString();
    const high = this.tunnelMtu;
    void searchLargestFit(Math.min(MIN_PROBED_MTU, high), high, (size) => {
      this.pathMtuProbes++;
      return pingFits(target.address, size, this.runner);
    }).then((mtu) => {
      const { changed, before } = recordProbe(this.pathMtus, target, endpoint, mtu, Date.now());
      if (mtu === undefined) {
        this.log.info('path MTU probe got no answer at any size; keeping what was known', { node: target.nodeName, target: target.address, reason: target.reason, known: before });
      } else if (changed) {
        const level = mtu < high ? 'warn' : 'info';
        this.log[level](mtu < high ? 'the path to a peer carries less than the tunnel MTU: its routes get the smaller MTU' : 'the path to a peer carries the whole tunnel MTU', {
          node: target.nodeName, pathMtu: mtu, tunnelMtu: high, before, reason: target.reason, endpoint,
        });
        this.schedule(false);
      }
    }).catch((err: Error) => {
      this.log.warn('path MTU probe failed', { node: target.nodeName, error: err.message });
    }).finally(() => this.probing.delete(target.key));
  }

  /** Logs peers that lost or regained a working session (see reachability.ts). */
  private checkReachability(mesh: MeshState, device: DeviceSnapshot): void {
    const changes = judgeReachability(mesh.peers, device, this.reachability, { nowWallMs: Date.now(), persistentKeepaliveS: this.settings.persistentKeepalive });
    for (const c of changes) {
      if (c.kind === 'unreachable') {
        this.log.warn('no working session with a peer: it may be unreachable from here (for example both nodes behind NATs that do not let them meet)', {
          node: c.peer.nodeName, key: c.key.slice(0, 8), endpoint: c.peer.endpoint, endpointSource: c.peer.endpointSource,
          lastHandshake: c.lastHandshakeWallMs > 0 ? new Date(c.lastHandshakeWallMs).toISOString() : 'never',
        });
      } else {
        this.log.info('a peer is reachable again', { node: c.peer.nodeName, key: c.key.slice(0, 8), endpoint: c.peer.endpoint });
      }
    }
  }

  /**
   * Queues a reconcile pass; `full` also re-reads local facts and re-applies host state; `read`
   * reads the data plane (`get=1`) instead of planning against the model of what was set. Events
   * that arrive while a pass runs are coalesced into one next pass.
   */
  private schedule(full: boolean, read = true): void {
    if (this.state === 'stopped') return;
    this.forceNext ||= full;
    this.readNext ||= read;
    if (this.running) {
      this.again = true;
      return;
    }
    if (this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      const force = this.forceNext;
      // The discovery read yields to Node changes waiting to be planned (under churn a read of
      // every peer would come before each of them), unless the model has gone unread too long.
      const discoveryRead = this.discoveryDue && (!this.nodeEventsPending || !this.largeMesh() || Date.now() - this.lastReadAt >= MAX_MODEL_AGE_MS);
      const read = this.readNext || force || discoveryRead;
      if (read && this.readingBeside()) {
        // The read (and a full pass with it) waits for the get=1 in flight; its end schedules
        // it. Node changes meanwhile are planned against the model.
        if (!this.nodeEventsPending) return;
        this.nodeEventsPending = false;
        this.run(false, false);
        return;
      }
      this.forceNext = false;
      this.readNext = false;
      this.nodeEventsPending = false;
      if (read) {
        this.discoveryDue = false;
        this.lastReadAt = Date.now();
      }
      this.run(force, read);
    }, this.deps.debounceMs ?? 50);
  }

  private run(full: boolean, read: boolean): void {
    this.running = this.pass(full, read).finally(() => {
      this.running = undefined;
      if (this.again) {
        this.again = false;
        this.schedule(false, false);
      }
    });
  }

  /**
   * Whether a wanted read goes to a get=1 beside the passes (a large mesh with a model to plan
   * against): true while it is in flight (started here when there is none), false once it has
   * answered (the pass takes it) or when the pass should read for itself.
   */
  private readingBeside(): boolean {
    if (this.settings.firewallOnly || !this.largeMesh() || this.deviceModel === undefined) return false;
    if (this.beside === undefined) {
      const read: BesideRead = { sets: [], done: false };
      this.beside = read;
      const before = { ...this.besideClient!.traffic };
      this.besideClient!.get().then((snapshot) => {
        read.snapshot = snapshot;
        const after = this.besideClient!.traffic;
        read.traffic = { operations: after.operations - before.operations, bytesSent: after.bytesSent - before.bytesSent, bytesReceived: after.bytesReceived - before.bytesReceived, ms: after.ms - before.ms };
      }, () => { /* the pass reads for itself */ }).finally(() => {
        read.done = true;
        if (this.beside === read) this.schedule(false, true);
      });
    }
    return !this.beside.done;
  }

  /** The get=1 read beside the passes, with the sets sent since replayed (undefined when there is none). */
  private takeBesideRead(): DeviceSnapshot | undefined {
    const read = this.beside;
    this.beside = undefined;
    if (!read?.done || read.snapshot === undefined) return undefined;
    this.besideTraffic = read.traffic;
    let snapshot = read.snapshot;
    for (const request of read.sets) snapshot = applySetToSnapshot(snapshot, request);
    return snapshot;
  }

  /**
   * Every `set` of a pass goes through here: a read beside the passes may have been answered
   * before or after it, so it is replayed on that read (a set applied twice ends where it ended
   * once: each names the state it wants).
   */
  private async setDevice(request: SetRequest): Promise<void> {
    this.beside?.sets.push(request);
    await this.uapi!.set(request);
  }

  private largeMesh(): boolean {
    return (this.lastMesh?.peers.size ?? 0) >= MODEL_PEER_THRESHOLD;
  }

  private async pass(full: boolean, read: boolean): Promise<void> {
    const started = Date.now();
    const cpu = process.cpuUsage();
    const uapi = this.uapi ? { ...this.uapi.traffic } : undefined;
    this.besideTraffic = undefined;
    this.steps = {};
    try {
      await this.reconcile(full, read);
      this.recordPassDuration(started);
      this.reconciles++;
      // What one pass costs (the agent-scale bench reads these): time, this process's CPU, control socket traffic.
      const used = process.cpuUsage(cpu);
      // This client's traffic in the pass, and the read beside the passes that it took.
      const now = this.uapi?.traffic;
      const beside = this.besideTraffic ?? { operations: 0, bytesSent: 0, bytesReceived: 0, ms: 0 };
      const t = now && { operations: now.operations + beside.operations, bytesSent: now.bytesSent + beside.bytesSent, bytesReceived: now.bytesReceived + beside.bytesReceived, ms: now.ms + beside.ms };
      this.log.debug('reconciled', {
        ms: Date.now() - started, full, read, cpuMs: Math.round((used.user + used.system) / 1000), peers: this.lastMesh?.peers.size, nodesDecided: this.meshDecided,
        heapMiB: Math.round(process.memoryUsage().heapUsed / 2 ** 20),
        ...Object.fromEntries(Object.entries(this.steps).map(([k, v]) => [`${k}Ms`, Math.round(v)])),
        ...(uapi && t ? { uapiOperations: t.operations - uapi.operations, uapiBytesSent: t.bytesSent - uapi.bytesSent, uapiBytesReceived: t.bytesReceived - uapi.bytesReceived, uapiMs: Math.round(t.ms - uapi.ms) } : {}),
      });
    } catch (err) {
      this.recordPassDuration(started);
      this.reconcileErrors++;
      // The data plane may have gone or restarted: the model no longer stands for it.
      this.readNext = true;
      this.log.error('reconcile failed; the mesh stays as it is and the next pass retries', { error: (err as Error).message });
      this.again = true;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }

  private recordPassDuration(started: number): void {
    this.lastReconcileDurationMs = Date.now() - started;
    this.reconcileDurationMsTotal += this.lastReconcileDurationMs;
  }

  /** Adds the time since `since` to step `name` of this pass; returns now. */
  private step(name: string, since: number): number {
    const now = performance.now();
    this.steps[name] = (this.steps[name] ?? 0) + now - since;
    return now;
  }

  private async reconcile(full: boolean, read: boolean): Promise<void> {
    const s = this.settings;
    let t = performance.now();
    const watcher = this.watcher!;
    const nodes = watcher.list() as NodeObject[];
    const own = nodes.find((n) => n.metadata?.name === s.nodeName);
    if (own && full) {
      const local = await this.computeLocal(own);
      if (JSON.stringify(local) !== JSON.stringify(this.local)) {
        this.log.info('this node\'s pod CIDRs or addresses changed', { podCidrs: local.podCidrs, addresses: local.addresses });
        this.local = local;
      }
      await this.publish();
    }
    if (!s.firewallOnly) await this.followKeyFile();
    // Fail static: an API server that cannot be read or patched now must not hold up the mesh.
    await this.restoreOwnAnnotations(own).catch((err: Error) => this.log.warn('could not check or restore this Node\'s annotations; the next pass retries', { node: s.nodeName, error: err.message }));
    t = this.step('local', t);
    // A resync decides the changed Nodes only, like any pass: the tracker's result equals a full
    // desiredMesh (mesh-tracker.test.ts), and a forced full one held each change arriving during a
    // resync 200 ms longer at 5 000 Nodes.
    const tracked = this.meshTracker.update(nodes, {
      nodeName: s.nodeName, publicKey: this.publicKey || '-', podCidrs: this.local.podCidrs, addresses: this.local.addresses,
    }, {
      wgIpFamily: s.wgIpFamily, nativeRouting: s.nativeRouting, defaultListenPort: s.listenPort, persistentKeepalive: s.persistentKeepalive,
      podCidrAllowedRanges: s.podCidrAllowedRanges, workingAtOwnAddress: this.workingHere,
    });
    const mesh = tracked.state;
    this.meshDecided = tracked.decided;
    this.lastMesh = mesh;
    t = this.step('mesh', t);
    const refused = newOnes(this.refusedLogged, (mesh.refused ?? []).map((r) => ({ id: `${r.node}\n${r.field}\n${r.claim}`, item: r })));
    for (const r of refused) this.log.warn('refused a claim of a node: the rest of its claims and the mesh are unaffected', { node: r.node, field: r.field, claim: r.claim, reason: r.reason });
    this.refusedClaims += refused.length;
    for (const r of newOnes(this.rejectedLogged, mesh.rejected.map((r) => ({ id: `${r.node}\n${r.reason}`, item: r })))) {
      this.log.warn('skipping a node: its annotations are not usable', { node: r.node, reason: r.reason });
    }

    let hostRoutes: HostState['routes'];
    let hostFull = full;
    /** The data plane came up fresh in this pass: its new interface has no routes yet. */
    let freshTunnel = false;
    let probes: Array<() => void> = [];
    if (!s.firewallOnly) {
      const besideRead = read || full ? this.takeBesideRead() : undefined;
      let fresh = full ? await this.setUpTunnel(besideRead) : false;
      let snapshot: DeviceSnapshot;
      const fromModel = !read && !fresh && this.deviceModel !== undefined;
      if (fromModel) {
        snapshot = this.deviceModel!;
      } else {
        // A full pass has just read the device in setUpTunnel (a get=1 is 2 MB at 5 000 peers):
        // that read serves, unless something was set since.
        const tunnelRead = full ? this.tunnelRead : besideRead;
        this.tunnelRead = undefined;
        const device = tunnelRead ?? await this.uapi!.get().catch((err: Error) => {
          this.log.warn('the data plane does not answer; starting it again', { interface: s.interfaceName, error: err.message });
          return undefined;
        });
        const healthy = device !== undefined && device.privateKey !== undefined && keyToBase64(device.privateKey) === keyToBase64(this.privateKey!);
        if (!healthy) {
          // The data plane died or restarted under us: bring it back and give it its identity
          // before any peer; its new interface needs the routes again.
          fresh = (await this.setUpTunnel()) || fresh;
        }
        // One read per pass when the data plane was fine: at 5 000 peers a get=1 is 2 MB.
        snapshot = healthy ? device : await this.uapi!.get();
      }
      t = this.step('read', t);
      // Relay decisions judge liveness from the peers' counters, which only a fresh read has; a
      // pass planned from the model keeps the last decisions.
      const relayed = fromModel ? undefined : await this.relays.pass({
        nodes, mesh, device: snapshot, selfKey: this.publicKey, selfAddresses: this.local.addresses, unreachable: this.unreachable, nowWallMs: Date.now(),
      });
      const routed = relayed ? relayed.peers : this.relays.routed(mesh.peers);
      const live = this.relays.live;
      const wanted: MeshState = { ...mesh, peers: live ? keepLiveEndpoints(routed, snapshot, live, this.relays.relayedPeers()) : routed };
      this.lastMesh = wanted;
      const plan = planReconcile(wanted.peers, snapshot, this.memory, {
        collectGarbage: watcher.synced, canRemoveAllowedIp: this.canRemoveAllowedIp ?? false, nowWallMs: Date.now(), rewriteEndpoints: relayed?.directNow,
        live, ownForcedFamily: ownForcedFamily(own),
      });
      t = this.step('plan', t);
      // Until the set answers, the model is unknown: a failure makes the next pass read.
      this.deviceModel = undefined;
      if (plan.request) await this.setDevice(plan.request);
      let model = plan.request ? applySetToSnapshot(snapshot, plan.request) : snapshot;
      const kick = kickRequest(peersToKick(plan.actions, relayed?.directNow).map((p) => ({ publicKey: p.publicKeyBytes, persistentKeepalive: p.persistentKeepalive })));
      if (kick) {
        await this.setDevice(kick);
        model = applySetToSnapshot(model, kick);
      }
      this.deviceModel = model;
      t = this.step('set', t);
      if (relayed) {
        // What the data plane observed (roaming, handshakes) is only known from a fresh read.
        await this.publishDiscovered(wanted, snapshot, relayed.relayEndpoints);
        if (relayed.patch) {
          await patchNodeAnnotations(this.kc, s.nodeName, relayed.patch);
          this.relays.published(relayed.patch);
          this.written = { ...this.written, ...relayed.patch };
        }
        this.checkReachability(wanted, snapshot);
        this.workingHere = workingAtOwnAddress(mesh.peers, snapshot, Date.now());
      }
      for (const action of plan.actions) {
        if (action.kind === 'remove') this.log.info('removed a peer whose key no Node carries', { key: action.publicKey.slice(0, 8) });
        else this.log.info(action.kind === 'add' ? 'added a peer' : 'updated a peer', {
          node: action.peer.nodeName, key: action.peer.publicKey.slice(0, 8), endpoint: action.peer.endpoint, endpointSource: action.peer.endpointSource,
          ...(action.kind === 'update'
            ? { added: action.added, removed: action.removed, endpointSet: action.endpoint !== undefined, roamTakenBack: action.roamTakenBack }
            : { allowedIps: action.peer.allowedIps, carriedEndpoint: action.carriedEndpoint }),
        });
      }
      t = this.step('observe', t);
      // Path-MTU stalls are judged from the peers' counters, which only a fresh read has.
      const due = s.pathMtuDiscovery && !fromModel ? dueProbes(mesh.peers, mesh.tunnelRoutes, snapshot, this.pathMtus, Date.now()) : [];
      hostRoutes = { device: s.interfaceName, cidrs: routesWithPathMtu(mesh.tunnelRoutes, mesh.peers, this.pathMtus, this.tunnelMtu, s.pathMtuDiscovery) };
      hostFull ||= fresh;
      freshTunnel = fresh;
      probes = due.map((target) => () => this.probePathMtu(target, snapshot));
      await this.writeCni();
      t = this.step('routes', t);
    }

    // Pod CIDRs are canonical texts: the family is in the text.
    const cluster = { v4: [] as string[], v6: [] as string[] };
    for (const cidr of mesh.clusterPodCidrs) (cidr.includes(':') ? cluster.v6 : cluster.v4).push(cidr);
    const local = splitCidrsByFamily(this.local.podCidrs);
    const failures = this.hostLane.failures;
    const host = this.hostLane.apply({
      routes: hostRoutes,
      ruleset: {
        tableName: s.nftTable, masquerade: s.masquerade, filter: s.filter,
        clusterPodCidrs: cluster, localPodCidrs: { v4: local.v4, v6: local.v6 },
        clampMssTo: !s.firewallOnly && s.pathMtuDiscovery ? s.interfaceName : undefined,
      },
      full: hostFull,
    });
    // The pass that makes the agent ready, one after a fresh data plane (its new interface has
    // no routes) and one with path-MTU probes (each needs the route to its peer's gateway) wait
    // for the host; the others, resyncs included, go on while it is applied.
    if (!this.ready || freshTunnel || probes.length > 0) await host;
    for (const probe of probes) probe();
    t = this.step('nft', t);
    if (this.hostLane.failures > failures) return;
    if (watcher.synced && !this.ready) {
      this.ready = true;
      this.log.info('ready: the Node list is synced and the mesh is configured', { peers: mesh.peers.size, rejected: mesh.rejected.length });
    }
  }
}

/** `roamguard agent --cleanup`: removes what the agent created (rules, routes, CNI config, tunnel). */
export async function cleanup(settings: Settings, log: AgentLogger, runner: CommandRunner = systemRunner): Promise<void> {
  const { rm } = await import('node:fs/promises');
  await removeTable(settings.nftTable, runner).catch((err: Error) => log.warn('could not remove the nftables table', { error: err.message }));
  if (!settings.firewallOnly) {
    await removeRoutes({ device: settings.interfaceName, runner }).catch((err: Error) => log.warn('could not remove routes', { error: err.message }));
    await rm(settings.cniConfigPath, { force: true });
    // Deleting the interface ends the data plane, as `wg-quick down` does.
    await runner('ip', ['link', 'del', 'dev', settings.interfaceName]);
  }
  log.info('removed the nftables table, routes, CNI config and tunnel interface', { table: settings.nftTable, interface: settings.interfaceName });
}
