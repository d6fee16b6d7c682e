/**
 * Userspace WireGuard daemons as peers in a network namespace, driven only with `wg`.
 *
 * {@link WgDaemon} runs any wireguard-go-compatible daemon (`DAEMON -f IFNAME`) in the foreground
 * inside a namespace (its TUN lives there; its control socket is /var/run/wireguard/IFNAME.sock,
 * shared by all namespaces, hence unique names). It is configured only with `wg`
 * (`ip netns exec NS wg set …`), addressed and brought up with `ip`, inspected with
 * `wg show IFNAME dump`, stopped by pid and restarted under the same name. {@link WireGuardGo} is
 * Debian's wireguard-go; test/system/userspace-wg.ts adds roamguard under Node.js and Bun.
 * Keys come from `wg genkey`/`wg pubkey`; key files live in a private temporary directory (files
 * mode 0600) removed at cleanup.
 */
import { existsSync, unlinkSync, writeFileSync } from 'node:fs';
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
  /** The daemon's LOG_LEVEL: 'verbose' | 'debug' | 'error' | 'silent'. Default: $LOG_LEVEL, else 'error'. */
  logLevel?: 'verbose' | 'debug' | 'error' | 'silent';
  /** How long to wait for the TUN and the control socket. Default 5000 ms. */
  startTimeoutMs?: number;
  /** Extra environment for the daemon process. */
  env?: Record<string, string>;
  /** Bytes of the daemon's stdout/stderr kept for diagnostics and log checks. Default 64 KiB each. */
  keepOutputBytes?: number;
}

/** How to start one userspace WireGuard daemon in the foreground for interface `ifname`. */
export interface LaunchSpec {
  command: string;
  args: readonly string[];
  env: Record<string, string>;
  /** Name used in messages, e.g. `wireguard-go rgab12cd`. */
  label: string;
}

/**
 * Any wireguard-go-compatible userspace WireGuard daemon (`DAEMON -f IFNAME`) with its TUN
 * `ifname` in namespace `ns`, run in the foreground so the test owns its pid.
 *
 * The daemon is spawned inside the namespace (its TUN lives there; its control socket is
 * /var/run/wireguard/IFNAME.sock, shared by all namespaces, hence unique names). It is configured
 * only with `wg` (`ip netns exec NS wg set …`), addressed and brought up with `ip`, inspected with
 * `wg show IFNAME dump`, and stopped by pid. Every configuration step (`configure`, `removePeer`,
 * `addAddress`, `setMtu`, `up`) is recorded so {@link restart} can replay it on the new process.
 */
export class WgDaemon {
  private keyFileCount = 0;
  private current: NsProcess | undefined;
  /** Configuration steps in order, replayed after a restart. */
  private readonly steps: Array<() => Promise<void>> = [];
  private readonly keyDir: string;

  protected constructor(
    readonly scope: Scope,
    readonly ns: Namespace,
    readonly ifname: string,
    private readonly spec: LaunchSpec,
    private readonly options: StartOptions,
  ) {
    if (ifname.length > 15) throw new Error(`interface name too long: ${ifname}`);
    this.keyDir = scope.tempDir('roamguard-wg-keys-');
    // Registered before any process: cleanup runs in reverse, so the socket is removed after the stop.
    scope.removeFileAtCleanup(this.socketPath);
  }

  /** Path of the UAPI control socket. */
  get socketPath(): string {
    return join(WG_SOCKET_DIR, `${this.ifname}.sock`);
  }

  /** The current daemon process (a new one after each restart). */
  get process(): NsProcess {
    if (!this.current) throw new Error(`${this.spec.label} was never started`);
    return this.current;
  }

  get label(): string {
    return this.spec.label;
  }

  /**
   * Spawns the daemon inside the namespace and waits until its TUN and control socket exist.
   * The process is registered in the scope: stopped by pid at cleanup.
   */
  protected async launch(): Promise<void> {
    if (existsSync(this.socketPath)) throw new Error(`${this.socketPath} already exists: interface name ${this.ifname} is in use`);
    const proc = this.scope.spawn(this.ns, this.spec.command, this.spec.args, {
      env: this.spec.env,
      label: `${this.spec.label} in ${this.ns.name}`,
      keepOutputBytes: this.options.keepOutputBytes,
    });
    this.current = proc;
    const timeoutMs = this.options.startTimeoutMs ?? 5000;
    try {
      await waitFor(async () => {
        if (!proc.running) throw new Error('exited');
        if (!existsSync(this.socketPath)) return false;
        const link = await this.ns.ip(['link', 'show', 'dev', this.ifname], { allowFailure: true });
        return link.code === 0;
      }, timeoutMs, { description: `${this.spec.label} to create its TUN and control socket` });
    } catch (err) {
      throw new Error(`${(err as Error).message}\n${proc.describe()}`);
    }
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

  /** Runs a configuration step now and records it for {@link restart}. */
  private async step(apply: () => Promise<void>): Promise<void> {
    await apply();
    this.steps.push(apply);
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
    await this.step(async () => { await this.wg(args); });
  }

  /** Removes a peer (`wg set IFNAME peer KEY remove`). */
  async removePeer(publicKey: string): Promise<void> {
    await this.step(async () => { await this.wg(['set', this.ifname, 'peer', publicKey, 'remove']); });
  }

  /** Adds an address (CIDR) to the TUN; IPv6 addresses get `nodad`. */
  async addAddress(cidr: string): Promise<void> {
    const args = ['addr', 'add', cidr, 'dev', this.ifname];
    if (cidr.includes(':')) args.push('nodad');
    await this.step(async () => { await this.ns.ip(args); });
  }

  async setMtu(mtu: number): Promise<void> {
    await this.step(async () => { await this.ns.ip(['link', 'set', 'dev', this.ifname, 'mtu', String(mtu)]); });
  }

  /** Brings the TUN up (wireguard-go then binds its UDP port and starts the peers). */
  async up(): Promise<void> {
    await this.step(async () => { await this.ns.ip(['link', 'set', 'dev', this.ifname, 'up']); });
  }

  /** `wg show IFNAME dump`, parsed. */
  async dump(): Promise<Dump> {
    return parseDump((await this.wg(['show', this.ifname, 'dump'])).stdout);
  }

  async peer(publicKey: string): Promise<DumpPeer | undefined> {
    return (await this.dump()).peers.find((p) => p.publicKey === publicKey);
  }

  /** Stops the process by pid (SIGTERM, then SIGKILL); the daemon removes its TUN and socket itself. */
  async stop(): Promise<void> {
    await this.current?.stop();
  }

  /**
   * Stops the daemon by pid, waits until its control socket and TUN are gone (a socket left by a
   * killed process is removed), starts it again under the same name and, unless `reconfigure` is
   * false, replays every recorded configuration step (keys, peers, port, addresses, up).
   */
  async restart(options: { reconfigure?: boolean } = {}): Promise<void> {
    await this.stop();
    const exit = this.current?.exitStatus;
    if (exit?.signal === 'SIGKILL' && existsSync(this.socketPath)) unlinkSync(this.socketPath);
    await waitFor(async () => {
      if (existsSync(this.socketPath)) return false;
      const link = await this.ns.ip(['link', 'show', 'dev', this.ifname], { allowFailure: true });
      return link.code !== 0;
    }, 5000, { description: `${this.spec.label}: control socket and TUN gone after the stop` });
    await this.launch();
    if (options.reconfigure ?? true) for (const apply of this.steps) await apply();
  }

  describe(): string {
    return this.current ? this.current.describe() : `${this.spec.label} (not started)`;
  }
}

/** The LOG_LEVEL a daemon gets: the option, else the test's own $LOG_LEVEL, else 'error'. */
export function daemonLogLevel(option: StartOptions['logLevel']): string {
  return option ?? process.env.LOG_LEVEL ?? 'error';
}

/** Debian's wireguard-go (`wireguard-go -f IFNAME`) as a reference peer. */
export class WireGuardGo extends WgDaemon {
  /**
   * Starts `wireguard-go -f IFNAME` inside `ns` and waits until its TUN and control socket exist.
   * Cleanup (registered in `scope`): stop by pid, then remove the socket if it was left behind.
   */
  static async start(scope: Scope, ns: Namespace, options: StartOptions = {}): Promise<WireGuardGo> {
    const ifname = options.ifname ?? uniqueName('rg');
    const daemon = new WireGuardGo(scope, ns, ifname, WireGuardGo.launchSpec(ifname, options), options);
    await daemon.launch();
    return daemon;
  }

  /** `wireguard-go -f IFNAME` with LOG_LEVEL and the extra environment of `options`. */
  static launchSpec(ifname: string, options: StartOptions = {}): LaunchSpec {
    return {
      command: 'wireguard-go',
      args: ['-f', ifname],
      env: { ...options.env, LOG_LEVEL: daemonLogLevel(options.logLevel) },
      label: `wireguard-go ${ifname}`,
    };
  }
}
