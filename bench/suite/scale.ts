/**
 * The scale run: one roamguard daemon (Node, default crypto threads) in namespace B with many
 * peers, configured and queried through its control socket, then handshaking with a simulated
 * peer set in namespace A (scale-child.ts: one WireGuardCore, key and source address per peer).
 *
 * Measures the daemon's RSS idle, with the peers configured and after the handshakes (and its
 * peak), the `set` that adds the peers, `get=1` round trips with every peer (median of several,
 * before and after the handshakes), and the handshakes: when the simulated peers had all their
 * responses, and when the daemon's `get` showed a handshake for every peer (the keepalive that
 * confirms the session arrived), with cookie replies and retransmissions counted.
 *
 * The simulated peers' source addresses come from 198.19.0.0/16 (RFC 2544's benchmarking range,
 * only inside the namespaces): a `local` route in A lets the helper bind any of them, a route in
 * B sends the answers back over the veth.
 */
import { join } from 'node:path';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { parsePrefix } from '../../dataplane/net/ip.ts';
import { generatePrivateKey, keyToHex } from '../../dataplane/noise/keys.ts';
import type { PeerChange } from '../../dataplane/uapi/uapi-protocol.ts';
import { Scope, WG_SOCKET_DIR, type PairTopology } from '../../test/system/netns.ts';
import { peerInnerAddress } from '../micro/peer-memory.ts';
import { runJsonLinesChild, scriptCommand } from './children.ts';
import { cpuSeconds, memoryStatus } from './procfs.ts';
import { MAX_SCALE_PEERS, type ScaleChildConfig, type ScaleChildMessage, type ScaleChildResult } from './scale-types.ts';
import { maximum, median } from './stats.ts';
import { SUBJECTS, startRoamguard } from './subjects.ts';
import { uapiGet, uapiSet } from './uapi-client.ts';

export interface ScaleSettings {
  peers: number;
  /** `get=1` round trips per measurement. */
  getSamples: number;
  /** Initiations per second from the simulated peers; 0 = all at once. */
  rate: number;
  /** Give the handshakes this long, ms. */
  timeoutMs: number;
}

/** The daemon's UDP port in the scale run. */
export const SCALE_PORT = 51830;
/** Where the simulated peers' source addresses come from. */
export const SCALE_SOURCE_PREFIX = '198.19.0.0/16';

/** The source address of simulated peer `i`: 198.19.0.1, …, 198.19.0.250, 198.19.1.1, … */
export function scaleSourceAddress(i: number): string {
  if (!Number.isInteger(i) || i < 0 || i >= MAX_SCALE_PEERS) throw new RangeError(`no source address for peer ${i}`);
  return `198.19.${Math.floor(i / 250)}.${(i % 250) + 1}`;
}

export interface GetTiming {
  samples: number;
  medianMs: number;
  maxMs: number;
  /** Size of one answer, bytes. */
  bytes: number;
}

export interface ScaleResult {
  peers: number;
  daemon: string;
  rss: { idleBytes: number; withPeersBytes: number; afterHandshakesBytes?: number; peakBytes: number };
  /** (RSS with the peers − RSS idle) / peers. */
  rssPerPeerBytes: number;
  /** One `set=1` adding every peer (public key and one /32), ms. */
  setMs: number;
  getIdle: GetTiming;
  getAfter?: GetTiming;
  handshakes?: ScaleChildResult & {
    /** Peers the daemon's `get` showed with a handshake at the end. */
    daemonConfirmed: number;
    /** From the helper's start until a `get` showed every peer with a handshake, ms (NaN if never). */
    daemonConfirmedMs: number;
    /** CPU seconds of the daemon (all threads) from the start of the handshakes until all were confirmed. */
    daemonCpuSeconds: number;
    rate: number;
    sources: number;
  };
  notes: string[];
}

/** Expected seconds (for the time-left estimate). */
export const scaleSeconds = (quick: boolean): number => (quick ? 14 : 20);

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

async function timeGets(socket: string, samples: number, peers: number): Promise<GetTiming> {
  const times: number[] = [];
  let bytes = 0;
  for (let i = 0; i < samples; i++) {
    const g = await uapiGet(socket);
    if (g.snapshot.peers.length !== peers) throw new Error(`get=1 shows ${g.snapshot.peers.length} peers, expected ${peers}`);
    times.push(g.ms);
    bytes = g.bytes;
  }
  return { samples, medianMs: median(times), maxMs: maximum(times), bytes };
}

export async function runScale(topo: PairTopology, settings: ScaleSettings, progress: (line: string) => void): Promise<ScaleResult> {
  const n = settings.peers;
  const scope = new Scope();
  const notes: string[] = [];
  try {
    progress(`    starting a roamguard daemon (node) in B`);
    const spec = SUBJECTS.find((s) => s.id === 'node')!;
    const daemon = await startRoamguard(scope, topo.b, spec, 'b', 'error');
    const socket = join(WG_SOCKET_DIR, `${daemon.ifname}.sock`);
    await topo.b.ip(['link', 'set', 'dev', daemon.ifname, 'up']);
    const alive = () => { if (!daemon.process.running) throw new Error(`the daemon exited\n${daemon.process.describe()}`); };

    const crypto = await selectCrypto();
    const daemonKey = generatePrivateKey(crypto);
    await uapiSet(socket, { privateKey: daemonKey, listenPort: SCALE_PORT, replacePeers: false, peers: [] });
    await sleep(500);
    const idle = memoryStatus(daemon.pid);

    progress(`    configuring ${n} peers with one set=1`);
    const privateKeys = Array.from({ length: n }, () => generatePrivateKey(crypto));
    const peers: PeerChange[] = privateKeys.map((key, i) => ({
      publicKey: crypto.publicKey(key), remove: false, updateOnly: false, replaceAllowedIps: false,
      allowedIps: [{ prefix: parsePrefix(`${peerInnerAddress(i)}/32`), remove: false }],
    }));
    const setMs = await uapiSet(socket, { replacePeers: false, peers });
    await sleep(500);
    alive();
    const withPeers = memoryStatus(daemon.pid);

    progress(`    ${settings.getSamples} × get=1 with ${n} peers`);
    const getIdle = await timeGets(socket, settings.getSamples, n);

    const result: ScaleResult = {
      peers: n, daemon: `roamguard node (pid ${daemon.pid})`,
      rss: { idleBytes: idle.rssBytes, withPeersBytes: withPeers.rssBytes, peakBytes: withPeers.peakRssBytes },
      rssPerPeerBytes: (withPeers.rssBytes - idle.rssBytes) / n,
      setMs, getIdle, notes,
    };

    // The simulated peers: one source address each, routed between the namespaces.
    await topo.a.ip(['route', 'add', 'local', SCALE_SOURCE_PREFIX, 'dev', 'lo']);
    scope.defer('remove the scale run\'s local route in A', async () => { await topo.a.ip(['route', 'del', 'local', SCALE_SOURCE_PREFIX, 'dev', 'lo'], { allowFailure: true }); });
    await topo.b.ip(['route', 'add', SCALE_SOURCE_PREFIX, 'via', topo.linkA.ipv4]);
    scope.defer('remove the scale run\'s route in B', async () => { await topo.b.ip(['route', 'del', SCALE_SOURCE_PREFIX], { allowFailure: true }); });

    const config: ScaleChildConfig = {
      daemon: { publicKeyHex: keyToHex(crypto.publicKey(daemonKey)), host: topo.linkB.ipv4, port: SCALE_PORT },
      privateKeysHex: privateKeys.map(keyToHex),
      sourceAddresses: privateKeys.map((_, i) => scaleSourceAddress(i)),
      rate: settings.rate,
      timeoutMs: settings.timeoutMs,
    };
    progress(`    ${n} simulated peers in A handshake with the daemon (${settings.rate > 0 ? `${settings.rate} initiations/s` : 'all at once'})`);
    const { cmd, args } = scriptCommand('node', 'bench/suite/scale-child.ts');
    let startedAt: number | undefined;
    let cpuAtStart = 0;
    let helperResult: ScaleChildResult | undefined;
    let helperDone = false;
    const helper = runJsonLinesChild(scope, topo.a, cmd, args, {
      label: 'scale run helper (simulated peers)',
      input: `${JSON.stringify(config)}\n`,
      timeoutMs: settings.timeoutMs + 60_000,
      onMessage(message) {
        const m = message as ScaleChildMessage;
        if (m.type === 'started') { startedAt = performance.now(); cpuAtStart = cpuSeconds(daemon.pid); }
        else if (m.type === 'progress') progress(`    ${m.completed}/${n} handshakes after ${(m.elapsedMs / 1000).toFixed(1)} s (${m.initiationsSent} initiations sent, ${m.cookieRepliesReceived} cookie replies)`);
        else if (m.type === 'result') helperResult = m.result;
      },
    }).finally(() => { helperDone = true; });

    // Watch the daemon's side: every peer with a handshake in `get=1`.
    let daemonConfirmed = 0;
    let daemonConfirmedMs = Number.NaN;
    let cpuAtConfirmed: number | undefined;
    let helperFinishedAt: number | undefined;
    let pollError: Error | undefined;
    while (true) {
      await sleep(400);
      if (!daemon.process.running) break;
      if (startedAt === undefined) { if (helperDone) break; continue; }
      try {
        const g = await uapiGet(socket);
        daemonConfirmed = g.snapshot.peers.filter((p) => p.lastHandshakeWallMs > 0).length;
        if (daemonConfirmed === n) {
          daemonConfirmedMs = performance.now() - startedAt;
          cpuAtConfirmed = cpuSeconds(daemon.pid);
          break;
        }
      } catch (err) { pollError = err as Error; }
      if (helperDone) {
        helperFinishedAt ??= performance.now();
        if (performance.now() - helperFinishedAt > 2000) break; // the last keepalives had their time
      }
      if (performance.now() - startedAt > settings.timeoutMs + 5000) break;
    }
    await helper;
    alive();
    if (pollError && daemonConfirmed < n) notes.push(`get=1 during the handshakes failed: ${pollError.message.split('\n')[0]}`);
    if (!helperResult) throw new Error('the scale helper printed no result');
    const h = helperResult;
    // JSON has no NaN: the helper's missing figures arrive as null.
    for (const k of ['allDoneMs', 'p50Ms', 'p90Ms'] as const) if (typeof h[k] !== 'number') h[k] = Number.NaN;
    result.handshakes = {
      ...h, daemonConfirmed, daemonConfirmedMs,
      daemonCpuSeconds: (cpuAtConfirmed ?? cpuSeconds(daemon.pid)) - cpuAtStart,
      rate: settings.rate, sources: n,
    };
    if (h.completed < n) notes.push(`${n - h.completed} of ${n} simulated peers had no handshake after ${Math.round(h.elapsedMs / 1000)} s`);

    const after = memoryStatus(daemon.pid);
    result.rss.afterHandshakesBytes = after.rssBytes;
    result.rss.peakBytes = after.peakRssBytes;
    progress(`    ${settings.getSamples} × get=1 with ${n} peers after the handshakes`);
    result.getAfter = await timeGets(socket, settings.getSamples, n);
    alive();
    return result;
  } finally {
    await scope.cleanup();
  }
}
