/**
 * An attacker on the router between two WireGuard daemons, for the robustness system tests (run
 * inside the router's network namespace). Two halves, as in hostile-peer.ts: the script
 * (JSON-line commands on stdin, one JSON result per line on stdout) and the test-side client
 * {@link OnPathAttacker}.
 *
 * What it does, all from the router, without any key:
 *
 *   - sniffs the IPv4 packets crossing one of the router's links (an AF_PACKET socket bound to
 *     that interface; the link towards one daemon carries everything between the two) and learns
 *     every receiver index the daemons use: the receiver of each transport message (owned by its
 *     destination), the sender index of each initiation (owned by its source), both indices of
 *     each response. Indices travel in clear; so do the counters, of which it keeps the highest.
 *   - forges transport messages at every index seen in the last few seconds, round robin, at a
 *     paced rate: a valid header (type 4, the index, a plausible unused counter just above the
 *     highest seen), sealed with ChaCha20-Poly1305 under the all-zero key, carrying an inner IPv4
 *     UDP packet from the address the daemon's peer may use (its allowed IP) to a canary port
 *     behind the daemon's TUN, with a recognisable marker ({@link FORGERY_MARKER}). That is what a
 *     daemon opening a datagram with a wiped (zero-filled) key would accept.
 *   - sends every other forgery from its own address on the router (so a daemon that moved its
 *     peer's endpoint there would be seen sending to it: a UDP socket on that address and port
 *     counts what arrives) and the others from the genuine peer's address and port (a raw socket
 *     writing the IPv4 header itself: an on-path attacker can).
 *
 * Its own packets carry the IPv4 TTL {@link ATTACKER_TTL}, so the sniffer does not learn from
 * them. The FFI is the project's libc binding (dataplane/sys/libc.ts: koffi on Node); the packet
 * socket constants, which the data plane never needs, are defined here.
 */
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { Namespace, NsProcess, Scope } from './netns.ts';
import { CommandChannel, serveCommands, type CommandReply } from './child-commands.ts';

export const ATTACKER_PATH = fileURLToPath(import.meta.url);
const REPO_ROOT = resolve(dirname(ATTACKER_PATH), '..', '..');

/** The payload prefix of every forged inner packet (what the canaries look for). */
export const FORGERY_MARKER = 'rg-onpath-forgery';
/** TTL of every packet the attacker sends (daemons' packets cross the router with 64 or 63). */
export const ATTACKER_TTL = 99;

// ---------------------------------------------------------------------------------------------
// protocol

export interface AttackerInit {
  /** Index of the router's interface to sniff. */
  sniffIfindex: number;
  /** The attacker's own address on the router, and the UDP port its own-address forgeries come from. */
  address: string;
  port: number;
  /**
   * Per daemon (its outer IPv4 address): the inner packet its forgeries carry, from `src` (an
   * address its peer may use) to `dst`:`port` (a canary behind its TUN).
   */
  victims: Record<string, { src: string; dst: string; port: number }>;
}

export interface AttackOptions {
  seconds: number;
  /** Forgeries per second, over all indices. */
  rate: number;
  /** Forge at indices seen within this many ms (a keypair is dropped two rekeys after it was made). Default 6000. */
  activeMs?: number;
  /** Inner UDP payload bytes (marker, then padding). Default 300. */
  payloadBytes?: number;
}

export interface VictimTally {
  /** Forgeries sent to this daemon from the genuine peer's address, and from the attacker's own. */
  spoofed: number;
  own: number;
  /** Distinct indices of this daemon's that were forged at. */
  indices: number;
}

export interface AttackResult {
  seconds: number;
  sent: number;
  /** sendto failures (ENOBUFS, …): not counted in `sent`. */
  sendErrors: number;
  byVictim: Record<string, VictimTally>;
  /** Sniffer: packets read and WireGuard messages by type ('1'…'4', else `other TYPE/LENGTH`) during the attack; indices learned so far. */
  sniffed: number;
  sniffedByType: Record<string, number>;
  indicesLearned: number;
  /** Datagrams that reached the attacker's own UDP socket, and packets to its address the sniffer saw (all so far). */
  toAttacker: number;
  toAttackerSniffed: number;
  toAttackerFrom: string[];
}

export type AttackerCommand =
  | ({ cmd: 'init' } & AttackerInit)
  | ({ cmd: 'attack' } & AttackOptions)
  | { cmd: 'stats' }
  | { cmd: 'quit' };

type Result = CommandReply;

// ---------------------------------------------------------------------------------------------
// test-side client

export class OnPathAttacker {
  private readonly channel: CommandChannel<AttackerCommand>;

  private constructor(readonly process: NsProcess) {
    this.channel = new CommandChannel(process, 'on-path attacker');
  }

  /** Spawns the script in the router's namespace `ns` (stopped at scope cleanup); it starts sniffing at once. */
  static async start(scope: Scope, ns: Namespace, init: AttackerInit): Promise<OnPathAttacker> {
    const proc = scope.spawn(ns, process.execPath, ['--import', 'tsx', ATTACKER_PATH], {
      cwd: REPO_ROOT, rawStdout: true, label: `on-path attacker in ${ns.name}`,
    });
    const attacker = new OnPathAttacker(proc);
    await attacker.request({ cmd: 'init', ...init }, 30_000);
    return attacker;
  }

  private request(command: AttackerCommand, timeoutMs = 15_000): Promise<Extract<CommandReply, { ok: true }>> {
    return this.channel.request(command, timeoutMs);
  }

  /** Forges for `seconds` (sniffing goes on throughout); resolves with the tally. */
  async attack(options: AttackOptions): Promise<AttackResult> {
    return (await this.request({ cmd: 'attack', ...options }, options.seconds * 1000 + 30_000)) as unknown as AttackResult;
  }

  async stats(): Promise<AttackResult> {
    return (await this.request({ cmd: 'stats' })) as unknown as AttackResult;
  }
}

// ---------------------------------------------------------------------------------------------
// the script

const AF_PACKET = 17;
const SOCK_RAW = 3;
const IPPROTO_RAW = 255;
/** Every protocol: only such taps see a link's outgoing packets as well as its incoming ones. */
const ETH_P_ALL = 0x0003;
/** sizeof(struct sockaddr_ll). */
const SOCKADDR_LL_SIZE = 20;

async function main(): Promise<void> {
  const dgram = await import('node:dgram');
  const libcModule = await import('../../dataplane/sys/libc.ts');
  const { selectCrypto } = await import('../../dataplane/crypto/select.ts');
  const { parseIp, formatIp } = await import('../../dataplane/net/ip.ts');
  const { TRANSPORT_OVERHEAD } = await import('../../dataplane/session/transport.ts');
  const { readCounter, readU32, paddedLength, writeTransportHeader, TAG_SIZE } = await import('../../dataplane/noise/messages.ts');
  const { writeCounterNonce } = await import('../../dataplane/crypto/primitives.ts');
  const { buildUdp } = await import('./hostile-peer.ts');
  const { AF_INET, SOCK_DGRAM, SOCK_NONBLOCK, SOCK_CLOEXEC, SOL_SOCKET, SO_RCVBUFFORCE, EAGAIN, errnoError, loadLibc } = libcModule;

  const libc = await loadLibc();
  const crypto = await selectCrypto();
  const zeroKey = new Uint8Array(32);
  const nonce = new Uint8Array(12);
  // The attacker's own sealing and opening, straight on the AEAD: the data plane's transport
  // functions refuse the all-zero key, an attacker's code does not.
  const sealRaw = (key: Uint8Array, index: number, counter: number, buf: Uint8Array, length: number): number => {
    const padded = paddedLength(length, 1420);
    buf.fill(0, 16 + length, 16 + padded);
    crypto.seal(key, writeCounterNonce(counter, nonce), buf.subarray(16, 16 + padded), undefined, buf.subarray(16, 16 + padded + TAG_SIZE));
    writeTransportHeader(buf, 0, index, counter);
    return 16 + padded + TAG_SIZE;
  };
  const opensUnder = (key: Uint8Array, counter: number, datagram: Uint8Array): boolean =>
    crypto.open(key, writeCounterNonce(counter, nonce), datagram.subarray(16), undefined, new Uint8Array(datagram.length)) !== null;
  const write = (msg: Result) => process.stdout.write(`${JSON.stringify(msg)}\n`);

  let config: AttackerInit | undefined;
  let sniffFd = -1;
  let rawFd = -1;
  const sniffBuffer = new Uint8Array(65536);
  const sniffed = { packets: 0, byType: {} as Record<string, number>, toAttacker: 0 };
  let toAttacker = 0;
  const toAttackerFrom = new Set<string>();
  let ownAddress: Uint8Array = new Uint8Array(4);

  /** What the sniffer knows of one index: whose it is, who its genuine peer is, the highest counter seen. */
  interface Learned {
    index: number;
    owner: string;
    ownerPort: number;
    peer: string;
    peerPort: number;
    lastSeen: number;
    nextCounter: number;
    forged: boolean;
    /** Whether this index's next forgery comes from the attacker's own address (they alternate). */
    ownNext?: boolean;
  }
  const learned = new Map<string, Learned>();

  const learn = (index: number, owner: string, ownerPort: number, peer: string, peerPort: number, counter: number) => {
    if (!config!.victims[owner]) return;
    const key = `${owner}/${index}`;
    let l = learned.get(key);
    if (!l) {
      l = { index, owner, ownerPort, peer, peerPort, lastSeen: 0, nextCounter: 0, forged: false };
      learned.set(key, l);
    }
    l.lastSeen = performance.now();
    // Plausible and unused: just above what the genuine sender has reached.
    l.nextCounter = Math.max(l.nextCounter, counter + 1024);
  };

  /** Reads everything the packet socket holds and learns from the WireGuard messages in it. */
  const drainSniffer = () => {
    for (let budget = 4096; budget > 0; budget--) {
      const n = libc.read(sniffFd, sniffBuffer, sniffBuffer.length);
      if (n < 0) {
        const errno = libc.errno();
        if (errno === EAGAIN) return;
        throw errnoError('read(AF_PACKET)', errno);
      }
      sniffed.packets++;
      const p = sniffBuffer;
      if (n < 20 || p[0] >> 4 !== 4 || (p[0] & 15) < 5) continue;
      const ihl = (p[0] & 15) * 4;
      const dst = formatIp(p.subarray(16, 20));
      if (p.subarray(16, 20).every((b, i) => b === ownAddress[i])) sniffed.toAttacker++;
      if (p[8] === ATTACKER_TTL || p[9] !== 17 || n < ihl + 8 + 4) continue;
      const src = formatIp(p.subarray(12, 16));
      const sport = (p[ihl] << 8) | p[ihl + 1];
      const dport = (p[ihl + 2] << 8) | p[ihl + 3];
      const m = p.subarray(ihl + 8, n);
      if (m[1] !== 0 || m[2] !== 0 || m[3] !== 0) continue;
      const type = m[0];
      if (type === 4 && m.length >= 32) {
        learn(readU32(m, 4), dst, dport, src, sport, readCounter(m, 8));
      } else if (type === 1 && m.length === 148) {
        learn(readU32(m, 4), src, sport, dst, dport, 0);
      } else if (type === 2 && m.length === 92) {
        learn(readU32(m, 4), src, sport, dst, dport, 0);
        learn(readU32(m, 8), dst, dport, src, sport, 0);
      } else {
        sniffed.byType[`other ${type}/${m.length}`] = (sniffed.byType[`other ${type}/${m.length}`] ?? 0) + 1;
        continue;
      }
      sniffed.byType[type] = (sniffed.byType[type] ?? 0) + 1;
    }
  };

  const sockaddrIn = (address: string, port: number) => {
    const sa = new Uint8Array(16);
    sa[0] = AF_INET & 0xff; sa[1] = AF_INET >> 8;
    sa[2] = port >> 8; sa[3] = port & 0xff;
    sa.set(parseIp(address), 4);
    return sa;
  };
  const destinations = new Map<string, Uint8Array>();

  async function init(cfg: AttackerInit): Promise<Record<string, unknown>> {
    config = cfg;
    ownAddress = parseIp(cfg.address);
    // SOCK_DGRAM: the packet without its link-layer header (IPv4 is told apart by its version
    // nibble); the protocol in network byte order.
    sniffFd = libc.socket(AF_PACKET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, ((ETH_P_ALL & 0xff) << 8) | (ETH_P_ALL >> 8));
    if (sniffFd < 0) throw errnoError('socket(AF_PACKET)', libc.errno());
    const ll = new Uint8Array(SOCKADDR_LL_SIZE);
    const llView = new DataView(ll.buffer);
    llView.setUint16(0, AF_PACKET, true);
    llView.setUint16(2, ETH_P_ALL, false);
    llView.setInt32(4, cfg.sniffIfindex, true);
    if (libc.bind(sniffFd, ll, ll.length) !== 0) throw errnoError('bind(AF_PACKET)', libc.errno());
    const size = new Uint8Array(4);
    new DataView(size.buffer).setInt32(0, 16 << 20, true);
    libc.setsockopt(sniffFd, SOL_SOCKET, SO_RCVBUFFORCE, size, 4); // best effort: a bigger queue loses less
    rawFd = libc.socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
    if (rawFd < 0) throw errnoError('socket(SOCK_RAW)', libc.errno());
    // The attacker's own endpoint: a daemon that believed a forgery would send here.
    const own = dgram.createSocket('udp4');
    await new Promise<void>((r, reject) => { own.once('error', reject); own.bind(cfg.port, cfg.address, () => { own.off('error', reject); r(); }); });
    own.on('message', (_msg, rinfo) => { toAttacker++; toAttackerFrom.add(`${rinfo.address}:${rinfo.port}`); });
    // Self-check: a forgery opens under the zero key (and only under it).
    const probe = forge({ index: 1, owner: Object.keys(cfg.victims)[0], ownerPort: 1, peer: cfg.address, peerPort: 1, lastSeen: 0, nextCounter: 7, forged: false }, 64, 7);
    const wg = probe.subarray(28);
    if (!opensUnder(zeroKey, 7, wg)) throw new Error('self-check: the forgery does not open under the zero key');
    if (opensUnder(new Uint8Array(32).fill(1), 7, wg)) throw new Error('self-check: the forgery opens under another key');
    void loop();
    return {};
  }

  let sequence = 0;
  /** One forged IPv4/UDP/WireGuard packet at `l`'s index, from `l.peer` (spoofed) or the attacker's own address. */
  function forge(l: Learned, payloadBytes: number, counter: number, fromOwn = false): Uint8Array {
    const victim = config!.victims[l.owner];
    const text = `${FORGERY_MARKER} to=${l.owner} index=${l.index.toString(16)} n=${sequence++} `;
    const payload = new TextEncoder().encode(text.padEnd(Math.max(payloadBytes, text.length), 'x'));
    const inner = buildUdp(parseIp(victim.src), parseIp(victim.dst), 40000, victim.port, payload);
    const packet = new Uint8Array(28 + inner.length + TRANSPORT_OVERHEAD);
    const wg = packet.subarray(28);
    wg.set(inner, 16);
    const wgLength = sealRaw(zeroKey, l.index, counter, wg, inner.length);
    const total = 28 + wgLength;
    const v = new DataView(packet.buffer);
    // IPv4 header (the kernel fills in the checksum and the identification of an IP_HDRINCL packet).
    packet[0] = 0x45; v.setUint16(2, total); v.setUint16(6, 0x4000); packet[8] = ATTACKER_TTL; packet[9] = 17;
    packet.set(fromOwn ? ownAddress : parseIp(l.peer), 12);
    packet.set(parseIp(l.owner), 16);
    // UDP header, no checksum (allowed over IPv4).
    v.setUint16(20, fromOwn ? config!.port : l.peerPort); v.setUint16(22, l.ownerPort); v.setUint16(24, 8 + wgLength);
    return packet.subarray(0, total);
  }

  interface Attack {
    options: Required<AttackOptions>;
    started: number;
    sent: number;
    sendErrors: number;
    byVictim: Record<string, VictimTally>;
    active: Learned[];
    activeAt: number;
    next: number;
    done: () => void;
    /** The sniffer's counts when the attack began. */
    sniffedBefore: { packets: number; byType: Record<string, number> };
  }
  let attack: Attack | undefined;

  const tally = (a: Attack, owner: string) => (a.byVictim[owner] ??= { spoofed: 0, own: 0, indices: 0 });

  /** Sends the forgeries due by now (paced, round robin over the recently seen indices). */
  function forgeDue(a: Attack): void {
    const now = performance.now();
    if (now - a.activeAt > 50) {
      a.active = [...learned.values()].filter((l) => now - l.lastSeen < a.options.activeMs);
      a.activeAt = now;
    }
    if (a.active.length === 0) return;
    const due = Math.min(Math.floor(((now - a.started) / 1000) * a.options.rate), a.sent + a.sendErrors + 256);
    while (a.sent + a.sendErrors < due) {
      const l = a.active[a.next++ % a.active.length];
      const fromOwn = l.ownNext = !l.ownNext;
      const packet = forge(l, a.options.payloadBytes, l.nextCounter++, fromOwn);
      let to = destinations.get(l.owner);
      if (!to) destinations.set(l.owner, to = sockaddrIn(l.owner, 0));
      if (libc.sendto(rawFd, packet, packet.length, 0, to, to.length) < 0) {
        a.sendErrors++;
        continue;
      }
      a.sent++;
      const t = tally(a, l.owner);
      if (fromOwn) t.own++; else t.spoofed++;
      if (!l.forged) { l.forged = true; t.indices++; }
    }
  }

  let stopped = false;
  async function loop(): Promise<void> {
    while (!stopped) {
      try {
        drainSniffer();
        if (attack) {
          forgeDue(attack);
          if (performance.now() - attack.started >= attack.options.seconds * 1000) attack.done();
        }
      } catch (err) {
        process.stderr.write(`on-path attacker: ${(err as Error).stack}\n`);
        process.exit(1);
      }
      await new Promise((r) => setTimeout(r, 1));
    }
  }

  function result(a?: Attack): Record<string, unknown> {
    return {
      seconds: a ? (performance.now() - a.started) / 1000 : 0,
      sent: a?.sent ?? 0, sendErrors: a?.sendErrors ?? 0, byVictim: a?.byVictim ?? {},
      sniffed: sniffed.packets - (a?.sniffedBefore.packets ?? 0),
      sniffedByType: Object.fromEntries(Object.entries(sniffed.byType).map(([type, n]) => [type, n - (a?.sniffedBefore.byType[type] ?? 0)])),
      indicesLearned: learned.size,
      toAttacker, toAttackerSniffed: sniffed.toAttacker, toAttackerFrom: [...toAttackerFrom],
    } satisfies AttackResult;
  }

  async function runAttack(cmd: Extract<AttackerCommand, { cmd: 'attack' }>): Promise<Record<string, unknown>> {
    if (!config) throw new Error('not initialised');
    for (const l of learned.values()) l.forged = false;
    const options: Required<AttackOptions> = { seconds: cmd.seconds, rate: cmd.rate, activeMs: cmd.activeMs ?? 6000, payloadBytes: cmd.payloadBytes ?? 300 };
    let done!: () => void;
    const finished = new Promise<void>((r) => { done = r; });
    const a: Attack = {
      options, started: performance.now(), sent: 0, sendErrors: 0, byVictim: {}, active: [], activeAt: -Infinity, next: 0, done,
      sniffedBefore: { packets: sniffed.packets, byType: { ...sniffed.byType } },
    };
    attack = a;
    await finished;
    attack = undefined;
    return result(a);
  }

  async function handle(command: AttackerCommand): Promise<Record<string, unknown>> {
    switch (command.cmd) {
      case 'init': return init(command);
      case 'attack': return runAttack(command);
      case 'stats': return result();
      case 'quit':
        setImmediate(() => process.exit(0));
        return {};
    }
  }

  serveCommands<AttackerCommand>(handle, (id, outcome) => write({ id, ...outcome }), () => {
    stopped = true;
    process.exit(0);
  });
}

const invokedAs = process.argv[1] ? pathToFileURL(resolve(process.argv[1])).href : '';
if (invokedAs === import.meta.url) void main();
