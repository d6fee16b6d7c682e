/**
 * The Linux TUN device: /dev/net/tun with IFF_TUN | IFF_NO_PI (whole IP packets, no packet-info
 * header), libc reached through FFI (libc.ts: koffi on Node, bun:ffi on Bun).
 *
 * Reading. Node cannot poll an arbitrary fd, and a blocking read through the libuv thread pool
 * costs one thread-pool round trip per packet and parks a pool thread (there are four). Instead a
 * dedicated worker thread (reader-worker.ts) polls the non-blocking fd, reads each ready packet
 * straight into a slot of a SharedArrayBuffer ring (ring.ts) and wakes the main thread with
 * Atomics.notify; the main thread waits with Atomics.waitAsync and hands every ready slot to the
 * handler as one batch, as views into the ring (no copy). The read syscalls thus run beside the
 * main thread's packet processing, and the wake-ups coalesce under load. Measured figures and the
 * alternatives that were compared are in bench/tun-micro.ts and docs/performance.md (reading on
 * the event loop through libuv cost about 3.5 µs of main-thread time per packet against 2 µs
 * here). The same code runs on Bun (bun:ffi in both threads, Bun's worker_threads and
 * Atomics.waitAsync).
 *
 * Writing happens on the main thread: one write(2) per packet through FFI. TUN writes never block
 * (the packet is injected into the stack at once); the fd is non-blocking anyway, and any error
 * (EAGAIN, EINVAL for a malformed packet, EIO while the link is down) only counts.
 *
 * Offloads (the default; `offload: false` turns them off). The device is
 * opened with IFF_VNET_HDR and TUNSETOFFLOAD(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6): the kernel's
 * TCP hands over super-packets of up to 64 KiB, which the reader splits into MTU-sized
 * segments (offload.ts) before the handler sees them, so the pipelines still get ordinary packets;
 * and write() coalesces the TCP segments of one call per flow into super-packets again (GRO), one
 * write(2) each. Measured with the bench suite (iperf3, one TCP stream): tunnel CPU per GB
 * 81-109 s -> 56-67 s with dgram UDP; the kernel's TCP on both ends does far less work too.
 *
 * Disappearance. `ip link del` detaches the fd: the worker's poll reports POLLERR and read fails
 * with EBADFD, so the worker reports DEVICE_GONE at once. As a fallback, every second the main
 * thread checks that /sys/class/net/NAME still exists and, when it does not (deleted, or renamed),
 * confirms with a zero-length write, which fails with EBADFD only on a detached fd. onClose
 * handlers run once.
 */
import { existsSync } from 'node:fs';
import { MessageChannel, type MessagePort, type Worker } from 'node:worker_threads';
import {
  AF_INET, EBADFD, EFD_CLOEXEC, EFD_NONBLOCK, IFF_NO_PI, IFF_TUN, IFF_VNET_HDR, IFNAMSIZ, IFREQ_SIZE,
  O_CLOEXEC, O_NONBLOCK, O_RDWR, SIOCGIFMTU, SIOCSIFMTU, SOCK_CLOEXEC, SOCK_DGRAM, TUNSETIFF, TUNSETOFFLOAD, TUN_F_CSUM, TUN_F_TSO4,
  TUN_F_TSO6, cString, errnoError, loadLibc, type Libc,
} from '../sys/libc.ts';
import { TunPacketWriter } from './tun-writer.ts';
import { startWorker } from '../sys/threads.ts';
import { StallWatch, WATCH_INTERVAL_MS as RING_WATCH_INTERVAL_MS, type Liveness, type StallHandler } from '../watchdog.ts';
import type { ReaderConfig } from './reader-worker.ts';
import { DEFAULT_SLOTS, DEVICE_GONE, PACKET_OFFSET, READ_ERRORS, SENDER_FAILED, SEND_ERRORS, SLOT_SIZE, ringBytes, ringViews, type RingViews } from './ring.ts';
import { LEFT, NO_ROOM, RECORD_INTS, R_LENGTH, R_OUTCOME, R_PEER } from '../session/transport-sealer.ts';
import { shareSessions } from '../session/shared-sessions.ts';
import type { ReaderSendingConfig, SenderMessage } from './reader-sender.ts';
import {
  CONSUMER_WAITING, LAST_ERRNO, READ_SEQ, STATE, STATE_BOOTING, STATE_RUNNING, WRITE_SEQ, awaitStopped, release, requestStop, seqAdd, seqDistance,
} from '../ring/shared-ring.ts';
import { READER_WAIT_BACKSTOP_MS, awaitBooted, awaitChange, settleWaits } from '../ring/ring-wait.ts';
import type { OpenTunOptions, SentHandler, Tun, TunSending, TunStats, TunThreadWriter } from './tun.ts';

/** How often the fallback existence check runs. */
const WATCH_INTERVAL_MS = 1000;
/** How long ready() waits for the reader thread (tsx compiles its modules first under Node). */
const READY_TIMEOUT_MS = 30_000;
/** How long close() waits for the reader to acknowledge the stop request (it normally takes microseconds). */
const STOP_TIMEOUT_MS = 2000;
class LinuxTunStats implements TunStats {
  readPackets = 0;
  writePackets = 0;
  writeErrors = 0;
  readonly #header: Int32Array;
  constructor(header: Int32Array) {
    this.#header = header;
  }
  get readErrors(): number {
    return Atomics.load(this.#header, READ_ERRORS);
  }
  /** Datagrams the reader sealed that the kernel refused or had no room for. */
  get sendErrors(): number {
    return Atomics.load(this.#header, SEND_ERRORS);
  }
}

function readName(ifr: Uint8Array): string {
  let end = 0;
  while (end < IFNAMSIZ && ifr[end] !== 0) end++;
  return new TextDecoder().decode(ifr.subarray(0, end));
}

function ifreq(name: string): Uint8Array {
  const ifr = new Uint8Array(IFREQ_SIZE);
  const bytes = new TextEncoder().encode(name);
  if (bytes.length >= IFNAMSIZ) throw new RangeError(`interface name ${JSON.stringify(name)} is too long`);
  ifr.set(bytes);
  return ifr;
}

export class LinuxTun implements Tun, Liveness {
  readonly stats: LinuxTunStats;
  /** Reader-ring stalls the watchdog found (packets in the ring, none taken for STALL_MS). */
  stalls = 0;
  onStall: StallHandler | undefined = undefined;
  private readonly ringWatch = new StallWatch('TUN ring');
  private ringTimer: ReturnType<typeof setInterval> | undefined;
  /** Identifies the current wait; a wake-up of an abandoned one (the watchdog's recovery) is ignored. */
  private waitToken = 0;
  private wakeUps = 0;
  /** Test only: the Nth wake-up of the waiting main thread is thrown away (a lost notify). */
  private loseWakeUp: number | undefined;
  private watchdogEnabled = true;
  /** Why the device closed by itself (device deleted, reader failure); undefined otherwise. */
  closeReason: Error | undefined;

  private readonly ring: RingViews;
  private readonly buffer: SharedArrayBuffer;
  private readonly packets: Uint8Array[] = [];
  private readonly closeHandlers: Array<() => void> = [];
  private readonly probe = new Uint8Array(1);
  /** With a vnet header: the buffer each write is assembled in, and coalesceAndWrite's scratch. */
  /** The main thread's writes (with their own scratch buffers). */
  private readonly writer: TunPacketWriter;
  private worker: Worker | undefined;
  private wakeFd = -1;
  private onPackets: ((packets: Uint8Array[], count: number) => void) | undefined;
  /** With sendOnThread: what the reader gets to send, the books' handler, and how to stop feeding it. */
  private sending: TunSending | undefined;
  private onSent: SentHandler | undefined;
  private stopFeeding: (() => void) | undefined;
  private readSeq = 0;
  private pumpScheduled = false;
  private closed = false;
  private gone = false;
  private lastMtu: number;
  private watchTimer: ReturnType<typeof setInterval> | undefined;
  private readonly sysfsPath: string;
  private sysfsUsable: boolean;

  private constructor(
    private readonly libc: Libc,
    private readonly fd: number,
    private readonly ctlFd: number,
    readonly name: string,
    /** The fd carries a vnet header (IFF_VNET_HDR); offloads are on when `offloads` is not 0. */
    readonly vnetHeader: boolean,
    /** The TUN_F_* offloads the kernel accepted (0 = none). */
    readonly offloads: number,
  ) {
    this.buffer = new SharedArrayBuffer(ringBytes({ slots: DEFAULT_SLOTS, slotSize: SLOT_SIZE }));
    this.writer = new TunPacketWriter(libc, fd, vnetHeader, offloads);
    this.ring = ringViews(this.buffer, { slots: DEFAULT_SLOTS, slotSize: SLOT_SIZE });
    this.stats = new LinuxTunStats(this.ring.header);
    this.lastMtu = 0;
    this.lastMtu = this.mtu;
    this.sysfsPath = `/sys/class/net/${name}`;
    // Only trust sysfs if it shows the interface now: a process that entered the namespace with
    // setns() without remounting /sys sees another namespace's interfaces there.
    this.sysfsUsable = existsSync(this.sysfsPath);
    this.watchTimer = setInterval(() => this.watch(), WATCH_INTERVAL_MS);
    this.watchTimer.unref?.();
  }

  /** Creates or attaches to the TUN interface `name` (see openTun in tun.ts). */
  static async open(name: string, options: OpenTunOptions = {}): Promise<LinuxTun> {
    const libc = await loadLibc();
    let vnetHeader = options.offload ?? true;
    let offloads = 0;
    let ifr = ifreq(name);
    const fd = libc.open(cString('/dev/net/tun'), O_RDWR | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0) throw errnoError('open(/dev/net/tun)', libc.errno());
    let ctlFd = -1;
    let actual: string;
    try {
      new Uint16Array(ifr.buffer, 16, 1)[0] = IFF_TUN | IFF_NO_PI | (vnetHeader ? IFF_VNET_HDR : 0);
      if (libc.ioctl(fd, TUNSETIFF, ifr) < 0) {
        if (!vnetHeader) throw errnoError('ioctl(TUNSETIFF)', libc.errno(), name);
        // E.g. a persistent device made without IFF_VNET_HDR: attach without offloads.
        vnetHeader = false;
        ifr = ifreq(name);
        new Uint16Array(ifr.buffer, 16, 1)[0] = IFF_TUN | IFF_NO_PI;
        if (libc.ioctl(fd, TUNSETIFF, ifr) < 0) throw errnoError('ioctl(TUNSETIFF)', libc.errno(), name);
      }
      if (vnetHeader) {
        const wanted = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
        // Without them (an old kernel) the vnet header stays, with every packet whole (GSO_NONE).
        if (libc.ioctlValue(fd, TUNSETOFFLOAD, wanted) === 0) offloads = wanted;
        else if (libc.ioctlValue(fd, TUNSETOFFLOAD, TUN_F_CSUM) === 0) offloads = TUN_F_CSUM;
      }
      actual = readName(ifr);
      ctlFd = libc.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (ctlFd < 0) throw errnoError('socket(AF_INET, SOCK_DGRAM)', libc.errno());
    } catch (err) {
      libc.close(fd);
      throw err;
    }
    // From here on the object owns both descriptors; close() releases them.
    const tun = new LinuxTun(libc, fd, ctlFd, actual, vnetHeader, offloads);
    try {
      if (options.mtu !== undefined) tun.setMtu(options.mtu);
    } catch (err) {
      tun.close();
      throw err;
    }
    return tun;
  }

  /**
   * Test only: the worker reader over any readable, non-blocking descriptor that returns one
   * "packet" per read (a datagram socket), so that the ring hand-off is tested without root and
   * without a TUN device. The object owns `fd` (close() closes it); it has no MTU or sysfs entry.
   */
  static async overDescriptorForTests(fd: number, options: { watchdog?: boolean; loseWakeUp?: number; startSequence?: number } = {}): Promise<LinuxTun> {
    const libc = await loadLibc();
    const tun = new LinuxTun(libc, fd, -1, 'test-descriptor', false, 0);
    if (options.startSequence !== undefined) {
      // The ring's first sequence number, e.g. just below 2^31 to cross the wrap-around.
      const start = options.startSequence | 0;
      Atomics.store(tun.ring.header, WRITE_SEQ, start);
      Atomics.store(tun.ring.header, READ_SEQ, start);
      tun.readSeq = start;
    }
    tun.watchdogEnabled = options.watchdog !== false;
    tun.loseWakeUp = options.loseWakeUp;
    if (tun.watchTimer) clearInterval(tun.watchTimer); // no interface to watch
    tun.watchTimer = undefined;
    return tun;
  }

  get mtu(): number {
    if (this.closed) return this.lastMtu;
    const ifr = ifreq(this.name);
    if (this.libc.ioctl(this.ctlFd, SIOCGIFMTU, ifr) === 0) this.lastMtu = new Int32Array(ifr.buffer, 16, 1)[0];
    return this.lastMtu;
  }

  setMtu(mtu: number): void {
    if (!Number.isInteger(mtu) || mtu < 68 || mtu > 65535) throw new RangeError(`MTU must be an integer in 68..65535, got ${mtu}`);
    if (this.closed) throw new Error(`${this.name}: device is closed`);
    const ifr = ifreq(this.name);
    new Int32Array(ifr.buffer, 16, 1)[0] = mtu;
    if (this.libc.ioctl(this.ctlFd, SIOCSIFMTU, ifr) < 0) throw errnoError('ioctl(SIOCSIFMTU)', this.libc.errno(), `${this.name} mtu ${mtu}`);
    this.lastMtu = mtu;
  }

  sendOnThread(sending: TunSending, onSent: SentHandler): void {
    if (this.onPackets) throw new Error(`${this.name}: sendOnThread() after start()`);
    this.sending = sending;
    this.onSent = onSent;
  }

  /** Whether the reader thread could not load an AEAD provider (it then seals nothing: the main thread does). */
  get senderFailed(): boolean {
    return Atomics.load(this.ring.header, SENDER_FAILED) === 1;
  }

  start(onPackets: (packets: Uint8Array[], count: number) => void): void {
    if (this.onPackets) throw new Error(`${this.name}: start() was already called`);
    if (this.closed) throw new Error(`${this.name}: device is closed`);
    this.onPackets = onPackets;
    const wakeFd = this.libc.eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wakeFd < 0) throw errnoError('eventfd', this.libc.errno());
    this.wakeFd = wakeFd;
    const config: ReaderConfig = { fd: this.fd, wakeFd, buffer: this.buffer, slots: DEFAULT_SLOTS, slotSize: SLOT_SIZE, vnetHeader: this.vnetHeader };
    const transfer: MessagePort[] = [];
    if (this.sending !== undefined) config.sending = this.feedSending(this.sending, transfer);
    const entry = new URL(`./reader-worker${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url);
    const worker = startWorker(entry, { ...config }, transfer);
    this.worker = worker;
    if (this.watchdogEnabled) {
      this.ringTimer = setInterval(this.watchRing, RING_WATCH_INTERVAL_MS);
      this.ringTimer.unref?.();
    }
    worker.on('error', (err) => this.fail(err instanceof Error ? err : new Error(String(err))));
    worker.on('exit', (code) => {
      if (this.closed || this.gone) return;
      if (Atomics.load(this.ring.header, DEVICE_GONE) === 1) return this.schedulePump();
      this.fail(new Error(`${this.name}: TUN reader thread exited unexpectedly (code ${code})`));
    });
    this.waitForPackets();
  }

  /**
   * What the reader thread starts with to send (reader-sender.ts), and from now on every change
   * posted to it: the sessions' (new keypair chunks, routes), the send table's chunks, the bind's
   * sockets after a reopen (fresh duplicates each time; the reader closes the ones it replaces).
   */
  private feedSending(sending: TunSending, transfer: MessagePort[]): ReaderSendingConfig & { selection: TunSending['selection'] } {
    const sessionsChannel = new MessageChannel();
    const senderChannel = new MessageChannel();
    const posted = new SharedArrayBuffer(4);
    const post = (message: SenderMessage) => {
      senderChannel.port1.postMessage(message);
      Atomics.add(new Int32Array(posted), 0, 1); // after the post: whoever sees the count finds the message
      this.wakeReader(); // it may sit in poll, holding the replaced sockets open
    };
    const sessions = shareSessions(sending.keypairs, sending.indices, sending.routes, (m) => sessionsChannel.port1.postMessage(m), sending.sendTable);
    const stopSockets = sending.sockets?.onChange(() => {
      const sockets = sending.sockets!.current();
      if (sockets !== undefined) post({ kind: 'sockets', sockets });
    });
    this.stopFeeding = () => {
      sessions.stop();
      stopSockets?.();
      sessionsChannel.port1.close();
      senderChannel.port1.close();
    };
    transfer.push(sessionsChannel.port2, senderChannel.port2);
    return {
      sessions: sessions.init, sessionsPort: sessionsChannel.port2, port: senderChannel.port2, posted, sockets: sending.sockets?.current(), mtu: sending.mtu, selection: sending.selection,
    };
  }

  /** See Tun.ready: waits (at most 30 s) for the reader thread to begin. */
  async ready(): Promise<void> {
    if (this.worker === undefined) return;
    const header = this.ring.header;
    const deadline = performance.now() + READY_TIMEOUT_MS;
    while (Atomics.load(header, STATE) === STATE_BOOTING && !this.closed) {
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`${this.name}: the TUN reader thread did not start within ${READY_TIMEOUT_MS} ms`);
      await awaitBooted(header, left);
    }
  }

  write(packets: Uint8Array[], count: number): void {
    const stats = this.stats;
    if (this.closed) {
      stats.writeErrors += count;
      return;
    }
    const written = this.writer.write(packets, count);
    stats.writePackets += written;
    stats.writeErrors += count - written;
  }

  onClose(handler: () => void): void {
    if (this.gone) {
      setTimeout(handler, 0);
      return;
    }
    this.closeHandlers.push(handler);
  }

  /** A dup of the device's descriptor for another thread's writes (its owner closes it), and the write format. */
  threadWriter(): TunThreadWriter | undefined {
    if (this.closed) return undefined;
    const fd = this.libc.dup(this.fd);
    return fd < 0 ? undefined : { fd, vnetHeader: this.vnetHeader, offloads: this.offloads };
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.watchTimer) clearInterval(this.watchTimer);
    this.watchTimer = undefined;
    if (this.ringTimer) clearInterval(this.ringTimer);
    this.ringTimer = undefined;
    this.stopReader();
    this.stopFeeding?.();
    this.stopFeeding = undefined;
    this.libc.close(this.fd);
    if (this.ctlFd >= 0) this.libc.close(this.ctlFd);
    if (this.wakeFd >= 0) this.libc.close(this.wakeFd);
    this.wakeFd = -1;
    // Settles the main thread's pending waits on the ring, so nothing is left waiting.
    settleWaits(this.ring.header);
  }

  // --- reading --------------------------------------------------------------------------------------

  /** Stop handshake with the reader (see reader-worker.ts); afterwards it no longer uses the fds. */
  private stopReader(): void {
    const worker = this.worker;
    if (!worker) return;
    const header = this.ring.header;
    const state = requestStop(header);
    if (state === STATE_BOOTING) {
      // The reader has not begun: it will see STOPPED and return by itself. Terminating a worker
      // that is still loading koffi's native addon aborts the whole process, so we must not.
      worker.unref();
      return;
    }
    if (state === STATE_RUNNING) {
      this.wakeReader(); // it may sit in poll
      awaitStopped(header, STOP_TIMEOUT_MS);
    }
    void worker.terminate().catch(() => {});
  }

  /** Interrupts the reader's poll (it then looks at STATE and at posted changes). */
  private wakeReader(): void {
    if (this.wakeFd < 0) return;
    const one = new Uint8Array(8);
    new BigUint64Array(one.buffer)[0] = 1n; // the eventfd counter increment, a host-order u64
    this.libc.write(this.wakeFd, one, 8);
  }

  private waitForPackets(): void {
    if (this.closed) return;
    const header = this.ring.header;
    const seen = Atomics.load(header, WRITE_SEQ);
    if (seen !== this.readSeq || Atomics.load(header, DEVICE_GONE) === 1) return this.schedulePump();
    const token = ++this.waitToken;
    // The wait also ends after its backstop (a lost notify; the pump looks again).
    const woken = awaitChange(header, WRITE_SEQ, CONSUMER_WAITING, seen, this.loseWakeUp === undefined ? READER_WAIT_BACKSTOP_MS : undefined);
    if (woken === undefined) return this.schedulePump();
    void woken.then(() => {
      if (++this.wakeUps === this.loseWakeUp) return; // test only: a lost notify
      if (token === this.waitToken) this.pump();
    });
  }

  get liveness(): Liveness | undefined {
    return this;
  }

  get stalledMs(): number {
    return this.ringWatch.stalledMs(performance.now());
  }

  /**
   * The watchdog (every RING_WATCH_INTERVAL_MS while the worker reader runs): packets the reader
   * published and the main thread has not taken for STALL_MS mean its wake-up went astray.
   * Reported once, counted, recovered by abandoning the wait and pumping now. (The reader's own
   * wait for room is bounded already: Atomics.wait with a 1 s timeout.)
   */
  private readonly watchRing = (): void => {
    if (this.closed) return;
    const header = this.ring.header;
    const written = Atomics.load(header, WRITE_SEQ);
    const before = this.ringWatch.stalls;
    const recover = this.ringWatch.check(performance.now(), written !== this.readSeq, this.readSeq, () => ({
      written, consumed: this.readSeq, slots: DEFAULT_SLOTS, mainWaiting: Atomics.load(header, CONSUMER_WAITING) !== 0,
      pumpScheduled: this.pumpScheduled, state: Atomics.load(header, STATE),
    }), this.onStall);
    this.stalls += this.ringWatch.stalls - before;
    if (recover) {
      this.waitToken++;
      this.schedulePump();
    }
  };

  /** Runs the pump from the macrotask queue, so a steady stream of packets cannot starve other I/O. */
  private schedulePump(): void {
    if (this.pumpScheduled) return;
    this.pumpScheduled = true;
    setImmediate(this.pump);
  }

  private readonly pump = (): void => {
    this.pumpScheduled = false;
    if (this.closed) return;
    const { header, lengths, records, data } = this.ring;
    const write = Atomics.load(header, WRITE_SEQ);
    let seq = this.readSeq;
    const count = seqDistance(write, seq);
    if (count > 0) {
      const packets = this.packets;
      const mask = DEFAULT_SLOTS - 1;
      let left = 0;
      // The books of what the reader sent itself, per run of one outcome to one peer, first.
      let runPeer = -1, runOutcome = LEFT, runDatagrams = 0, runBytes = 0;
      for (let i = 0; i < count; i++) {
        const slot = seq & mask;
        seq = seqAdd(seq, 1);
        const r = slot * RECORD_INTS;
        const outcome = records[r + R_OUTCOME];
        if (outcome === LEFT) {
          const offset = slot * SLOT_SIZE + PACKET_OFFSET;
          packets[left++] = data.subarray(offset, offset + lengths[slot]);
          continue;
        }
        if (outcome === NO_ROOM) continue; // counted by the reader (SEND_ERRORS)
        const peer = records[r + R_PEER];
        if (peer !== runPeer || outcome !== runOutcome) {
          if (runDatagrams > 0) this.keepBooks(runPeer, runOutcome, runDatagrams, runBytes);
          runPeer = peer;
          runOutcome = outcome;
          runDatagrams = 0;
          runBytes = 0;
        }
        runDatagrams++;
        runBytes += records[r + R_LENGTH];
      }
      if (runDatagrams > 0) this.keepBooks(runPeer, runOutcome, runDatagrams, runBytes);
      const failure = left > 0 ? this.deliver(packets, left) : undefined;
      this.readSeq = write;
      release(header, write);
      // A throwing handler is a bug in the caller: surface it, but keep the ring consistent first.
      if (failure !== undefined) queueMicrotask(() => { throw failure; });
    }
    if (Atomics.load(header, DEVICE_GONE) === 1 && Atomics.load(header, WRITE_SEQ) === this.readSeq) {
      const errno = Atomics.load(header, LAST_ERRNO);
      return this.deviceGone(errnoError(`${this.name}: TUN read`, errno, 'interface deleted'));
    }
    this.waitForPackets();
  };

  private keepBooks(peer: number, outcome: number, datagrams: number, bytes: number): void {
    this.stats.readPackets += datagrams;
    try {
      this.onSent!(peer, outcome, datagrams, bytes);
    } catch (err) {
      queueMicrotask(() => { throw err; });
    }
  }

  /** Calls the handler; returns what it threw, if anything. */
  private deliver(packets: Uint8Array[], count: number): unknown {
    this.stats.readPackets += count;
    try {
      this.onPackets!(packets, count);
      return undefined;
    } catch (err) {
      return err ?? new Error('TUN packet handler threw a nullish value');
    }
  }

  // --- disappearance ---------------------------------------------------------------------------------

  private watch(): void {
    if (this.closed) return;
    if (this.sysfsUsable && existsSync(this.sysfsPath)) return;
    // Missing from sysfs (deleted, or renamed), or sysfs not usable: ask the fd itself. A
    // zero-length write fails with EBADFD only when the device is detached.
    if (this.libc.write(this.fd, this.probe, 0) < 0 && this.libc.errno() === EBADFD) {
      this.deviceGone(new Error(`${this.name}: interface deleted`));
    }
  }

  private fail(err: Error): void {
    if (this.closed) return;
    this.deviceGone(err);
  }

  private deviceGone(reason: Error): void {
    if (this.gone) return;
    this.gone = true;
    this.closeReason = reason;
    this.close();
    for (const handler of this.closeHandlers.splice(0)) {
      try {
        handler();
      } catch (err) {
        queueMicrotask(() => { throw err; });
      }
    }
  }
}
