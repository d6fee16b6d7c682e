/**
 * One queue of the Linux TUN device: its descriptor, the reader thread that reads it into a ring
 * (reader-worker.ts, which also seals and sends what it may: reader-sender.ts), and the main
 * thread's pump of that ring. LinuxTun owns one per queue of a multi-queue device
 * (IFF_MULTI_QUEUE); the kernel keeps each flow on one queue (flow-queue.ts), so each flow's
 * packets reach the handler in order, from one pump.
 *
 * The main thread waits on the ring with Atomics.waitAsync (the wait ends after a backstop too, a
 * lost notify costs no more than that) and hands every ready slot to the handler as one batch, as
 * views into the ring (no copy): first the books of what the reader sent itself (from the shared
 * table of sent-books.ts, then from the ring's records), per run of one outcome to one peer, then
 * the packets it left. A watchdog notices a ring the main thread stopped
 * taking from and recovers it.
 */
import { MessageChannel, type MessagePort, type Worker } from 'node:worker_threads';
import { EFD_CLOEXEC, EFD_NONBLOCK, errnoError, signalEventFd, type Libc } from '../sys/libc.ts';
import { startWorker, wakeAtExit } from '../sys/threads.ts';
import { StallWatch, lookEveryInterval, type StallHandler } from '../watchdog.ts';
import type { ReaderConfig } from './reader-worker.ts';
import { DEFAULT_SLOTS, DEVICE_GONE, PACKET_OFFSET, READ_ERRORS, REPLIES_READ, SENDER_FAILED, SEND_ERRORS, SEND_MTU, SLOT_SIZE, ringBytes, ringViews, type RingViews } from './ring.ts';
import { LEFT, NO_ROOM, RECORD_INTS, R_LENGTH, R_OUTCOME, R_PEER } from '../session/transport-sealer.ts';
import { shareSessions } from '../session/shared-sessions.ts';
import type { ReaderSendingConfig, SenderMessage } from './reader-sender.ts';
import { SENT_BOOKS_BYTES, SentBooks } from './sent-books.ts';
import {
  CONSUMER_WAITING, LAST_ERRNO, READ_SEQ, STATE, STATE_BOOTING, STATE_RUNNING, WRITE_SEQ, awaitStopped, release, requestStop, seqAdd, seqDistance,
} from '../ring/shared-ring.ts';
import { WaitBackstop, awaitBooted, awaitChange, settleWaits } from '../ring/ring-wait.ts';
import type { SentHandler, TunQueueRing, TunSending } from './tun.ts';

/** How close() waits for the reader to acknowledge the stop request (it normally takes microseconds). */
const STOP_TIMEOUT_MS = 2000;

/** What a queue reports to its device. */
export interface QueueOwner {
  readonly name: string;
  /** The packets the reader left for the main thread (views valid during the call). */
  onPackets(packets: Uint8Array[], count: number): void;
  /** The books of what the reader sealed and sent itself. */
  onSent: SentHandler | undefined;
  /** Packets that reached the main thread, either way. */
  countRead(packets: number): void;
  onStall: StallHandler | undefined;
  /** The interface went away (the reader saw it), or the reader failed for good. */
  gone(reason: Error): void;
}

export interface QueueOptions {
  /** Test only: the Nth wake-up of the waiting main thread is thrown away (a lost notify). */
  loseWakeUp?: number;
  watchdog?: boolean;
  /** Test only: the ring's first sequence number (e.g. just below 2^31 to cross the wrap-around). */
  startSequence?: number;
}

export class TunQueue {
  /** Reader-ring stalls the watchdog found (packets in the ring, none taken for STALL_MS). */
  stalls = 0;
  /** Packets this queue's reader handed over (sealed and sent, or left for the handler). */
  read = 0;
  private readonly ring: RingViews;
  private readonly buffer: SharedArrayBuffer;
  /** The books of rounds the reader sent whole (sent-books.ts), taken at each pump. */
  private readonly booksBuffer = new SharedArrayBuffer(SENT_BOOKS_BYTES);
  private readonly books = new SentBooks(this.booksBuffer);
  private readonly packets: Uint8Array[] = [];
  private readonly ringWatch: StallWatch;
  /** Ends the ring's watch (watchdog.ts). */
  private stopWatching: (() => void) | undefined;
  /** Identifies the current wait; a wake-up of an abandoned one (the watchdog's recovery) is ignored. */
  private waitToken = 0;
  private wakeUps = 0;
  private worker: Worker | undefined;
  /** Settles when the reader thread has exited (at once without one). */
  private exited: Promise<void> = Promise.resolve();
  private wakeFd = -1;
  /** Unregisters the reader's wake-up at process exit (threads.ts). */
  private forgetAtExit: (() => void) | undefined;
  private readonly backstop = new WaitBackstop();
  private stopFeeding: (() => void) | undefined;
  /** Posts a change to the reader's sender (set while it sends). */
  private postToSender: ((message: SenderMessage) => void) | undefined;
  private readSeq = 0;
  /** The ring's REPLIES_READ word when last looked at, and the replies counted up to then (repliesRead). */
  private repliesWord = 0;
  private repliesTotal = 0;
  private pumpScheduled = false;
  private stopped = false;

  constructor(
    private readonly libc: Libc,
    /** The queue's descriptor (non-blocking); the device closes it, after stop(). */
    readonly fd: number,
    readonly index: number,
    private readonly owner: QueueOwner,
    private readonly options: QueueOptions = {},
  ) {
    this.buffer = new SharedArrayBuffer(ringBytes({ slots: DEFAULT_SLOTS, slotSize: SLOT_SIZE }));
    this.ring = ringViews(this.buffer, { slots: DEFAULT_SLOTS, slotSize: SLOT_SIZE });
    this.ringWatch = new StallWatch(index === 0 ? 'TUN ring' : `TUN ring ${index}`);
    if (options.startSequence !== undefined) {
      const start = options.startSequence | 0;
      Atomics.store(this.ring.header, WRITE_SEQ, start);
      Atomics.store(this.ring.header, READ_SEQ, start);
      this.readSeq = start;
    }
  }

  get readErrors(): number {
    return Atomics.load(this.ring.header, READ_ERRORS);
  }

  /**
   * Reads of this queue by the UDP reader that brought a reply (tun/reply-reader.ts). The ring's
   * word is 32 bits and wraps; the total here does not, as long as it is asked for at least once
   * per 2^32 replies (the agent asks every few seconds).
   */
  get repliesRead(): number {
    const word = Atomics.load(this.ring.header, REPLIES_READ);
    this.repliesTotal += (word - this.repliesWord) >>> 0;
    this.repliesWord = word;
    return this.repliesTotal;
  }

  /** Datagrams the reader sealed that the kernel refused or had no room for. */
  get sendErrors(): number {
    return Atomics.load(this.ring.header, SEND_ERRORS);
  }

  /** Whether the reader thread could not load an AEAD provider (it then seals nothing). */
  get senderFailed(): boolean {
    return Atomics.load(this.ring.header, SENDER_FAILED) === 1;
  }

  /** Starts the reader thread; with `sending` it seals and sends what it may. */
  start(vnetHeader: boolean, sending: TunSending | undefined): void {
    const wakeFd = this.libc.eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wakeFd < 0) throw errnoError('eventfd', this.libc.errno());
    this.wakeFd = wakeFd;
    const config: ReaderConfig = { fd: this.fd, wakeFd, buffer: this.buffer, slots: DEFAULT_SLOTS, slotSize: SLOT_SIZE, vnetHeader };
    const transfer: MessagePort[] = [];
    if (sending !== undefined) {
      Atomics.store(this.ring.header, SEND_MTU, sending.mtu);
      config.sending = this.feedSending(sending, transfer);
      config.books = this.booksBuffer;
    }
    const entry = new URL(`./reader-worker${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url);
    const worker = startWorker(entry, { ...config }, transfer);
    this.worker = worker;
    this.forgetAtExit = wakeAtExit(() => {
      requestStop(this.ring.header);
      this.wakeReader();
    });
    this.exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
    if (this.options.watchdog !== false) {
      this.stopWatching = lookEveryInterval(this.watchRing);
    }
    worker.on('error', (err) => {
      if (!this.stopped) this.owner.gone(err instanceof Error ? err : new Error(String(err)));
    });
    worker.on('exit', (code) => {
      if (this.stopped) return;
      if (Atomics.load(this.ring.header, DEVICE_GONE) === 1) return this.schedulePump();
      this.owner.gone(new Error(`${this.owner.name}: TUN reader thread exited unexpectedly (code ${code})`));
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
    this.postToSender = post;
    const stopSockets = sending.sockets?.onChange(() => {
      const sockets = sending.sockets!.current();
      if (sockets !== undefined) post({ kind: 'sockets', sockets });
    });
    this.stopFeeding = () => {
      this.postToSender = undefined;
      sessions.stop();
      stopSockets?.();
      sessionsChannel.port1.close();
      senderChannel.port1.close();
    };
    transfer.push(sessionsChannel.port2, senderChannel.port2);
    return {
      sessions: sessions.init, sessionsPort: sessionsChannel.port2, port: senderChannel.port2, posted, sockets: sending.sockets?.current(), selection: sending.selection,
    };
  }

  /** The MTU the packets sealed from this queue are padded for, from the next round on (whichever thread reads it). */
  sendingMtu(mtu: number): void {
    Atomics.store(this.ring.header, SEND_MTU, mtu);
  }

  /** The ring and the sent-books table, for the UDP reader that reads this queue's replies while its thread sleeps (reply-reader.ts). */
  get shared(): TunQueueRing {
    return { ring: this.buffer, books: this.booksBuffer };
  }

  /**
   * Settles once the reader thread has exited. After stop() a thread that was still booting ends
   * by itself once booted (it is never terminated then); the process must not exit before.
   */
  get ended(): Promise<void> {
    return this.exited;
  }

  /** Waits (until `deadline`, a performance.now() time) for the reader thread to begin. */
  async ready(deadline: number, timeoutMs: number): Promise<void> {
    if (this.worker === undefined) return;
    const header = this.ring.header;
    while (Atomics.load(header, STATE) === STATE_BOOTING && !this.stopped) {
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`${this.owner.name}: the TUN reader thread did not start within ${timeoutMs} ms`);
      await awaitBooted(header, left);
    }
  }

  /**
   * Stops the reader (the stop handshake of reader-worker.ts; afterwards it no longer uses the
   * descriptors) and settles the main thread's pending waits. The device closes the fd after.
   */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.stopWatching?.();
    this.stopWatching = undefined;
    this.stopReader();
    this.stopFeeding?.();
    this.stopFeeding = undefined;
    this.forgetAtExit?.();
    this.forgetAtExit = undefined;
    if (this.wakeFd >= 0) this.libc.close(this.wakeFd);
    this.wakeFd = -1;
    settleWaits(this.ring.header);
  }

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
    if (this.wakeFd >= 0) signalEventFd(this.libc, this.wakeFd);
  }

  private waitForPackets(): void {
    if (this.stopped) return;
    const header = this.ring.header;
    const seen = Atomics.load(header, WRITE_SEQ);
    if (seen !== this.readSeq || Atomics.load(header, DEVICE_GONE) === 1) return this.schedulePump();
    const token = ++this.waitToken;
    const loseWakeUp = this.options.loseWakeUp;
    // The wait also ends after its backstop (a lost notify, items published without ringing, books
    // in the table; the pump looks again). `read` counts both the ring's packets and the table's books.
    const woken = awaitChange(header, WRITE_SEQ, CONSUMER_WAITING, seen, loseWakeUp === undefined ? this.backstop.next(this.read) : undefined);
    if (woken === undefined) return this.schedulePump();
    void woken.then(() => {
      if (++this.wakeUps === loseWakeUp) return; // test only: a lost notify
      if (token === this.waitToken) this.pump();
    });
  }

  get stalledMs(): number {
    return this.ringWatch.stalledMs(performance.now());
  }

  /**
   * The watchdog (every WATCH_INTERVAL_MS while the reader runs): packets the reader
   * published and the main thread has not taken for STALL_MS mean its wake-up went astray.
   * Reported once, counted, recovered by abandoning the wait and pumping now. (The reader's own
   * wait for room is bounded already.)
   */
  private readonly watchRing = (): void => {
    if (this.stopped) return;
    const header = this.ring.header;
    const written = Atomics.load(header, WRITE_SEQ);
    const before = this.ringWatch.stalls;
    const recover = this.ringWatch.check(performance.now(), written !== this.readSeq, this.readSeq, () => ({
      written, consumed: this.readSeq, slots: DEFAULT_SLOTS, mainWaiting: Atomics.load(header, CONSUMER_WAITING) !== 0,
      pumpScheduled: this.pumpScheduled, state: Atomics.load(header, STATE),
    }), this.owner.onStall);
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
    if (this.stopped) return;
    const { header, lengths, records, data } = this.ring;
    if (this.owner.onSent !== undefined) this.books.tryDrain(this.keepBooks);
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
      return this.owner.gone(errnoError(`${this.owner.name}: TUN read`, errno, 'interface deleted'));
    }
    this.waitForPackets();
  };

  private readonly keepBooks = (peer: number, outcome: number, datagrams: number, bytes: number): void => {
    this.read += datagrams;
    this.owner.countRead(datagrams);
    try {
      this.owner.onSent!(peer, outcome, datagrams, bytes);
    } catch (err) {
      queueMicrotask(() => { throw err; });
    }
  };

  /** Calls the handler; returns what it threw, if anything. */
  private deliver(packets: Uint8Array[], count: number): unknown {
    this.read += count;
    this.owner.countRead(count);
    try {
      this.owner.onPackets(packets, count);
      return undefined;
    } catch (err) {
      return err ?? new Error('TUN packet handler threw a nullish value');
    }
  }
}
