/**
 * Device: the protocol core wired to a TUN device and a UDP bind.
 *
 *   TUN read, sealed and sent in the TUN's reader where the send table allows (reader-sender.ts)
 *     -> books to the core; the rest -> the core's single-packet path (core.sendPacket) -> bind.send
 *   bind receive, opened (and delivered) in the bind's reader -> receive (receive.ts) -> TUN write
 *
 * What a TUN reader leaves to the main thread is rare: a peer without a session (staged until
 * its handshake completes), packets staged ahead, a keypair in its last second, or a reader that
 * could not load an AEAD provider.
 *
 * The device depends only on the narrow Tun and Bind interfaces, so tests run it over in-memory
 * doubles. It also implements what the control socket needs beyond the core (listen port, fwmark,
 * and the counters of `get=roamguard-stats`: `stats()`).
 */
import { WireGuardCore } from '../core.ts';
import { systemClock, type Clock } from '../clock.ts';
import type { Timings } from '../constants.ts';
import type { Crypto } from '../crypto/primitives.ts';
import type { Bind } from '../bind/bind.ts';
import type { Tun } from '../tun/tun.ts';
import { silentLogger, type Logger } from '../log.ts';
import type { SelectOptions } from '../crypto/select.ts';
import { receive } from './receive.ts';
import { PublishedRoutes } from '../allowedips/published-routes.ts';
import { DROP_REASONS } from '../drop-counters.ts';
import type { Peer } from '../session/peer.ts';
import { STATS_VERSION, type DeviceStats } from '../uapi/uapi-stats.ts';
import { formatStall, type Liveness } from '../watchdog.ts';

/** How long close() waits for the reader threads to end (a booting one ends within a second). */
const THREAD_END_TIMEOUT_MS = 10_000;

/** `work`, or its timeout: resolves when either comes first; rejects only with `work`. */
async function settledWithin(work: Promise<unknown>, timeoutMs: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  // Not unref()ed: a booting thread is (tun-queue.ts), and this wait must keep the process alive.
  const timeout = new Promise<void>((resolve) => { timer = setTimeout(resolve, timeoutMs); });
  try {
    await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The device's timer runs at the core's next deadline, at least every core.longestTickMs() (a
 * second): an idle daemon wakes about once a second for it instead of ten times (it ran every
 * 100 ms). Never sooner than this after the last run (a timer's resolution), so that a deadline
 * left due by mistake could not spin it.
 */
const TICK_MIN_MS = 1;

/** How long the device's timer sleeps after a run at `now` (see TICK_MIN_MS). */
export function nextTickDelay(core: WireGuardCore, now: number): number {
  return Math.min(Math.max(core.nextDeadline(now) - now, TICK_MIN_MS), core.longestTickMs());
}

export interface DeviceOptions {
  tun: Tun;
  bind: Bind;
  crypto: Crypto;
  clock?: Clock;
  logger?: Logger;
  /** Shortened protocol timers, for tests only. */
  timings?: Partial<Timings>;
  /** How the reader threads pick their AEAD: as `crypto` was picked (ROAMGUARD_CRYPTO, ROAMGUARD_LIBSODIUM). */
  cryptoSelection?: Pick<SelectOptions, 'only' | 'libsodium'>;
}

function isLiveness(x: unknown): x is Liveness {
  return typeof x === 'object' && x !== null && typeof (x as Liveness).stalls === 'number' && 'onStall' in x;
}

export class Device {
  readonly core: WireGuardCore;
  readonly tun: Tun;
  readonly bind: Bind;
  readonly logger: Logger;
  fwmark = 0;
  private ticker: ReturnType<typeof setTimeout> | undefined;
  private readonly single: Uint8Array[] = [new Uint8Array(0)];
  /** Packets delivered during one run of received datagrams (views into the bind's buffers, valid until its end). */
  private collecting = false;
  private readonly collected: Uint8Array[] = [];
  private collectedCount = 0;
  /** The bind brackets each run of received datagrams with these: one TUN write call per run. */
  private readonly delivery = {
    begin: (): void => {
      this.collecting = true;
    },
    end: (): void => {
      this.collecting = false;
      const count = this.collectedCount;
      if (count === 0) return;
      this.collectedCount = 0;
      try {
        this.tun.write(this.collected, count);
      } finally {
        this.collected.fill(undefined as unknown as Uint8Array, 0, count);
      }
    },
  };
  private closed = false;
  /** Every thread running (open() starts waiting for it): running(). */
  private threadsRunning: Promise<void> | undefined;
  /** The watched hand-offs (TUN reader rings, UDP reader ring): their stalls are logged and counted. */
  private readonly watched: Liveness[] = [];
  /** Completed handshakes per peer (a removed and re-added peer starts again from zero, as its byte counters do). */
  private readonly handshakes = new WeakMap<Peer, { completed: number; asInitiator: number }>();

  constructor(options: DeviceOptions) {
    this.tun = options.tun;
    this.bind = options.bind;
    this.logger = options.logger ?? silentLogger;
    this.core = new WireGuardCore({
      crypto: options.crypto,
      clock: options.clock ?? systemClock,
      mtu: options.tun.mtu,
      timings: options.timings,
      outputs: {
        sendDatagram: (to, datagram) => this.bind.send(to, datagram),
        deliverPacket: (packet) => {
          if (this.collecting) {
            // Inside a run of received datagrams: written together at its end (the TUN may coalesce them).
            this.collected[this.collectedCount++] = packet;
            return;
          }
          this.single[0] = packet;
          this.tun.write(this.single, 1);
        },
        endpointChanged: (peer, endpoint) => this.logger.verbose(`peer(${peer.name}) - endpoint is now ${endpoint}`),
        handshakeCompleted: (peer) => {
          this.countHandshake(peer);
          this.logger.verbose(`peer(${peer.name}) - handshake completed, keys ready`);
        },
      },
    });
    for (const candidate of [this.tun.liveness, this.bind.liveness]) {
      if (!isLiveness(candidate)) continue;
      candidate.onStall = (report) => this.logger.error(formatStall(report));
      this.watched.push(candidate);
    }
    // Transport messages are opened where they are received, and those of confirmed sessions
    // delivered there too (receive.ts); packets read from the TUN are sealed and sent where they
    // are read, for peers whose send-table entry allows it (docs/data-workers.md step 3).
    const tun = this.tun;
    const bind = this.bind;
    const routes = new PublishedRoutes(this.core.allowedIps, (peer) => peer.number);
    const selection = options.cryptoSelection ?? {};
    bind.openTransport?.({
      keypairs: this.core.keypairTable, indices: this.core.indexTable.shared, aead: options.crypto, selection, routes,
      sendTable: this.core.sendTable,
      deliver: (packets, count) => tun.write(packets, count),
      tunWriter: tun.threadWriter && (() => tun.threadWriter!()),
    });
    const core = this.core;
    tun.sendOnThread?.({
      keypairs: core.keypairTable, indices: core.indexTable.shared, sendTable: core.sendTable, routes, mtu: core.mtu,
      aead: options.crypto, selection, sockets: bind.threadSockets, send: (to, datagram) => bind.send(to, datagram),
    }, (peer, outcome, datagrams, bytes) => core.keepBooksOfSent(peer, outcome, datagrams, bytes));
    this.bind.onReceive((datagram, source, opened) => receive(core, datagram, source, opened), this.delivery);
    // What the kernel dropped from a full receive queue is counted, and means overload.
    this.bind.onKernelDrops?.((dropped) => this.core.reportReceiveOverflow(dropped));
    this.bind.onBacklog?.((pending, capacity) => this.core.reportReceiveBacklog(pending, capacity));
  }

  /**
   * Opens the UDP port (0 = any), starts reading the TUN and running timers, and resolves once
   * every thread runs (open, then running).
   */
  async start(listenPort = 0): Promise<void> {
    await this.open(listenPort);
    await this.running();
  }

  /**
   * Opens the UDP port (0 = any), starts reading the TUN and running timers. From here the device
   * takes configuration and traffic, while its threads (the crypto workers, started by the
   * constructor, the UDP reader and the TUN reader) may still be booting: what arrives meanwhile
   * waits in the kernel's queues and in the pool's rings for them (the pool takes tasks while its
   * workers load). See running().
   */
  async open(listenPort = 0): Promise<void> {
    await this.bind.open(listenPort);
    const bind = this.bind;
    const core = this.core;
    // What was received is accounted for before anything is sent (Bind.takeReceived).
    this.tun.start((packets, count) => {
      bind.takeReceived?.();
      for (let i = 0; i < count; i++) core.sendPacket(packets[i]);
    });
    this.scheduleTick();
    this.threadsRunning = Promise.all([this.bind.ready?.(), this.tun.ready?.()]).then(() => {
      this.logger.verbose(`device started: UDP port ${this.bind.port}, MTU ${this.tun.mtu}, TUN queues ${this.tun.readPerQueue?.length ?? 1}`);
      if (this.bind.openerFailed === true) {
        // Still correct (the core opens what the reader leaves), but every packet costs the main thread.
        this.logger.error('the UDP reader thread could not load an AEAD provider: received packets are opened on the main thread');
      }
      if (this.tun.senderFailed === true) {
        this.logger.error('the TUN reader thread could not load an AEAD provider: outbound packets are sealed on the main thread');
      }
    });
    this.threadsRunning.catch(() => {}); // reported to whoever awaits running()
  }

  /**
   * The device's timer: the MTU first (padding follows `ip link set mtu`, which wg-quick and the
   * agent run after the daemon started), then the protocol's timer rules.
   */
  tick(): void {
    this.followMtu();
    this.core.tick();
  }

  /** Arms the device's timer for the core's next deadline (see TICK_MIN_MS). */
  private scheduleTick(): void {
    this.ticker = setTimeout(this.runTick, nextTickDelay(this.core, this.core.clock.now()));
  }

  private readonly runTick = (): void => {
    if (this.closed) return;
    try {
      this.tick();
    } finally {
      this.scheduleTick(); // as an interval would: one failing run does not end the timer
    }
  };

  /**
   * Pads for the device's MTU as it is now. A stale larger one padded a packet past the MTU that
   * was set (up to 15 bytes): with an outer MTU sized to the tunnel's, and DF, such datagrams are
   * dropped on the way. One ioctl a tick on Linux.
   */
  private followMtu(): void {
    const mtu = this.tun.mtu;
    if (mtu === this.core.mtu || !(mtu > 0)) return;
    this.core.mtu = mtu;
    this.tun.sendingMtu?.(mtu);
    this.logger.verbose(`MTU is now ${mtu}: packets are padded for it`);
  }

  /**
   * Resolves once every thread runs; they boot at the same time, so this costs the slowest of
   * them, not their sum. Rejects when one cannot start.
   */
  running(): Promise<void> {
    return this.threadsRunning ?? Promise.reject(new Error('the device is not open'));
  }

  get listenPort(): number {
    return this.bind.port;
  }

  /** Rebinds the UDP sockets; rejects (code EADDRINUSE) when the port is taken. */
  async setListenPort(port: number): Promise<void> {
    if (port === this.bind.port) return;
    // Not awaiting bind.ready(): a new reader thread may take a while to start (the kernel keeps
    // what arrives meanwhile), and the control socket must answer at once.
    await this.bind.open(port);
    this.logger.verbose(`UDP port is now ${this.bind.port}`);
  }

  /** The firewall mark on outgoing datagrams (0 = none), applied to both UDP sockets. */
  async setFwmark(mark: number): Promise<void> {
    await this.bind.setMark(mark);
    this.fwmark = mark;
  }

  private countHandshake(peer: Peer): void {
    let counts = this.handshakes.get(peer);
    if (!counts) this.handshakes.set(peer, counts = { completed: 0, asInitiator: 0 });
    counts.completed++;
    // Called as the session becomes current: ours if we sent the initiation it answers.
    if (peer.keypairs.current?.isInitiator) counts.asInitiator++;
  }

  /** The counters `get=roamguard-stats` reports (dataplane/uapi/uapi-stats.ts). */
  stats(): DeviceStats {
    const counts = this.core.drops;
    const drops: Record<string, number> = {};
    const queueReads = this.tun.readPerQueue;
    for (const reason of DROP_REASONS) drops[reason] = counts.get(reason);
    const peers = [];
    for (const peer of this.core.peers) {
      const handshakes = this.handshakes.get(peer) ?? { completed: 0, asInitiator: 0 };
      const pending = peer.timers.retransmitHandshakeAt !== Infinity;
      peers.push({
        publicKey: peer.publicKey,
        rxBytes: peer.rxBytes,
        txBytes: peer.txBytes,
        handshakeAttempts: peer.handshakeAttemptsTotal,
        handshakesCompleted: handshakes.completed,
        // Every initiation is answered (a session we initiated), still in flight, or failed.
        handshakeFailures: Math.max(0, peer.handshakeAttemptsTotal - handshakes.asInitiator - (pending ? 1 : 0)),
        handshakePending: pending,
        endpointChanges: peer.roamCount,
        stagedPackets: peer.stagedCount,
      });
    }
    let pipelineStalls = 0;
    let pipelineStalledMs = 0;
    for (const w of this.watched) {
      pipelineStalls += w.stalls;
      pipelineStalledMs = Math.max(pipelineStalledMs, w.stalledMs);
    }
    return {
      version: STATS_VERSION,
      // The threads that seal: the TUN's readers, one per queue (0: a TUN without a reader thread).
      workerThreads: queueReads?.length ?? 0,
      drops,
      pipelineStalls,
      pipelineStalledMs: Math.round(pipelineStalledMs),
      tunQueueReads: queueReads,
      tunRepliesRead: this.tun.repliesReadPerQueue,
      peers,
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // Threads still booting finish first: a worker torn down while it loads a native addon
    // (koffi) aborts the whole process. The daemon may be told to stop right after it answered.
    await this.threadsRunning?.catch(() => {});
    if (this.ticker) clearTimeout(this.ticker);
    for (const peer of [...this.core.peers]) this.core.removePeer(peer.publicKey);
    this.tun.close();
    // A thread can still be booting here although threadsRunning settled: the interface deleted
    // under a booting queue stops it, and ready() stops waiting for a stopped queue. It ends by
    // itself once booted; the process exits after close(), which would kill it mid-load. So wait
    // for every reader thread's end, but not for ever (a thread stuck in its boot).
    await settledWithin(Promise.all([this.bind.close(), this.tun.threadsEnded?.()]), THREAD_END_TIMEOUT_MS);
  }
}
