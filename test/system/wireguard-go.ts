/**
 * Debian's wireguard-go as a reference peer in a network namespace.
 *
 * `wireguard-go -f IFNAME` is spawned inside the namespace (its TUN lives there; its control
 * socket is /var/run/wireguard/IFNAME.sock, shared by all namespaces, hence unique names). It is
 * configured only with `wg` (`ip netns exec NS wg set …`), addressed and brought up with `ip`,
 * inspected with `wg show IFNAME dump`, and stopped by pid. Keys come from `wg genkey`/`wg pubkey`;
 * key files live in a private temporary directory (files mode 0600) removed at cleanup.
 */
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { run, uniqueName, waitFor, WG_SOCKET_DIR, type Namespace, type NsProcess, type RunResult, type Scope } from './netns.ts';

export interface KeyPair {
  /** base64, as `wg` prints it */
  privateKey: string;
  publicKey: string;
}

/** A fresh key pair from `wg genkey` / `wg pubkey`. */
export async function generateKeyPair(): Promise<KeyPair> {
  const privateKey = (await run('wg', ['genkey'])).stdout.trim();
  const publicKey = await publicKeyOf(privateKey);
  return { privateKey, publicKey };
}

/** `wg pubkey` of a base64 private key. */
export async function publicKeyOf(privateKey: string): Promise<string> {
  return (await run('wg', ['pubkey'], { input: `${privateKey}\n` })).stdout.trim();
}

/** A preshared key from `wg genpsk` (base64). */
export async function generatePresharedKey(): Promise<string> {
  return (await run('wg', ['genpsk'])).stdout.trim();
}

export function keyBytes(base64: string): Uint8Array {
  const bytes = new Uint8Array(Buffer.from(base64, 'base64'));
  if (bytes.length !== 32) throw new Error(`a WireGuard key has 32 bytes, got ${bytes.length}`);
  return bytes;
}

export interface PeerConfig {
  publicKey: string;
  /** CIDR strings. */
  allowedIps?: readonly string[];
  /** `ip:port` or `[ipv6]:port`. */
  endpoint?: string;
  /** Seconds; 0 = off. */
  persistentKeepalive?: number;
  /** base64 */
  presharedKey?: string;
}

export interface DeviceConfig {
  /** base64 private key; omitted = keep the current one. */
  privateKey?: string;
  listenPort?: number;
  fwmark?: number;
  peers?: readonly PeerConfig[];
}

export interface DumpPeer {
  publicKey: string;
  /** undefined when none */
  presharedKey?: string;
  /** undefined when none, else `ip:port` / `[ipv6]:port` */
  endpoint?: string;
  allowedIps: string[];
  /** Unix seconds of the latest handshake; 0 = never. */
  latestHandshake: number;
  rxBytes: number;
  txBytes: number;
  /** Seconds; 0 = off. */
  persistentKeepalive: number;
}

export interface Dump {
  privateKey?: string;
  publicKey?: string;
  listenPort: number;
  /** 0 = off */
  fwmark: number;
  peers: DumpPeer[];
}

const orNone = (field: string): string | undefined => (field === '(none)' || field === '' ? undefined : field);
const offOrNumber = (field: string): number => (field === 'off' ? 0 : Number(field));

/**
 * Parses `wg show IFNAME dump`: a device line (private key, public key, listen port, fwmark) then
 * one line per peer (public key, preshared key, endpoint, allowed ips, latest handshake, rx, tx,
 * persistent keepalive), tab-separated.
 */
export function parseDump(text: string): Dump {
  const lines = text.split('\n').filter((l) => l.length > 0);
  if (lines.length === 0) throw new Error('empty `wg show dump` output');
  const device = lines[0].split('\t');
  if (device.length !== 4) throw new Error(`unexpected device line in wg dump: ${JSON.stringify(lines[0])}`);
  const peers = lines.slice(1).map((line): DumpPeer => {
    const f = line.split('\t');
    if (f.length !== 8) throw new Error(`unexpected peer line in wg dump: ${JSON.stringify(line)}`);
    return {
      publicKey: f[0],
      presharedKey: orNone(f[1]),
      endpoint: orNone(f[2]),
      allowedIps: orNone(f[3]) === undefined ? [] : f[3].split(','),
      latestHandshake: Number(f[4]),
      rxBytes: Number(f[5]),
      txBytes: Number(f[6]),
      persistentKeepalive: offOrNumber(f[7]),
    };
  });
  return {
    privateKey: orNone(device[0]),
    publicKey: orNone(device[1]),
    listenPort: Number(device[2]),
    fwmark: offOrNumber(device[3]),
    peers,
  };
}

export interface StartOptions {
  /** Interface name; default a unique `rg…` name. At most 15 characters. */
  ifname?: string;
  /** wireguard-go log level (LOG_LEVEL): 'verbose' | 'error' | 'silent'. Default 'error'. */
  logLevel?: 'verbose' | 'debug' | 'error' | 'silent';
  /** How long to wait for the TUN and the control socket. Default 5000 ms. */
  startTimeoutMs?: number;
}

/** One wireguard-go process with its TUN `ifname` in namespace `ns`. */
export class WireGuardGo {
  private keyFileCount = 0;

  private constructor(
    readonly scope: Scope,
    readonly ns: Namespace,
    readonly ifname: string,
    readonly process: NsProcess,
    private readonly keyDir: string,
  ) {}

  /** Path of the UAPI control socket. */
  get socketPath(): string {
    return join(WG_SOCKET_DIR, `${this.ifname}.sock`);
  }

  /**
   * Starts `wireguard-go -f IFNAME` inside `ns` and waits until its TUN and control socket exist.
   * Cleanup (registered in `scope`): stop by pid, then remove the socket if it was left behind.
   */
  static async start(scope: Scope, ns: Namespace, options: StartOptions = {}): Promise<WireGuardGo> {
    const ifname = options.ifname ?? uniqueName('rg');
    if (ifname.length > 15) throw new Error(`interface name too long: ${ifname}`);
    const socketPath = join(WG_SOCKET_DIR, `${ifname}.sock`);
    if (existsSync(socketPath)) throw new Error(`${socketPath} already exists: interface name ${ifname} is in use`);
    const keyDir = scope.tempDir('roamguard-wg-keys-');
    // Registered before the process: cleanup runs in reverse, so the socket is removed after the stop.
    scope.removeFileAtCleanup(socketPath);
    const proc = scope.spawn(ns, 'wireguard-go', ['-f', ifname], {
      env: { LOG_LEVEL: options.logLevel ?? 'error' },
      label: `wireguard-go ${ifname} in ${ns.name}`,
    });
    const wg = new WireGuardGo(scope, ns, ifname, proc, keyDir);
    try {
      await waitFor(async () => {
        if (!proc.running) throw new Error('exited');
        if (!existsSync(socketPath)) return false;
        const link = await ns.ip(['link', 'show', 'dev', ifname], { allowFailure: true });
        return link.code === 0;
      }, options.startTimeoutMs ?? 5000, { description: `wireguard-go ${ifname} to create its TUN and control socket` });
    } catch (err) {
      throw new Error(`${(err as Error).message}\n${proc.describe()}`);
    }
    return wg;
  }

  /** Runs `wg ARGS` inside the namespace. */
  wg(args: readonly string[]): Promise<RunResult> {
    return this.ns.exec('wg', args);
  }

  /** Writes a key to a fresh 0600 file in the private key directory and returns its path. */
  private keyFile(base64: string): string {
    const path = join(this.keyDir, `key-${this.keyFileCount++}`);
    writeFileSync(path, `${base64}\n`, { mode: 0o600 });
    return path;
  }

  /** Applies a configuration with one `wg set` (peers are added or updated, never removed). */
  async configure(config: DeviceConfig): Promise<void> {
    const args = ['set', this.ifname];
    if (config.listenPort !== undefined) args.push('listen-port', String(config.listenPort));
    if (config.fwmark !== undefined) args.push('fwmark', String(config.fwmark));
    if (config.privateKey !== undefined) args.push('private-key', this.keyFile(config.privateKey));
    for (const peer of config.peers ?? []) {
      args.push('peer', peer.publicKey);
      if (peer.presharedKey !== undefined) args.push('preshared-key', this.keyFile(peer.presharedKey));
      if (peer.endpoint !== undefined) args.push('endpoint', peer.endpoint);
      if (peer.persistentKeepalive !== undefined) {
        args.push('persistent-keepalive', peer.persistentKeepalive === 0 ? 'off' : String(peer.persistentKeepalive));
      }
      if (peer.allowedIps !== undefined) args.push('allowed-ips', peer.allowedIps.join(','));
    }
    await this.wg(args);
  }

  /** Removes a peer (`wg set IFNAME peer KEY remove`). */
  async removePeer(publicKey: string): Promise<void> {
    await this.wg(['set', this.ifname, 'peer', publicKey, 'remove']);
  }

  /** Adds an address (CIDR) to the TUN; IPv6 addresses get `nodad`. */
  async addAddress(cidr: string): Promise<void> {
    const args = ['addr', 'add', cidr, 'dev', this.ifname];
    if (cidr.includes(':')) args.push('nodad');
    await this.ns.ip(args);
  }

  async setMtu(mtu: number): Promise<void> {
    await this.ns.ip(['link', 'set', 'dev', this.ifname, 'mtu', String(mtu)]);
  }

  /** Brings the TUN up (wireguard-go then binds its UDP port and starts the peers). */
  async up(): Promise<void> {
    await this.ns.ip(['link', 'set', 'dev', this.ifname, 'up']);
  }

  /** `wg show IFNAME dump`, parsed. */
  async dump(): Promise<Dump> {
    return parseDump((await this.wg(['show', this.ifname, 'dump'])).stdout);
  }

  async peer(publicKey: string): Promise<DumpPeer | undefined> {
    return (await this.dump()).peers.find((p) => p.publicKey === publicKey);
  }

  /** Stops the process by pid (SIGTERM, then SIGKILL); wireguard-go removes TUN and socket itself. */
  async stop(): Promise<void> {
    await this.process.stop();
  }

  describe(): string {
    return this.process.describe();
  }
}
