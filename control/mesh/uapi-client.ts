/**
 * A client for the WireGuard control socket (`/var/run/wireguard/IFNAME.sock`): the only way the
 * agent talks to a data plane, so roamguard's daemon and wireguard-go are driven the same way.
 * One connection per operation, as `wg` does; every operation has a deadline so a wedged daemon
 * cannot wedge the agent.
 */
import { connect } from 'node:net';
import { join } from 'node:path';
import {
  formatSetRequest, parseGetResponse, type DeviceSnapshot, type SetRequest,
} from '../../dataplane/uapi/uapi-protocol.ts';

export class UapiError extends Error {
  constructor(message: string, readonly errno?: number) {
    super(message);
    this.name = 'UapiError';
  }
}

/** errno values a daemon answers with when it does not understand a line. */
const EINVAL = -22;
const EPROTO = -71;

export class UapiClient {
  constructor(readonly socketPath: string, private readonly timeoutMs = 5000) {}

  static forInterface(socketDir: string, ifname: string, timeoutMs?: number): UapiClient {
    return new UapiClient(join(socketDir, `${ifname}.sock`), timeoutMs);
  }

  /** Sends `text` and resolves with everything up to and including the `errno=` line. */
  private exchange(text: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const socket = connect(this.socketPath);
      let answer = '';
      let settled = false;
      const finish = (err: Error | undefined, value?: string) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        socket.destroy();
        if (err) reject(err);
        else resolve(value!);
      };
      const timer = setTimeout(() => finish(new UapiError(`no answer on ${this.socketPath} within ${this.timeoutMs} ms`)), this.timeoutMs);
      socket.setEncoding('utf8');
      socket.on('connect', () => socket.write(text));
      socket.on('data', (chunk: string) => {
        answer += chunk;
        if (answer.length > 64 * 1024 * 1024) finish(new UapiError('answer larger than 64 MiB'));
        const at = answer.search(/(^|\n)errno=-?\d+\n/);
        if (at >= 0) finish(undefined, answer);
      });
      socket.on('error', (err) => finish(new UapiError(`${this.socketPath}: ${err.message}`)));
      socket.on('close', () => finish(new UapiError(`${this.socketPath} closed the connection before answering`)));
    });
  }

  async get(): Promise<DeviceSnapshot> {
    const parsed = parseGetResponse(await this.exchange('get=1\n\n'));
    if (!parsed.ok) throw new UapiError(`get: ${parsed.message}`, parsed.errno);
    return parsed.snapshot;
  }

  async set(request: SetRequest): Promise<void> {
    const answer = await this.exchange(formatSetRequest(request));
    const match = /errno=(-?\d+)\n/.exec(answer);
    const errno = Number(match?.[1]);
    if (errno !== 0) throw new UapiError(`set: the data plane answered errno=${errno}`, errno);
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
