/**
 * A hostile UDP peer for the robustness system tests, run inside a network namespace. Two halves,
 * as in core-driver.ts: the script (JSON-line commands on stdin, one JSON result per line on
 * stdout) and the test-side client {@link HostilePeer}.
 *
 * The script holds one UDP socket per source address it is given (IPv4 and IPv6, one port each)
 * and can be, at once:
 *
 *   - an insider: a WireGuardCore configured as a genuine peer of the daemon under test, on the
 *     first source socket. Its handshakes and data are real; everything it sends is recorded, so
 *     its own genuine messages can be mutated and replayed. It counts its sent bytes exactly as
 *     the daemon's `wg show` counts them received, which makes "nothing hostile was accepted"
 *     checkable from outside: the daemon's rx for the insider must equal the insider's tx.
 *   - a fuzzer: random and mutated datagrams (test/helpers/fuzz.ts) from every socket at a paced
 *     rate, with valid-mac1 ones held below the daemon's load threshold; it predicts the drop
 *     reason of each from the outside (shape, mac1, known receiver index, exact copy).
 *   - a flooder: handshake initiations with a correct mac1 for the daemon's key, per source
 *     socket: random bodies that ignore cookie replies ('blind'), or genuine initiations from keys
 *     configured at the daemon that obey cookie replies (mac2) ('peers', one key per source),
 *     counting what comes back (cookie replies, responses) per source and per second.
 *
 * A second mode, `hostile-peer.ts canary PORT ADDR…`, is a UDP listener that prints every datagram
 * it gets as a JSON line: placed behind the daemon's TUN, it shows which inner packets were
 * delivered.
 *
 * Keys travel over stdin, never on the command line.
 */
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Namespace, NsProcess, Scope } from './netns.ts';
import { waitFor } from './netns.ts';
import { internetChecksum } from './packets.ts';
import { CommandChannel, serveCommands, type CommandReply } from './child-commands.ts';

export const HOSTILE_PATH = fileURLToPath(import.meta.url);
const REPO_ROOT = resolve(dirname(HOSTILE_PATH), '..', '..');

// ---------------------------------------------------------------------------------------------
// protocol

export interface HostileInit {
  daemon: {
    /** base64 */
    publicKey: string;
    /** The daemon's UDP endpoint for IPv4 and IPv6 sources, e.g. '192.0.2.1:51820', '[2001:db8::1]:51820'. */
    endpoint4: string;
    endpoint6: string;
  };
  /** Local addresses to bind one UDP socket each (port 0); the first is the insider's. */
  sources: string[];
  /** Make the first socket a genuine peer of the daemon with this key (base64). */
  insider?: { privateKey: string };
  /** Generate this many keys for the 'peers' flood, one per source in order (public keys returned). */
  floodPeers?: number;
}

export interface SocketStats {
  address: string;
  port: number;
  /** Datagrams received, by first byte ('1'…'4', 'other'). */
  received: Record<string, number>;
}

export interface InsiderStats {
  txBytes: number;
  rxBytes: number;
  hasSession: boolean;
  endpoint?: string;
  lastHandshakeWallMs: number;
  drops: Record<string, number>;
  /** Inner packets delivered to the insider. */
  delivered: number;
  handshakes: number;
}

export interface FuzzResult {
  sent: number;
  bytes: number;
  seconds: number;
  byCategory: Record<string, number>;
  /** The drop reason the daemon should count for each, predicted from the outside. */
  predicted: Record<string, number>;
  /**
   * Transport messages sent while the insider's session was changing (a handshake in flight or
   * just completed, or a key near its 180 s limit): the daemon counts each under one of the
   * transport reasons, which one depends on timing, so they are not in `predicted`.
   */
  unsettled: number;
  /** Genuine packets the insider sent to the canary meanwhile. */
  genuine: number;
}

export type FloodMode = 'blind' | 'peers';

export interface FloodStream {
  mode: FloodMode;
  /** Messages per second per source. */
  ratePerSource: number;
  /** Indices into the sources; default all but the insider's. */
  sources?: number[];
}

export interface FloodSourceResult {
  address: string;
  port: number;
  mode: FloodMode;
  sent: number;
  cookieReplies: number;
  responses: number;
  /** Responses in each whole second of the flood. */
  responsesPerSecond: number[];
}

export type HostileCommand =
  | ({ cmd: 'init' } & HostileInit)
  | { cmd: 'handshake'; timeoutMs?: number }
  | { cmd: 'udp'; src: string; dst: string; port: number; payload: string; count?: number }
  | { cmd: 'fuzz'; seconds: number; pps: number; seed: number; maxMac1PerSecond: number; genuineEveryMs?: number; canary?: { src: string; dst: string; port: number } }
  | { cmd: 'flood'; seconds: number; streams: FloodStream[] }
  | { cmd: 'replay'; types: number[]; from?: number; to?: number; source?: number }
  | { cmd: 'recorded' }
  | { cmd: 'stats' }
  | { cmd: 'quit' };

type Result = CommandReply;

// ---------------------------------------------------------------------------------------------
// test-side client

export class HostilePeer {
  ports: Record<string, number> = {};
  insiderPublicKey = '';
  floodPeerKeys: string[] = [];
  private readonly channel: CommandChannel<HostileCommand>;

  private constructor(readonly process: NsProcess) {
    this.channel = new CommandChannel(process, 'hostile peer');
  }

  /** Spawns the script in `ns` (stopped at scope cleanup) and initialises it. */
  static async start(scope: Scope, ns: Namespace, init: HostileInit): Promise<HostilePeer> {
    const proc = scope.spawn(ns, process.execPath, ['--import', 'tsx', HOSTILE_PATH], {
      cwd: REPO_ROOT, rawStdout: true, label: `hostile peer in ${ns.name}`,
    });
    const peer = new HostilePeer(proc);
    const r = await peer.request({ cmd: 'init', ...init }, 30_000);
    peer.ports = r.ports as Record<string, number>;
    peer.insiderPublicKey = (r.insiderPublicKey as string | undefined) ?? '';
    peer.floodPeerKeys = (r.floodPeerKeys as string[] | undefined) ?? [];
    return peer;
  }

  request(command: HostileCommand, timeoutMs = 15_000): Promise<Extract<CommandReply, { ok: true }>> {
    return this.channel.request(command, timeoutMs);
  }

  async handshake(timeoutMs = 10_000): Promise<void> {
    await this.request({ cmd: 'handshake', timeoutMs }, timeoutMs + 5000);
  }

  /** Sends `count` inner UDP packets src → dst:port through the insider's session (any source address). */
  async udp(src: string, dst: string, port: number, payload: string, count = 1): Promise<void> {
    await this.request({ cmd: 'udp', src, dst, port, payload, count });
  }

  async fuzz(options: Omit<Extract<HostileCommand, { cmd: 'fuzz' }>, 'cmd'>): Promise<FuzzResult> {
    return (await this.request({ cmd: 'fuzz', ...options }, options.seconds * 1000 + 30_000)) as unknown as FuzzResult;
  }

  async flood(seconds: number, streams: FloodStream[]): Promise<FloodSourceResult[]> {
    const r = await this.request({ cmd: 'flood', seconds, streams }, seconds * 1000 + 30_000);
    return r.sources as FloodSourceResult[];
  }

  /**
   * Resends the insider's recorded datagrams of these types (indices [from, to) of the record),
   * from the insider's socket or from source socket `source`.
   */
  async replay(types: number[], options: { from?: number; to?: number; source?: number } = {}): Promise<{ replayed: number; byType: Record<string, number> }> {
    const r = await this.request({ cmd: 'replay', types, ...options });
    return { replayed: r.replayed as number, byType: r.byType as Record<string, number> };
  }

  /** How many datagrams the insider has sent so far (the record's length). */
  async recorded(): Promise<number> {
    return (await this.request({ cmd: 'recorded' })).count as number;
  }

  async stats(): Promise<{ sockets: SocketStats[]; insider?: InsiderStats }> {
    const r = await this.request({ cmd: 'stats' });
    return { sockets: r.sockets as SocketStats[], insider: r.insider as InsiderStats | undefined };
  }

  async quit(): Promise<void> {
    if (this.process.running) {
      try {
        this.process.child.stdin!.write(`${JSON.stringify({ id: 0, cmd: 'quit' })}\n`); // answered by exiting
        await Promise.race([this.process.exited, new Promise((r) => setTimeout(r, 2000))]);
      } catch { /* stop below */ }
    }
    await this.process.stop();
  }
}

/** A UDP listener behind the daemon's TUN that reports every datagram (see the file comment). */
export class Canary {
  private constructor(readonly process: NsProcess) {}

  static async start(scope: Scope, ns: Namespace, port: number, addresses: string[]): Promise<Canary> {
    const proc = scope.spawn(ns, process.execPath, ['--import', 'tsx', HOSTILE_PATH, 'canary', String(port), ...addresses], {
      cwd: REPO_ROOT, label: `canary in ${ns.name}`, keepOutputBytes: 8 * 1024 * 1024,
    });
    await waitFor(() => {
      if (!proc.running) throw new Error(`canary exited\n${proc.describe()}`);
      return proc.stdout.includes('"listening"');
    }, 20_000, { description: 'the canary to listen' });
    return new Canary(proc);
  }

  /** Every datagram received so far: source address and payload text. */
  received(): Array<{ from: string; payload: string }> {
    const out: Array<{ from: string; payload: string }> = [];
    for (const line of this.process.stdout.split('\n')) {
      if (!line.startsWith('{"from"')) continue;
      try { out.push(JSON.parse(line) as { from: string; payload: string }); } catch { /* a line cut by the output limit */ }
    }
    return out;
  }

  count(prefix: string): number {
    return this.received().filter((d) => d.payload.startsWith(prefix)).length;
  }
}

// ---------------------------------------------------------------------------------------------
// inner UDP packets

/** An IPv4 or IPv6 UDP packet src → dst:dport with `payload` (IPv4 without a UDP checksum). */
export function buildUdp(src: Uint8Array, dst: Uint8Array, sport: number, dport: number, payload: Uint8Array): Uint8Array {
  const udpLength = 8 + payload.length;
  if (src.length === 4) {
    const p = new Uint8Array(20 + udpLength);
    const v = new DataView(p.buffer);
    p[0] = 0x45; v.setUint16(2, p.length); v.setUint16(6, 0x4000); p[8] = 64; p[9] = 17;
    p.set(src, 12); p.set(dst, 16);
    v.setUint16(10, internetChecksum(p, 0, 20));
    v.setUint16(20, sport); v.setUint16(22, dport); v.setUint16(24, udpLength); // checksum 0: none
    p.set(payload, 28);
    return p;
  }
  const p = new Uint8Array(40 + udpLength);
  const v = new DataView(p.buffer);
  v.setUint32(0, 0x60000000); v.setUint16(4, udpLength); p[6] = 17; p[7] = 64;
  p.set(src, 8); p.set(dst, 24);
  v.setUint16(40, sport); v.setUint16(42, dport); v.setUint16(44, udpLength);
  p.set(payload, 48);
  // Pseudo-header: source, destination, upper-layer length, next header.
  const pseudo = new Uint8Array(40);
  pseudo.set(src, 0); pseudo.set(dst, 16);
  new DataView(pseudo.buffer).setUint32(32, udpLength);
  pseudo[39] = 17;
  const partial = ~internetChecksum(pseudo) & 0xffff;
  let sum = internetChecksum(p, 40, p.length, partial);
  if (sum === 0) sum = 0xffff;
  v.setUint16(46, sum);
  return p;
}

// ---------------------------------------------------------------------------------------------
// the script

async function canaryMain(port: number, addresses: string[]): Promise<void> {
  const dgram = await import('node:dgram');
  const sockets = addresses.map((address) => {
    const s = dgram.createSocket({ type: address.includes(':') ? 'udp6' : 'udp4', ipv6Only: address.includes(':') });
    s.on('message', (msg, rinfo) => process.stdout.write(`${JSON.stringify({ from: rinfo.address, payload: msg.toString('utf8') })}\n`));
    return new Promise<void>((r, reject) => { s.once('error', reject); s.bind(port, address, () => r()); });
  });
  await Promise.all(sockets);
  process.stdout.write('{"listening":true}\n');
  process.stdin.resume();
  process.stdin.on('end', () => process.exit(0));
}

async function main(): Promise<void> {
  const dgram = await import('node:dgram');
  const { WireGuardCore } = await import('../../dataplane/core.ts');
  const { Endpoint } = await import('../../dataplane/net/endpoint.ts');
  const { parseIp } = await import('../../dataplane/net/ip.ts');
  const { selectCrypto } = await import('../../dataplane/crypto/select.ts');
  const { generatePrivateKey } = await import('../../dataplane/noise/keys.ts');
  const { LABEL_COOKIE } = await import('../../dataplane/noise/cookie.ts');
  const { Handshake, HandshakeState, createInitiation, precomputeStaticStatic } = await import('../../dataplane/noise/noise-protocol.ts');
  const { REJECT_AFTER_TIME } = await import('../../dataplane/constants.ts');
  const fz = await import('../helpers/fuzz.ts');
  const { prng } = await import('../helpers/prng.ts');
  type Core = InstanceType<typeof WireGuardCore>;
  type Socket = import('node:dgram').Socket;
  type Ep = InstanceType<typeof Endpoint>;

  const crypto = await selectCrypto();
  const write = (msg: Result) => process.stdout.write(`${JSON.stringify(msg)}\n`);
  const key = (text: string) => {
    const bytes = new Uint8Array(Buffer.from(text, 'base64'));
    if (bytes.length !== 32) throw new Error('expected a 32-byte key in base64');
    return bytes;
  };
  const b64 = (bytes: Uint8Array) => Buffer.from(bytes).toString('base64');

  interface Source {
    address: string;
    socket: Socket;
    port: number;
    target: Ep;
    received: Record<string, number>;
    /** While a flood runs: what this socket's flooder does with what comes back. */
    onReply?: (d: Uint8Array) => void;
  }
  let sources: Source[] = [];
  let daemonKey: Uint8Array;
  let mac1Key: Uint8Array;
  let core: Core | undefined;
  let insiderPeer: ReturnType<Core['addPeer']> | undefined;
  let delivered = 0;
  let handshakes = 0;
  let lastHandshakeAt = -Infinity;
  /** Everything the insider sent, in order. */
  const record: Uint8Array[] = [];
  let floodKeys: Uint8Array[] = [];
  /** Per source, the last timestamp (wall ms) a flood peer's initiation carried: each must be newer. */
  const peerWall: number[] = [];
  let ticker: NodeJS.Timeout | undefined;

  const send = (s: Source, d: Uint8Array, to: Ep = s.target) => {
    s.socket.send(d, to.port, to.host);
  };

  async function init(cfg: HostileInit): Promise<Record<string, unknown>> {
    daemonKey = key(cfg.daemon.publicKey);
    mac1Key = fz.mac1KeyFor(crypto, daemonKey);
    const target4 = Endpoint.parse(cfg.daemon.endpoint4);
    const target6 = Endpoint.parse(cfg.daemon.endpoint6);
    sources = await Promise.all(cfg.sources.map(async (address) => {
      const v6 = address.includes(':');
      const socket = dgram.createSocket({ type: v6 ? 'udp6' : 'udp4', ipv6Only: v6, recvBufferSize: 4 << 20, sendBufferSize: 4 << 20 });
      await new Promise<void>((r, reject) => { socket.once('error', reject); socket.bind(0, address, () => { socket.off('error', reject); r(); }); });
      socket.on('error', () => { /* e.g. ECONNREFUSED from ICMP: ignore */ });
      const s: Source = { address, socket, port: socket.address().port, target: v6 ? target6 : target4, received: {} };
      socket.on('message', (msg) => {
        const kind = msg.length > 0 && msg[0] >= 1 && msg[0] <= 4 ? String(msg[0]) : 'other';
        s.received[kind] = (s.received[kind] ?? 0) + 1;
        const bytes = new Uint8Array(msg.buffer, msg.byteOffset, msg.length);
        if (s === sources[0] && core) {
          core.receiveDatagram(bytes, s.target);
        } else {
          s.onReply?.(bytes);
        }
      });
      return s;
    }));
    const out: Record<string, unknown> = { ports: Object.fromEntries(sources.map((s) => [s.address, s.port])) };
    if (cfg.insider) {
      const main = sources[0];
      core = new WireGuardCore({
        crypto,
        privateKey: key(cfg.insider.privateKey),
        outputs: {
          sendDatagram: (to, d) => { const copy = d.slice(); record.push(copy); send(main, copy, to); },
          deliverPacket: () => { delivered++; },
          handshakeCompleted: () => { handshakes++; lastHandshakeAt = performance.now(); },
        },
      });
      insiderPeer = core.addPeer(daemonKey, { endpoint: main.target, allowedIps: ['0.0.0.0/0', '::/0'] });
      ticker = setInterval(() => core!.tick(), 50);
      out.insiderPublicKey = b64(core.ourPublicKey!);
    }
    floodKeys = Array.from({ length: cfg.floodPeers ?? 0 }, () => generatePrivateKey(crypto));
    out.floodPeerKeys = floodKeys.map((k) => b64(crypto.publicKey(k)));
    return out;
  }

  const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

  /** Starts a handshake and waits until this new one (not an earlier session) has completed. */
  async function handshake(timeoutMs: number): Promise<void> {
    if (!insiderPeer) throw new Error('no insider');
    const before = handshakes;
    insiderPeer.initiateHandshake();
    const deadline = Date.now() + timeoutMs;
    while (handshakes === before) {
      if (Date.now() > deadline) throw new Error(`no new handshake with the daemon within ${timeoutMs} ms (a peer initiates at most once per 5 s); drops ${JSON.stringify(core!.drops.snapshot())}`);
      await sleep(20);
    }
  }

  function udp(src: string, dst: string, port: number, payload: string): void {
    if (!insiderPeer) throw new Error('no insider');
    insiderPeer.sendPacket(buildUdp(parseIp(src), parseIp(dst), 40000, port, new TextEncoder().encode(payload)));
  }

  /** Paced sending: calls `next()` for each datagram, `pps` per second, for `seconds`. */
  async function paced(seconds: number, pps: number, next: (i: number) => void): Promise<number> {
    const start = performance.now();
    const end = start + seconds * 1000;
    let sent = 0;
    for (;;) {
      const now = performance.now();
      if (now >= end) break;
      const due = Math.min(Math.floor(((now - start) / 1000) * pps), sent + 256);
      while (sent < due) next(sent++);
      await new Promise<void>((r) => (sent >= due ? setTimeout(r, 1) : setImmediate(r)));
    }
    return sent;
  }

  async function fuzz(cmd: Extract<HostileCommand, { cmd: 'fuzz' }>): Promise<Record<string, unknown>> {
    const rng = prng(cmd.seed);
    const byCategory: Record<string, number> = {};
    const predicted: Record<string, number> = {};
    const predict = (reason: string) => { predicted[reason] = (predicted[reason] ?? 0) + 1; };
    let bytes = 0;
    let mac1Second = -1, mac1InSecond = 0;
    let lastGenuine = performance.now(), genuineSeq = 0;
    const started = performance.now();
    const table = [
      ['random', 300], ['transport-flip', 250], ['transport-truncate', 60], ['transport-extend', 60],
      ['transport-replay', 80], ['transport-unknown-index', 60], ['transport-reused-index', 60],
      ['transport-counter-limit', 20], ['initiation-flip', 40], ['cookie-reply', 20], ['oversized', 2],
      ['initiation-replay', 3], ['mac1-initiation', 3], ['mac1-response', 3],
    ] as const;
    const genuine = () => {
      // The insider's recent and older transport messages and its initiations.
      const transports: Uint8Array[] = [];
      const initiations: Uint8Array[] = [];
      for (let i = Math.max(0, record.length - 4000); i < record.length; i++) {
        const d = record[i];
        if (d[0] === 4) transports.push(d);
        else if (d[0] === 1) initiations.push(d);
      }
      return { transports, initiations };
    };
    let pool = genuine();
    let unsettled = 0;
    /** The insider's sessions: the daemon's receiver index for each, and when it began (this process's clock). */
    const sessions = () => {
      const kp = insiderPeer!.keypairs;
      return [kp.current, kp.previous, kp.next].filter((k) => k !== null).map((k) => ({ index: k!.remoteIndex, created: k!.created }));
    };
    let live = sessions();
    const liveIndex = () => (live.length === 0 ? 0 : live[fz.randInt(rng, live.length)].index);
    /** The daemon's view may lag or lead ours around a handshake, and around a key's 180 s limit. */
    const settled = () => insiderPeer!.handshake.state === HandshakeState.Zeroed && performance.now() - lastHandshakeAt > 1000;
    const sent = await paced(cmd.seconds, cmd.pps, (i) => {
      if (i % 2000 === 0) pool = genuine();
      live = sessions();
      if (cmd.canary && performance.now() - lastGenuine >= (cmd.genuineEveryMs ?? 100)) {
        lastGenuine = performance.now();
        udp(cmd.canary.src, cmd.canary.dst, cmd.canary.port, `genuine ${genuineSeq++}`);
      }
      for (;;) {
        const category = fz.weighted(rng, table);
        const pick = (list: Uint8Array[]) => (list.length === 0 ? undefined : list[fz.randInt(rng, list.length)]);
        let d: Uint8Array | undefined;
        let exact = false;
        const g = pick(pool.transports);
        switch (category) {
          case 'random': d = fz.randomDatagram(rng, rng() < 0.9 ? 256 : 1400); break;
          case 'transport-flip': d = g && fz.flipBits(rng, g, 4); break;
          case 'transport-truncate': d = g && fz.truncate(rng, g); break;
          case 'transport-extend': d = g && fz.extend(rng, g, 64); break;
          case 'transport-replay': d = g?.slice(); exact = true; break;
          case 'transport-unknown-index': if (g) { d = g.slice(); fz.writeU32le(d, 4, fz.randInt(rng, 0x1_0000_0000)); } break;
          case 'transport-reused-index':
            d = fz.randomBytes(rng, 32 + fz.randInt(rng, 200));
            d[0] = 4; d[1] = 0; d[2] = 0; d[3] = 0;
            fz.writeU32le(d, 4, liveIndex());
            fz.writeU32le(d, 12, fz.randInt(rng, 0x200000));
            break;
          case 'transport-counter-limit': if (g) { d = g.slice(); fz.writeU32le(d, 12, 0x200000 + fz.randInt(rng, 0xffdfffff)); } break;
          case 'initiation-flip': { const m = pick(pool.initiations); d = m && fz.flipBits(rng, m, 3); break; }
          case 'initiation-replay': { const m = pick(pool.initiations); d = m?.slice(); exact = true; break; }
          case 'mac1-initiation': d = fz.garbageHandshake(crypto, rng, mac1Key, 1); break;
          case 'mac1-response': d = fz.garbageHandshake(crypto, rng, mac1Key, 2); break;
          case 'cookie-reply':
            d = fz.randomBytes(rng, 64);
            d[0] = 3; d[1] = 0; d[2] = 0; d[3] = 0;
            break;
          case 'oversized':
            d = fz.randomBytes(rng, 1400 + fz.randInt(rng, 8000));
            d[0] = 4; d[1] = 0; d[2] = 0; d[3] = 0;
            break;
        }
        if (!d) continue;
        // Predict the daemon's drop reason from the outside.
        let reason: string | undefined = fz.shapeReason(d);
        if (!reason) {
          if (d[0] === 1 || d[0] === 2) {
            const valid = fz.hasValidMac1(crypto, mac1Key, d);
            if (valid) {
              const second = Math.floor(performance.now() / 1000);
              if (second !== mac1Second) { mac1Second = second; mac1InSecond = 0; }
              if (mac1InSecond >= cmd.maxMac1PerSecond) continue; // stay below the load threshold
              mac1InSecond++;
              if (d[0] === 2) reason = 'unknown-index';
              else if (pool.initiations.some((m) => m.subarray(0, 116).every((b, k) => b === d![k]))) reason = 'handshake-replay';
              else reason = 'handshake-failed';
            } else {
              reason = 'bad-mac1';
            }
          } else if (d[0] === 3) {
            reason = 'bad-cookie-reply';
          } else {
            const session = live.find((k) => k.index === fz.readU32le(d!, 4));
            const age = session ? performance.now() - session.created : 0;
            if (!settled() || Math.abs(age - REJECT_AFTER_TIME) < 1000) reason = 'unsettled';
            else if (!session) reason = 'unknown-index'; // (or a live index of another peer, by a 2^-32 chance)
            else if (age > REJECT_AFTER_TIME) reason = 'expired-keypair';
            else if (fz.readU32le(d, 12) >= 0x200000) reason = 'counter-limit';
            else reason = exact ? 'replay' : 'decryption-failed';
          }
        }
        if (reason === 'unsettled') unsettled++;
        else predict(reason);
        byCategory[category] = (byCategory[category] ?? 0) + 1;
        bytes += d.length;
        send(sources[fz.randInt(rng, sources.length)], d);
        return;
      }
    });
    return { sent, bytes, seconds: (performance.now() - started) / 1000, byCategory, predicted, unsettled, genuine: genuineSeq } satisfies FuzzResult;
  }

  async function flood(cmd: Extract<HostileCommand, { cmd: 'flood' }>): Promise<Record<string, unknown>> {
    const rng = prng(0xf1);
    let floodStart = performance.now();
    interface Flooder {
      source: Source;
      mode: FloodMode;
      rate: number;
      result: FloodSourceResult;
      /** The cookie from the daemon's last reply this flooder could open. */
      cookie: Uint8Array | null;
      handshake?: InstanceType<typeof Handshake>;
      identity?: { crypto: typeof crypto; staticPrivate: Uint8Array; staticPublic: Uint8Array };
      index: number;
    }
    const flooders: Flooder[] = [];
    const cookieKey = crypto.hash(LABEL_COOKIE, daemonKey);
    /** The 'peers' flooders' recent messages by sender index: who sent it and its mac1. */
    const sentBy = new Map<number, { flooder: Flooder; mac1: Uint8Array }>();
    for (const stream of cmd.streams) {
      const indices = stream.sources ?? sources.map((_, i) => i).filter((i) => !(core && i === 0));
      for (const i of indices) {
        const source = sources[i];
        const f: Flooder = {
          source, mode: stream.mode, rate: stream.ratePerSource,
          result: { address: source.address, port: source.port, mode: stream.mode, sent: 0, cookieReplies: 0, responses: 0, responsesPerSecond: [] },
          cookie: null,
          index: i,
        };
        if (stream.mode === 'peers') {
          const priv = floodKeys[i];
          if (!priv) throw new Error(`no flood peer key for source ${i}`);
          f.identity = { crypto, staticPrivate: priv, staticPublic: crypto.publicKey(priv) };
          f.handshake = new Handshake(daemonKey);
          precomputeStaticStatic(f.identity, f.handshake);
        }
        flooders.push(f);
      }
    }
    for (const s of new Set(flooders.map((f) => f.source))) {
      const mine = flooders.filter((f) => f.source === s);
      s.onReply = (d) => {
        if (d[0] === 3 && d.length === 64) {
          // A cookie reply names the sender index of the message it answers and is sealed to
          // that message's mac1: find whose it was.
          const asked = sentBy.get(fz.readU32le(d, 4));
          if (asked && asked.flooder.source === s) {
            const cookie = crypto.xopen(cookieKey, d.subarray(8, 32), d.subarray(32, 64), asked.mac1);
            if (cookie) {
              asked.flooder.cookie = cookie.slice();
              asked.flooder.result.cookieReplies++;
              return;
            }
          }
          (mine.find((f) => f.mode === 'blind') ?? mine[0]).result.cookieReplies++;
        } else if (d[0] === 2) {
          const f = mine.find((x) => x.mode === 'peers');
          if (!f) return;
          f.result.responses++;
          const second = Math.floor((performance.now() - floodStart) / 1000);
          while (f.result.responsesPerSecond.length <= second) f.result.responsesPerSecond.push(0);
          f.result.responsesPerSecond[second]++;
        }
      };
    }
    /** mac1 for the daemon's key; with a cookie ('peers' flooders), mac2 as well. */
    const macs = (f: Flooder, m: Uint8Array) => {
      fz.writeMac1(crypto, mac1Key, m);
      if (f.mode === 'blind') return;
      const index = fz.readU32le(m, 4);
      sentBy.set(index, { flooder: f, mac1: m.slice(116, 132) });
      if (sentBy.size > 100_000) sentBy.delete(sentBy.keys().next().value!);
      if (f.cookie) m.set(crypto.mac(f.cookie, m.subarray(0, 132)), 132);
    };
    const message = (f: Flooder): Uint8Array => {
      if (f.mode === 'peers') {
        // A genuine initiation with a strictly newer timestamp each time (the whitened clock ticks every ~17 ms).
        const wall = Math.max((peerWall[f.index] ?? 0) + 20, Date.now());
        peerWall[f.index] = wall;
        const m = createInitiation(f.identity!, f.handshake!, 1 + fz.randInt(rng, 0xfffffff0), wall);
        if (typeof m === 'string') throw new Error(`createInitiation: ${m}`);
        macs(f, m);
        return m;
      }
      const m = fz.randomBytes(rng, 148);
      m[0] = 1; m[1] = 0; m[2] = 0; m[3] = 0;
      macs(f, m);
      return m;
    };
    floodStart = performance.now();
    const total = flooders.reduce((n, f) => n + f.rate, 0);
    // Round-robin weighted by rate: each flooder is due every 1/rate seconds.
    const nextAt = flooders.map(() => 0);
    await paced(cmd.seconds, total, () => {
      let best = 0;
      for (let k = 1; k < flooders.length; k++) if (nextAt[k] < nextAt[best]) best = k;
      const f = flooders[best];
      nextAt[best] += 1 / f.rate;
      send(f.source, message(f));
      f.result.sent++;
    });
    await sleep(500); // late answers
    for (const s of sources) s.onReply = undefined;
    return { sources: flooders.map((f) => f.result) };
  }

  function stats(): Record<string, unknown> {
    return {
      sockets: sources.map((s) => ({ address: s.address, port: s.port, received: s.received })),
      insider: insiderPeer && {
        txBytes: insiderPeer.txBytes, rxBytes: insiderPeer.rxBytes, hasSession: insiderPeer.hasSession,
        endpoint: insiderPeer.endpoint?.toString(), lastHandshakeWallMs: insiderPeer.lastHandshakeWallMs,
        drops: core!.drops.snapshot(), delivered, handshakes,
      },
    };
  }

  async function handle(command: HostileCommand): Promise<Record<string, unknown>> {
    switch (command.cmd) {
      case 'init': return init(command);
      case 'handshake': await handshake(command.timeoutMs ?? 10_000); return {};
      case 'udp':
        for (let i = 0; i < (command.count ?? 1); i++) udp(command.src, command.dst, command.port, (command.count ?? 1) > 1 ? `${command.payload} ${i}` : command.payload);
        return {};
      case 'fuzz': return fuzz(command);
      case 'flood': return flood(command);
      case 'replay': {
        const from = sources[command.source ?? 0];
        const slice = record.slice(command.from ?? 0, command.to ?? record.length).filter((d) => command.types.includes(d[0]));
        const byType: Record<string, number> = {};
        for (const d of slice) {
          send(from, d.slice());
          byType[d[0]] = (byType[d[0]] ?? 0) + 1;
        }
        return { replayed: slice.length, byType };
      }
      case 'recorded': return { count: record.length };
      case 'stats': return stats();
      case 'quit':
        setImmediate(() => process.exit(0));
        return {};
    }
  }

  serveCommands<HostileCommand>(handle, (id, outcome) => write({ id, ...outcome }), () => {
    if (ticker) clearInterval(ticker);
    process.exit(0);
  });
}

const invokedAs = process.argv[1] ? pathToFileURL(resolve(process.argv[1])).href : '';
if (invokedAs === import.meta.url) {
  if (process.argv[2] === 'canary') void canaryMain(Number(process.argv[3]), process.argv.slice(4));
  else void main();
}
