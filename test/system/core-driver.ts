/**
 * Drives roamguard's protocol core (dataplane/core.ts) inside a network namespace, without a TUN.
 *
 * Two halves in one file:
 *
 * - The driver script. Run as `ip netns exec NS node --import tsx test/system/core-driver.ts`, it
 *   opens a plain node:dgram UDP socket (udp4 or udp6, by the bind address), creates a
 *   WireGuardCore and obeys JSON-line commands on stdin, writing JSON-line messages to stdout.
 *   Inner IP packets are crafted and inspected with packets.ts; echo requests addressed to the
 *   driver's own inner addresses are answered by the driver itself, like a host would. It exits
 *   on `quit` or when stdin closes (so it never outlives the test process).
 *
 * - The test-side client {@link CoreDriver}, which spawns the script in a namespace through a
 *   {@link Scope} (stopped by pid at cleanup) and turns the protocol into promises.
 *
 * Protocol (one JSON object per line):
 *   → {"id":1,"cmd":"init","privateKey":"<b64>","bind":{"address":"192.0.2.1","port":0},
 *      "peers":[{"publicKey":"<b64>","endpoint":"192.0.2.2:51821","allowedIps":["10.77.0.2/32"]}],
 *      "localAddresses":["10.77.0.1","fd77::1"],"answerEchoRequests":true}
 *   ← {"type":"result","id":1,"ok":true,"port":40000,"publicKey":"<b64>","crypto":{…}}
 *   → {"id":2,"cmd":"initiate","peer":"<b64>"}        force a handshake initiation now
 *   → {"id":3,"cmd":"ping","src":"10.77.0.1","dst":"10.77.0.2","ident":7,"seq":1,"payload":"<hex>"}
 *   → {"id":4,"cmd":"send","packet":"<hex>"}          any inner IP packet, routed by allowed IPs
 *   → {"id":5,"cmd":"state"}                          peers and drop counters
 *   → {"id":6,"cmd":"quit"}
 *   ← {"type":"result","id":N,"ok":false,"error":"…"} on failure
 *   ← {"type":"event","event":"ready"|"handshake"|"endpoint"|"delivered"|"echo-answered"|"error"|"log",…}
 * Keys travel over stdin, never on the command line.
 */
import { createInterface } from 'node:readline';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Namespace, NsProcess, Scope } from './netns.ts';
import { answerEchoRequest, buildEchoRequest, fromHex, parseEcho, toHex, type EchoKind } from './packets.ts';
import { serveCommands } from './child-commands.ts';

export const DRIVER_PATH = fileURLToPath(import.meta.url);
export const REPO_ROOT = resolve(dirname(DRIVER_PATH), '..', '..');

// ---------------------------------------------------------------------------------------------
// protocol types

export interface DriverPeerConfig {
  /** base64 */
  publicKey: string;
  /** `ip:port` / `[ipv6]:port`; omitted = learn it from the peer's initiation. */
  endpoint?: string;
  allowedIps?: string[];
  /** base64 */
  presharedKey?: string;
  persistentKeepalive?: number;
}

export interface DriverInit {
  /** base64 private key (from `wg genkey`). */
  privateKey: string;
  /** Local UDP address and port (0 = any free port); the family picks udp4 or udp6. */
  bind: { address: string; port: number };
  peers: DriverPeerConfig[];
  /** Our inner addresses: echo requests to these are answered. Default: none. */
  localAddresses?: string[];
  /** Default true. */
  answerEchoRequests?: boolean;
  /** Timer tick interval in ms. Default 100. */
  tickMs?: number;
}

export type DriverCommand =
  | ({ cmd: 'init' } & DriverInit)
  | { cmd: 'initiate'; peer?: string }
  | { cmd: 'ping'; src: string; dst: string; ident: number; seq: number; payload?: string }
  | { cmd: 'send'; packet: string }
  | { cmd: 'state' }
  | { cmd: 'quit' };

export interface PeerState {
  publicKey: string;
  endpoint?: string;
  lastHandshakeWallMs: number;
  txBytes: number;
  rxBytes: number;
  hasSession: boolean;
}

export interface EchoSummary {
  kind: EchoKind;
  family: 4 | 6;
  src: string;
  dst: string;
  ident: number;
  seq: number;
  payload: string;
  checksumsOk: boolean;
}

export type DriverEvent =
  | { type: 'event'; event: 'ready'; pid: number }
  | { type: 'event'; event: 'handshake'; peer: string; lastHandshakeWallMs: number }
  | { type: 'event'; event: 'endpoint'; peer: string; endpoint: string }
  | { type: 'event'; event: 'delivered'; peer: string; packet: string; echo?: EchoSummary }
  | { type: 'event'; event: 'echo-answered'; peer: string; src: string; dst: string; ident: number; seq: number }
  | { type: 'event'; event: 'error'; message: string }
  | { type: 'event'; event: 'log'; message: string };

export type DriverResult = { type: 'result'; id: number; ok: true; [key: string]: unknown } | { type: 'result'; id: number; ok: false; error: string };

type Message = DriverEvent | DriverResult;

// ---------------------------------------------------------------------------------------------
// test-side client

export interface StartDriverOptions {
  /** Timeout for each request. Default 10 000 ms. */
  requestTimeoutMs?: number;
  label?: string;
}

export class CoreDriver {
  /** Every event received so far, in order. */
  readonly events: DriverEvent[] = [];
  /** The UDP port the driver bound (known after init). */
  port = 0;
  /** Our public key (base64), computed by the core (known after init). */
  publicKey = '';
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (r: DriverResult) => void; reject: (e: Error) => void }>();
  private readonly waiters = new Set<() => void>();
  private readonly requestTimeoutMs: number;

  private constructor(readonly process: NsProcess, options: StartDriverOptions) {
    this.requestTimeoutMs = options.requestTimeoutMs ?? 10_000;
    const lines = createInterface({ input: process.child.stdout! });
    lines.on('line', (line) => this.onLine(line));
    void process.exited.then(() => {
      const err = new Error(`core driver exited\n${this.process.describe()}`);
      for (const p of this.pending.values()) p.reject(err);
      this.pending.clear();
      this.wake();
    });
  }

  /**
   * Spawns the driver in `ns` (stopped at scope cleanup) and initialises it. Under Bun the script
   * runs with `bun`, under Node with `node --import tsx`.
   */
  static async start(scope: Scope, ns: Namespace, init: DriverInit, options: StartDriverOptions = {}): Promise<CoreDriver> {
    const isBun = typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined';
    const [cmd, args] = isBun ? [process.execPath, [DRIVER_PATH]] : [process.execPath, ['--import', 'tsx', DRIVER_PATH]];
    const proc = scope.spawn(ns, cmd, args, {
      cwd: REPO_ROOT,
      rawStdout: true,
      label: options.label ?? `core-driver in ${ns.name}`,
    });
    const driver = new CoreDriver(proc, options);
    await driver.waitForEvent((e) => e.event === 'ready', 20_000, 'the core driver to start');
    const result = await driver.request({ cmd: 'init', ...init });
    driver.port = result.port as number;
    driver.publicKey = result.publicKey as string;
    return driver;
  }

  private onLine(line: string): void {
    if (line.trim() === '') return;
    let msg: Message;
    try {
      msg = JSON.parse(line) as Message;
    } catch {
      this.events.push({ type: 'event', event: 'log', message: line });
      this.wake();
      return;
    }
    if (msg.type === 'result') {
      const p = this.pending.get(msg.id);
      if (p) {
        this.pending.delete(msg.id);
        p.resolve(msg);
      }
    } else {
      this.events.push(msg);
    }
    this.wake();
  }

  private wake(): void {
    for (const w of [...this.waiters]) w();
  }

  /** Sends a command; resolves with the result, rejects on `ok:false`, exit or timeout. */
  async request(command: DriverCommand): Promise<Extract<DriverResult, { ok: true }>> {
    if (!this.process.running) throw new Error(`core driver is not running\n${this.process.describe()}`);
    const id = this.nextId++;
    const result = await new Promise<DriverResult>((resolvePromise, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`core driver: no answer to ${command.cmd} within ${this.requestTimeoutMs} ms\n${this.process.describe()}`));
      }, this.requestTimeoutMs);
      this.pending.set(id, {
        resolve: (r) => { clearTimeout(timer); resolvePromise(r); },
        reject: (e) => { clearTimeout(timer); reject(e); },
      });
      this.process.child.stdin!.write(`${JSON.stringify({ id, ...command })}\n`);
    });
    if (!result.ok) throw new Error(`core driver: ${command.cmd} failed: ${result.error}`);
    return result;
  }

  /**
   * Resolves with the first event (at index ≥ `since`) that matches; rejects after `timeoutMs`
   * with the events seen, or when the driver exits.
   */
  waitForEvent<E extends DriverEvent = DriverEvent>(
    match: (event: DriverEvent) => boolean,
    timeoutMs: number,
    description: string,
    since = 0,
  ): Promise<E> {
    return new Promise<E>((resolvePromise, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const check = () => {
        for (let i = since; i < this.events.length; i++) {
          if (match(this.events[i])) {
            done();
            resolvePromise(this.events[i] as E);
            return;
          }
        }
        if (!this.process.running) {
          done();
          reject(new Error(`core driver exited while waiting for ${description}\n${this.process.describe()}`));
        }
      };
      const done = () => {
        if (timer) clearTimeout(timer);
        this.waiters.delete(check);
      };
      timer = setTimeout(() => {
        done();
        const seen = this.events.slice(since).map((e) => JSON.stringify(e).slice(0, 300)).join('\n  ');
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${description}; events:\n  ${seen}\n${this.process.describe()}`));
      }, timeoutMs);
      this.waiters.add(check);
      check();
    });
  }

  async state(): Promise<{ peers: PeerState[]; drops: Record<string, number> }> {
    const r = await this.request({ cmd: 'state' });
    return { peers: r.peers as PeerState[], drops: r.drops as Record<string, number> };
  }

  /** Asks the driver to exit, then makes sure it did (by pid). Never throws. */
  async quit(): Promise<void> {
    if (this.process.running) {
      try {
        this.process.child.stdin!.write(`${JSON.stringify({ id: this.nextId++, cmd: 'quit' })}\n`);
        await Promise.race([this.process.exited, new Promise((r) => setTimeout(r, 2000))]);
      } catch { /* fall through to stop */ }
    }
    await this.process.stop();
  }
}

// ---------------------------------------------------------------------------------------------
// the driver script

async function main(): Promise<void> {
  const dgram = await import('node:dgram');
  const { WireGuardCore } = await import('../../dataplane/core.ts');
  const { Endpoint } = await import('../../dataplane/net/endpoint.ts');
  const { systemClock } = await import('../../dataplane/clock.ts');
  const { selectCrypto } = await import('../../dataplane/crypto/select.ts');
  type Core = InstanceType<typeof WireGuardCore>;
  type Peer = ReturnType<Core['addPeer']>;

  const write = (msg: Message) => process.stdout.write(`${JSON.stringify(msg)}\n`);
  const emit = (event: DriverEvent) => write(event);
  const fail = (message: string) => emit({ type: 'event', event: 'error', message });

  const b64 = (bytes: Uint8Array) => Buffer.from(bytes).toString('base64');
  const key = (text: string, what: string) => {
    const bytes = new Uint8Array(Buffer.from(text, 'base64'));
    if (bytes.length !== 32) throw new Error(`${what}: expected 32 bytes of base64`);
    return bytes;
  };

  let core: Core | undefined;
  let socket: import('node:dgram').Socket | undefined;
  let ticker: NodeJS.Timeout | undefined;
  const peerKeys = new Map<Peer, string>();
  const peersByKey = new Map<string, Peer>();
  const reportedHandshake = new Map<Peer, number>();
  let localAddresses = new Set<string>();
  let answerEcho = true;

  const reportHandshake = (peer: Peer) => {
    const at = peer.lastHandshakeWallMs;
    if (at === 0 || reportedHandshake.get(peer) === at) return;
    reportedHandshake.set(peer, at);
    emit({ type: 'event', event: 'handshake', peer: peerKeys.get(peer) ?? '?', lastHandshakeWallMs: at });
  };

  const findPeer = (keyText?: string): Peer => {
    if (keyText === undefined) {
      const first = peersByKey.values().next();
      if (first.done) throw new Error('no peers configured');
      return first.value;
    }
    const peer = peersByKey.get(keyText);
    if (!peer) throw new Error(`unknown peer ${keyText}`);
    return peer;
  };

  const onDelivered = (packet: Uint8Array, peer: Peer) => {
    const copy = Uint8Array.from(packet); // only valid during the call
    const name = peerKeys.get(peer) ?? '?';
    const echo = parseEcho(copy);
    emit({
      type: 'event', event: 'delivered', peer: name, packet: toHex(copy),
      ...(echo ? {
        echo: {
          kind: echo.kind, family: echo.family, src: echo.src, dst: echo.dst, ident: echo.id, seq: echo.seq,
          payload: toHex(echo.payload), checksumsOk: echo.ipChecksumOk && echo.icmpChecksumOk,
        },
      } : {}),
    });
    if (answerEcho && echo?.kind === 'request' && localAddresses.has(echo.dst)) {
      const reply = answerEchoRequest(copy);
      if (!reply) return;
      // Not re-entrantly from inside the core's receive path.
      setImmediate(() => {
        try {
          core!.sendPacket(reply);
          emit({ type: 'event', event: 'echo-answered', peer: name, src: echo.dst, dst: echo.src, ident: echo.id, seq: echo.seq });
        } catch (err) {
          fail(`answering echo request: ${(err as Error).message}`);
        }
      });
    }
  };

  const peerState = (peer: Peer): PeerState => ({
    publicKey: peerKeys.get(peer) ?? '?',
    endpoint: peer.endpoint?.toString(),
    lastHandshakeWallMs: Number(peer.lastHandshakeWallMs),
    txBytes: Number(peer.txBytes),
    rxBytes: Number(peer.rxBytes),
    hasSession: peer.hasSession,
  });

  async function init(cfg: DriverInit): Promise<Record<string, unknown>> {
    if (core) throw new Error('already initialised');
    const crypto = await selectCrypto();
    const family = cfg.bind.address.includes(':') ? 6 : 4;
    localAddresses = new Set((cfg.localAddresses ?? []).map((a) => new Endpoint(a, 0).host));
    answerEcho = cfg.answerEchoRequests ?? true;
    const sock = dgram.createSocket({ type: family === 6 ? 'udp6' : 'udp4', ipv6Only: family === 6 });
    socket = sock;
    core = new WireGuardCore({
      crypto,
      clock: systemClock,
      privateKey: key(cfg.privateKey, 'privateKey'),
      outputs: {
        sendDatagram(to, datagram) {
          // The datagram is only valid during this call; dgram may send later, so copy.
          sock.send(Buffer.from(datagram), to.port, to.host, (err) => {
            if (err) fail(`send to ${to.toString()}: ${err.message}`);
          });
        },
        deliverPacket: onDelivered,
        endpointChanged(peer, endpoint) {
          emit({ type: 'event', event: 'endpoint', peer: peerKeys.get(peer) ?? '?', endpoint: endpoint.toString() });
        },
        handshakeCompleted(peer) {
          // lastHandshakeWallMs is set before this hook runs; the tick below also polls for it.
          queueMicrotask(() => reportHandshake(peer));
        },
      },
    });
    for (const p of cfg.peers) {
      const peer = core.addPeer(key(p.publicKey, 'peer publicKey'), {
        endpoint: p.endpoint ? Endpoint.parse(p.endpoint) : undefined,
        allowedIps: p.allowedIps ?? [],
        presharedKey: p.presharedKey ? key(p.presharedKey, 'presharedKey') : undefined,
        persistentKeepalive: p.persistentKeepalive,
      });
      peerKeys.set(peer, p.publicKey);
      peersByKey.set(p.publicKey, peer);
    }
    sock.on('message', (msg, rinfo) => {
      let from;
      try {
        from = new Endpoint(rinfo.address.replace(/%.*$/, ''), rinfo.port);
      } catch (err) {
        fail(`bad source address ${rinfo.address}: ${(err as Error).message}`);
        return;
      }
      try {
        core!.receiveDatagram(new Uint8Array(msg.buffer, msg.byteOffset, msg.length), from);
      } catch (err) {
        fail(`receiveDatagram threw: ${(err as Error).stack ?? String(err)}`);
      }
    });
    sock.on('error', (err) => fail(`socket: ${err.message}`));
    await new Promise<void>((resolvePromise, reject) => {
      sock.once('error', reject);
      sock.bind(cfg.bind.port, cfg.bind.address, () => {
        sock.off('error', reject);
        resolvePromise();
      });
    });
    ticker = setInterval(() => {
      try {
        core!.tick();
      } catch (err) {
        fail(`tick threw: ${(err as Error).stack ?? String(err)}`);
      }
      for (const peer of peersByKey.values()) reportHandshake(peer);
    }, cfg.tickMs ?? 100);
    return { port: sock.address().port, publicKey: b64(core.ourPublicKey!), crypto: crypto.providers };
  }

  function shutdown(code: number): void {
    if (ticker) clearInterval(ticker);
    try { socket?.close(); } catch { /* already closed */ }
    process.exit(code);
  }

  async function handle(command: DriverCommand): Promise<Record<string, unknown>> {
    if (command.cmd === 'init') return init(command);
    if (command.cmd === 'quit') {
      setImmediate(() => shutdown(0));
      return {};
    }
    if (!core) throw new Error(`${command.cmd}: send init first`);
    switch (command.cmd) {
      case 'initiate':
        findPeer(command.peer).initiateHandshake();
        return {};
      case 'ping': {
        const packet = buildEchoRequest({
          src: command.src, dst: command.dst, id: command.ident, seq: command.seq,
          payload: command.payload ? fromHex(command.payload) : undefined,
        });
        core.sendPacket(packet);
        return { packet: toHex(packet) };
      }
      case 'send':
        core.sendPacket(fromHex(command.packet));
        return {};
      case 'state':
        return { peers: [...peersByKey.values()].map(peerState), drops: core.drops.snapshot() };
      default:
        throw new Error(`unknown command ${JSON.stringify((command as { cmd?: unknown }).cmd)}`);
    }
  }

  // Commands run one at a time, in order; the test process going away (closing our stdin) ends us.
  serveCommands<DriverCommand>(handle, (id, outcome) => write({ type: 'result', id, ...outcome }), () => shutdown(0), (err) => err.message ?? String(err));
  process.on('uncaughtException', (err) => {
    fail(`uncaught: ${err.stack ?? String(err)}`);
    shutdown(1);
  });
  emit({ type: 'event', event: 'ready', pid: process.pid });
}

const invokedAs = process.argv[1] ? pathToFileURL(resolve(process.argv[1])).href : '';
if (invokedAs === import.meta.url) {
  void main();
}
