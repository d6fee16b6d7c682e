/**
 * A client for the WireGuard control socket (`/var/run/wireguard/IFNAME.sock`). The agent drives
 * every data plane through it (roamguard's daemon and wireguard-go alike: this is the only way the
 * control plane reaches the data plane), and the bench suite times it.
 * One connection per operation, as `wg` does; every operation has a deadline so a wedged daemon
 * cannot wedge its caller.
 */
import { connect } from 'node:net';
import { join } from 'node:path';
import {
  formatSetRequest, parseGetResponse, type DeviceSnapshot, type SetRequest, type SnapshotInterning,
} from './uapi-protocol.ts';
import { STATS_OPERATION, parseStatsResponse, type DeviceStats } from './uapi-stats.ts';

/**
 * True once `text` holds a complete answer: it ends with an `errno=` line and an empty line.
 * Called after every chunk of the answer, so it looks at the last line only: a regular expression
 * anchored at the end still scans the whole text, which made reading a 2 MB `get=1` (5 000 peers)
 * quadratic, over a second of CPU in 16 KiB chunks.
 */
export function isCompleteAnswer(text: string): boolean {
  if (!text.endsWith('\n\n')) return false;
  const lastLine = text.slice(text.lastIndexOf('\n', text.length - 3) + 1, text.length - 2);
  return /^errno=-?\d+$/.test(lastLine);
}

export class UapiError extends Error {
  /**
   * @param closedWithoutAnswer the daemon accepted the connection and closed it without an
   *   answer: what wireguard-go does with an operation it does not know.
   */
  constructor(message: string, readonly errno?: number, readonly closedWithoutAnswer = false) {
    super(message);
    this.name = 'UapiError';
  }
}

/** errno values a daemon answers with when it does not understand a line. */
const EINVAL = -22;
const EPROTO = -71;

/** What one client has exchanged so far (the agent reports it per reconcile pass). */
export interface UapiTraffic {
  operations: number;
  bytesSent: number;
  bytesReceived: number;
  /** Summed round-trip time, ms. */
  ms: number;
}

export class UapiClient {
  readonly traffic: UapiTraffic = { operations: 0, bytesSent: 0, bytesReceived: 0, ms: 0 };

  /** @param interning what `get` answers share between peers (see parseGetResponse) */
  constructor(readonly socketPath: string, private readonly timeoutMs = 5000, private readonly interning?: SnapshotInterning) {}

  static forInterface(socketDir: string, ifname: string, timeoutMs?: number, interning?: SnapshotInterning): UapiClient {
    return new UapiClient(join(socketDir, `${ifname}.sock`), timeoutMs, interning);
  }

  /** Sends one whole operation (`text` ends with its empty line); resolves with the answer, through its `errno=` line. */
  exchange(text: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const started = performance.now();
      const socket = connect(this.socketPath);
      let answer = '';
      let settled = false;
      const finish = (err: Error | undefined, value?: string) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        socket.destroy();
        this.traffic.operations++;
        // The protocol is ASCII: characters are bytes.
        this.traffic.bytesSent += text.length;
        this.traffic.bytesReceived += answer.length;
        this.traffic.ms += performance.now() - started;
        if (err) reject(err);
        else resolve(value!);
      };
      const timer = setTimeout(() => finish(new UapiError(`no answer on ${this.socketPath} within ${this.timeoutMs} ms`)), this.timeoutMs);
      socket.setEncoding('utf8');
      socket.on('connect', () => socket.write(text));
      socket.on('data', (chunk: string) => {
        answer += chunk;
        if (answer.length > 64 * 1024 * 1024) finish(new UapiError('answer larger than 64 MiB'));
        if (isCompleteAnswer(answer)) finish(undefined, answer);
      });
      socket.on('error', (err) => finish(new UapiError(`${this.socketPath}: ${err.message}`)));
      socket.on('close', () => finish(new UapiError(`${this.socketPath} closed the connection before answering`, undefined, true)));
    });
  }

  async get(): Promise<DeviceSnapshot> {
    const parsed = parseGetResponse(await this.exchange('get=1\n\n'), this.interning);
    if (!parsed.ok) throw new UapiError(`get: ${parsed.message}`, parsed.errno);
    return parsed.snapshot;
  }

  async set(request: SetRequest): Promise<void> {
    const answer = await this.exchange(formatSetRequest(request));
    const match = /errno=(-?\d+)\n/.exec(answer);
    const errno = Number(match?.[1]);
    if (errno !== 0) throw new UapiError(`set: the data plane answered errno=${errno}`, errno);
  }

  /**
   * roamguard's counters (`get=roamguard-stats`, see uapi-stats.ts), or undefined when the data
   * plane does not offer them (wireguard-go and older daemons close the connection on the unknown
   * operation; a daemon without counters answers an errno). Rejects only when nothing answers
   * at all (no socket, timeout) or the answer is malformed.
   */
  async stats(): Promise<DeviceStats | undefined> {
    let answer: string;
    try {
      answer = await this.exchange(`${STATS_OPERATION}\n\n`);
    } catch (err) {
      if (err instanceof UapiError && err.closedWithoutAnswer) return undefined;
      throw err;
    }
    const parsed = parseStatsResponse(answer);
    if (parsed.ok) return parsed.stats;
    if (/(^|\n)errno=-?[1-9]\d*\n\n$/.test(answer)) return undefined; // refused: not supported here
    throw new UapiError(`stats: ${parsed.message}`, parsed.errno);
  }

  /** True when something answers `get` on the socket. */
  async alive(): Promise<boolean> {
    try {
      await this.get();
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Whether the data plane accepts `allowed_ip=-prefix` (removal of one prefix). Probed with a
   * harmless request (update_only on a key no peer has): old wireguard-go rejects the line.
   */
  async supportsAllowedIpRemoval(): Promise<boolean> {
    const probeKey = new Uint8Array(32).fill(0x5a);
    try {
      await this.set({
        replacePeers: false,
        peers: [{ publicKey: probeKey, remove: false, updateOnly: true, replaceAllowedIps: false, allowedIps: [{ prefix: { address: new Uint8Array(4), bits: 32 }, remove: true }] }],
      });
      return true;
    } catch (err) {
      if (err instanceof UapiError && (err.errno === EINVAL || err.errno === EPROTO)) return false;
      throw err;
    }
  }
}
