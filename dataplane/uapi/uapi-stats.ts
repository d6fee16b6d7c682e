/**
 * The data plane's counters for the agent: one extra operation on the control socket,
 * `get=roamguard-stats`, answered only when asked for. Pure text in, structures out, no I/O.
 *
 * How the counters travel (a decision, and why):
 *
 * - Same socket (`/var/run/wireguard/IFNAME.sock`), a roamguard-only operation line. `wg` only
 *   ever sends `get=1` and `set=1`, and the `get=1` answer is left exactly as it was, so every
 *   `wg` command and every other UAPI client sees a standard WireGuard device.
 * - Not a second socket: `wg show` treats every `*.sock` in /var/run/wireguard as an interface,
 *   so a second socket there would appear as a bogus interface, and one elsewhere would need its
 *   own directory, lifecycle (stale-file detection, deletion watch), permissions and DaemonSet
 *   mount. The control socket already has all of that, is owner-only (0700, root), and the agent
 *   already talks to it.
 * - Graceful fallback: wireguard-go (and roamguard daemons that predate this operation) close the
 *   connection without an answer when the first line is not `get=1`/`set=1`; a daemon that knows
 *   the operation but has no counters answers with a non-zero errno. The client reports both as
 *   "not supported" (`UapiClient.stats()` resolves undefined), so the agent's metrics and
 *   `roamguard status` keep working against any UAPI data plane, with fewer series.
 *
 * Framing is that of `get=1`: the operation line, an empty line; the answer is `key=value` lines
 * ending with `errno=0` and an empty line. Device lines come first, then one block per peer,
 * each starting with its `public_key=` (hex, as in `get=1`):
 *
 *   stats_version=1
 *   worker_threads=2              threads that seal: the TUN's readers, one per queue
 *   drop.bad-mac1=0               one line per drop reason (dataplane/drop-counters.ts), zeros too
 *   ...
 *   pipeline_stalls=0             stalls the watchdog detected (dataplane/watchdog.ts), recovered or not
 *   pipeline_stalled_ms=0         how long the current stall has lasted (0 = none): what a liveness probe reads
 *   tun_queue_reads=N,N           packets each TUN queue's reader took from the kernel
 *   tun_replies_read=N,N          of those, reads the UDP reader made right after it wrote to the
 *                                 queue: replies it sealed and sent itself, not the queue's thread
 *   public_key=<hex>
 *   rx_bytes=... / tx_bytes=...   as in get=1 (one consistent snapshot)
 *   handshake_attempts=N          initiations sent
 *   handshakes_completed=N        sessions established, either side
 *   handshake_failures=N          initiations that got no response (timed out or superseded)
 *   handshake_pending=true|false  an initiation is waiting for its response
 *   endpoint_changes=N            the endpoint moved because the peer roamed
 *   staged_packets=N              packets waiting for a session
 *   errno=0
 *
 * Unknown keys are ignored by the parser (newer daemons may add some); a drop reason the parser
 * does not know is kept under its name.
 */
import { keyFromHex, keyToHex } from '../noise/keys.ts';
import { UAPI_ERRNO, quoteValue } from './uapi-protocol.ts';

/** The operation line (without its `\n`). */
export const STATS_OPERATION = 'get=roamguard-stats';
export const STATS_VERSION = 1;

export interface PeerStats {
  publicKey: Uint8Array;
  rxBytes: number;
  txBytes: number;
  /** Handshake initiations sent. */
  handshakeAttempts: number;
  /** Handshakes completed (sessions established), as initiator or responder. */
  handshakesCompleted: number;
  /** Initiations that got no response: retried after the timeout, superseded, or given up. */
  handshakeFailures: number;
  /** An initiation is in flight (waiting for the response). */
  handshakePending: boolean;
  /** How often the endpoint moved because an authenticated packet came from a new address. */
  endpointChanges: number;
  /** Outbound packets queued until a session exists. */
  stagedPackets: number;
}

export interface DeviceStats {
  version: number;
  /** Threads that seal: crypto workers where there is a pool, else the TUN's reader threads (0 = the main thread). */
  workerThreads: number;
  /** Batches queued for a crypto worker, not yet running (only daemons that had a crypto pool say). */
  workerQueueDepth?: number;
  /** Dropped packets by reason (every reason the daemon knows, zeros included). */
  drops: Record<string, number>;
  /** Stalls the watchdog detected in the crypto pool and the reader rings (absent: an older daemon). */
  pipelineStalls?: number;
  /** How long the stall in progress has lasted, 0 when none is (absent: an older daemon). */
  pipelineStalledMs?: number;
  /** Crypto workers replaced after they died or wedged (only daemons that had a crypto pool say). */
  workerRestarts?: number;
  /** Packets each TUN queue's reader took from the kernel, in queue order (absent: an older daemon, or a TUN without queues). */
  tunQueueReads?: number[];
  /**
   * Of those, reads the UDP reader made of each queue right after writing to it: replies it sealed
   * and sent itself, not the queue's thread (tun/reply-reader.ts; absent: an older daemon, or a TUN without queues).
   */
  tunRepliesRead?: number[];
  peers: PeerStats[];
}

export type StatsParseResult =
  | { ok: true; stats: DeviceStats }
  | { ok: false; errno: number; message: string };

function counter(n: number): string {
  if (!(n > 0) || !Number.isFinite(n)) return '0';
  return BigInt(Math.floor(n)).toString();
}

/** A count per TUN queue, in queue order: `N,N,...`. */
function perQueue(counts: number[]): string {
  return counts.map(counter).join(',');
}

/** The complete answer to `get=roamguard-stats`, ending with `errno=0` and an empty line. */
export function formatStatsResponse(stats: DeviceStats): string {
  const out = [
    `stats_version=${stats.version}`,
    `worker_threads=${counter(stats.workerThreads)}`,
  ];
  if (stats.workerQueueDepth !== undefined) out.push(`worker_queue_depth=${counter(stats.workerQueueDepth)}`);
  for (const [reason, n] of Object.entries(stats.drops)) {
    if (!/^[a-z0-9-]{1,64}$/.test(reason)) continue; // never emit a line the parser cannot read back
    out.push(`drop.${reason}=${counter(n)}`);
  }
  if (stats.pipelineStalls !== undefined) out.push(`pipeline_stalls=${counter(stats.pipelineStalls)}`);
  if (stats.pipelineStalledMs !== undefined) out.push(`pipeline_stalled_ms=${counter(stats.pipelineStalledMs)}`);
  if (stats.workerRestarts !== undefined) out.push(`worker_restarts=${counter(stats.workerRestarts)}`);
  if (stats.tunQueueReads !== undefined && stats.tunQueueReads.length > 0) out.push(`tun_queue_reads=${perQueue(stats.tunQueueReads)}`);
  if (stats.tunRepliesRead !== undefined && stats.tunRepliesRead.length > 0) out.push(`tun_replies_read=${perQueue(stats.tunRepliesRead)}`);
  for (const peer of stats.peers) {
    out.push(
      `public_key=${keyToHex(peer.publicKey)}`,
      `rx_bytes=${counter(peer.rxBytes)}`,
      `tx_bytes=${counter(peer.txBytes)}`,
      `handshake_attempts=${counter(peer.handshakeAttempts)}`,
      `handshakes_completed=${counter(peer.handshakesCompleted)}`,
      `handshake_failures=${counter(peer.handshakeFailures)}`,
      `handshake_pending=${peer.handshakePending ? 'true' : 'false'}`,
      `endpoint_changes=${counter(peer.endpointChanges)}`,
      `staged_packets=${counter(peer.stagedPackets)}`,
    );
  }
  out.push('errno=0', '', '');
  return out.join('\n');
}

class StatsParseError extends Error {}

function unsigned(key: string, value: string): number {
  if (!/^[0-9]{1,20}$/.test(value)) throw new StatsParseError(`${key}: not an unsigned decimal number: ${quoteValue(value)}`);
  const n = Number(value);
  if (n > Number.MAX_SAFE_INTEGER) throw new StatsParseError(`${key}: ${value} is larger than 2^53 - 1`);
  return n;
}

/** A `perQueue` value read back. */
function unsignedPerQueue(key: string, value: string): number[] {
  return value.split(',').map((v) => unsigned(key, v));
}

function newPeer(publicKey: Uint8Array): PeerStats {
  return {
    publicKey, rxBytes: 0, txBytes: 0, handshakeAttempts: 0, handshakesCompleted: 0, handshakeFailures: 0,
    handshakePending: false, endpointChanges: 0, stagedPackets: 0,
  };
}

/** Parses an answer to `get=roamguard-stats` (through its `errno=` line). */
export function parseStatsResponse(text: string): StatsParseResult {
  const stats: DeviceStats = { version: 0, workerThreads: 0, drops: {}, peers: [] };
  let peer: PeerStats | undefined;
  try {
    for (const line of text.split('\n')) {
      if (line === '') throw new StatsParseError('empty line before errno');
      const eq = line.indexOf('=');
      if (eq < 0) throw new StatsParseError('line without "="');
      const key = line.slice(0, eq);
      const value = line.slice(eq + 1);
      if (key === 'errno') {
        if (!/^-?[0-9]{1,10}$/.test(value)) throw new StatsParseError(`errno: not a number: ${quoteValue(value)}`);
        const errno = Number(value);
        return errno === 0 ? { ok: true, stats } : { ok: false, errno, message: `the data plane answered errno=${errno}` };
      }
      if (key === 'public_key') {
        let publicKey: Uint8Array;
        try {
          publicKey = keyFromHex(value);
        } catch {
          throw new StatsParseError('public_key: not a 32-byte key in hex');
        }
        peer = newPeer(publicKey);
        stats.peers.push(peer);
        continue;
      }
      if (!peer) {
        if (key === 'stats_version') stats.version = unsigned(key, value);
        else if (key === 'worker_threads') stats.workerThreads = unsigned(key, value);
        else if (key === 'worker_queue_depth') stats.workerQueueDepth = unsigned(key, value);
        else if (key.startsWith('drop.') && key.length > 5) stats.drops[key.slice(5)] = unsigned(key, value);
        else if (key === 'pipeline_stalls') stats.pipelineStalls = unsigned(key, value);
        else if (key === 'pipeline_stalled_ms') stats.pipelineStalledMs = unsigned(key, value);
        else if (key === 'worker_restarts') stats.workerRestarts = unsigned(key, value);
        else if (key === 'tun_queue_reads') stats.tunQueueReads = unsignedPerQueue(key, value);
        else if (key === 'tun_replies_read') stats.tunRepliesRead = unsignedPerQueue(key, value);
        continue;
      }
      switch (key) {
        case 'rx_bytes': peer.rxBytes = unsigned(key, value); break;
        case 'tx_bytes': peer.txBytes = unsigned(key, value); break;
        case 'handshake_attempts': peer.handshakeAttempts = unsigned(key, value); break;
        case 'handshakes_completed': peer.handshakesCompleted = unsigned(key, value); break;
        case 'handshake_failures': peer.handshakeFailures = unsigned(key, value); break;
        case 'handshake_pending':
          if (value !== 'true' && value !== 'false') throw new StatsParseError(`handshake_pending: expected true or false, got ${quoteValue(value)}`);
          peer.handshakePending = value === 'true';
          break;
        case 'endpoint_changes': peer.endpointChanges = unsigned(key, value); break;
        case 'staged_packets': peer.stagedPackets = unsigned(key, value); break;
        default: break; // keys of newer daemons
      }
    }
  } catch (err) {
    if (!(err instanceof StatsParseError)) throw err;
    return { ok: false, errno: UAPI_ERRNO.EPROTO, message: err.message };
  }
  return { ok: false, errno: UAPI_ERRNO.EPROTO, message: 'the answer ended without an errno line' };
}
