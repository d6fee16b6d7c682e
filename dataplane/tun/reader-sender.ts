/**
 * What the TUN reader thread does with the packets it read before the main thread sees them
 * (docs/data-workers.md, step 3): seal those it may (session/transport-sealer.ts: route, send
 * table, hold, nonces, AEAD in place in the ring's slots) and send them itself, with sendmmsg
 * over its own duplicates of the bind's UDP sockets (bind/udp-send.ts: GSO runs, sticky
 * sources). Each slot's record then tells the main thread what happened: LEFT (its packet is for
 * the main thread, as before), SEALED (sent; only books to keep), SOURCE_REFUSED (sent, but from
 * an address the kernel picked: the sticky source is gone), NO_ROOM (sealed, then dropped),
 * ZERO_KEY_REFUSED.
 *
 * The main thread's changes reach it through two MessagePorts it reads only when it has to: the
 * sessions' (keypair and send-table chunks, routes; shared-sessions.ts) when it meets a chunk it
 * lacks or a new routes version, and this module's (new sockets after the bind reopened) when a
 * shared counter says something was posted. The MTU it pads for is set before each round
 * (queue-drain.ts reads it from the ring's header).
 *
 * Two threads have one: the TUN queue's own reader, with duplicates of the bind's sockets that it
 * owns, and the UDP reader for the replies it reads itself (reply-reader.ts), with the sockets it
 * receives on and the sessions view it opens with.
 *
 * When the kernel's send buffer is full the thread waits for room (poll for POLLOUT, at most
 * FULL_WAIT_MS), which holds the TUN's packets in the kernel's queue: back-pressure, as a native
 * sender blocks. What still finds no room, or the kernel refuses, is counted (SEND_ERRORS).
 */
import { receiveMessageOnPort, type MessagePort } from 'node:worker_threads';
import type { SlotAead } from '../crypto/primitives.ts';
import { EINTR, POLLOUT, type Libc } from '../sys/libc.ts';
import { SharedAddresses } from '../sys/shared-addresses.ts';
import { SharedSessionsView, type SharedSessionsInit, type SharedSessionsMessage } from '../session/shared-sessions.ts';
import type { SendTarget } from '../session/send-table.ts';
import { LEFT, MAX_RUN, NO_ROOM, RECORD_INTS, R_LENGTH, R_OUTCOME, SOURCE_REFUSED, TransportSealer } from '../session/transport-sealer.ts';
import {
  STOPPED_FULL, STOPPED_GSO, STOPPED_SOURCE, TxArea, encodeSockaddr, encodeSourceControl, newSendProgress, sendInPlace,
} from '../bind/udp-send.ts';
import type { ThreadSockets } from '../bind/bind.ts';


/** The longest the thread waits for room in a full socket send buffer before it drops the rest. */
const FULL_WAIT_MS = 100;

/** What the TUN reader gets to send (in its workerData). */
export interface ReaderSendingConfig {
  sessions: SharedSessionsInit;
  /** The sessions' changes (SharedSessionsMessage). */
  sessionsPort: MessagePort;
  /** This module's changes (SenderMessage); `posted` counts them (Int32Array[1]). */
  port: MessagePort;
  posted: SharedArrayBuffer;
  /** The sockets (duplicates: this thread closes them), or undefined until the bind is open. */
  sockets: ThreadSockets | undefined;
}

/** A change, posted by the main thread: the bind's sockets after it reopened (fresh duplicates). */
export type SenderMessage = { kind: 'sockets'; sockets: ThreadSockets };

/** Where a sender's sockets come from. */
export type SenderSockets =
  /** The TUN queue's reader: duplicates it owns, replaced by the SenderMessages posted to `port`. */
  | { owned: ReaderSendingConfig }
  /** The UDP reader: the sockets it receives on, which its owner closes, and the sessions view it opens with. */
  | { borrowed: ThreadSockets; sessions: SharedSessionsView };

export class ReaderSender {
  private readonly sealer: TransportSealer;
  private readonly sessions: SharedSessionsView;
  /** With owned sockets: the count of posted changes, and the port they come through. */
  private readonly posted: Int32Array | undefined;
  private readonly port: MessagePort | undefined;
  private postedSeen = 0;
  private sockets: ThreadSockets | undefined;
  private readonly tx: TxArea;
  private readonly progress = newSendProgress();
  private readonly runLengths = new Int32Array(MAX_RUN);
  /** Per peer number: the destination and source control message, made from the entry of SEQ `seq`. */
  private readonly names = new Map<number, { seq: number; name: Uint8Array; source: Uint8Array | undefined }>();
  /** Raw addresses of the ring buffers (one, in practice). */
  private readonly addresses: SharedAddresses;
  private readonly pollBytes = new Uint8Array(8);
  /** Datagrams refused or dropped for want of room (the reader adds them to SEND_ERRORS). */
  sendErrors = 0;

  constructor(private readonly libc: Libc, aead: SlotAead, sockets: SenderSockets) {
    if ('owned' in sockets) {
      const config = sockets.owned;
      this.sessions = new SharedSessionsView(config.sessions, () => receiveMessageOnPort(config.sessionsPort)?.message as SharedSessionsMessage | undefined);
      this.posted = new Int32Array(config.posted);
      this.port = config.port;
      this.sockets = config.sockets;
    } else {
      this.sessions = sockets.sessions;
      this.sockets = sockets.borrowed;
    }
    this.tx = new TxArea(libc);
    this.addresses = new SharedAddresses(libc);
    this.sealer = new TransportSealer(aead, {
      keyChunk: this.sessions.chunkAt,
      sendChunk: this.sessions.sendChunkAt,
      routes: () => this.sessions.routes(),
    }, 0);
  }

  /** The MTU the packets are padded for, from the next one on. */
  set mtu(mtu: number) {
    this.sealer.mtu = mtu;
  }

  /**
   * Seals and sends what it may of the `count` packets in slots [first, first + count) of `data`
   * (no wrap: slot i at i * stride, its packet at PACKET_OFFSET, lengths[i] bytes) and writes
   * their records. Returns whether every one was sent here (the main thread then has only books).
   */
  handle(data: Uint8Array, stride: number, lengths: Int32Array, records: Int32Array, first: number, count: number): boolean {
    this.takeChanges();
    const slots = data.subarray(first * stride, (first + count) * stride);
    const recordsOf = records.subarray(first * RECORD_INTS, (first + count) * RECORD_INTS);
    const sockets = this.sockets;
    if (sockets === undefined) {
      for (let i = 0; i < count; i++) recordsOf[i * RECORD_INTS + R_OUTCOME] = LEFT;
      return false;
    }
    this.sealer.sealSlots(slots, stride, lengths.subarray(first, first + count), count, recordsOf);
    const { runs, runCount } = this.sealer;
    for (let r = 0; r < runCount; r++) {
      const run = runs[r];
      this.sendRun(sockets, slots, stride, recordsOf, run.first, run.count, run.peer, run.target);
    }
    for (let i = 0; i < count; i++) if (recordsOf[i * RECORD_INTS + R_OUTCOME] === LEFT) return false;
    return true;
  }

  /** Closes the socket duplicates it owns (the reader's last act). */
  close(): void {
    if (this.port !== undefined) this.closeSockets();
  }

  private sendRun(sockets: ThreadSockets, slots: Uint8Array, stride: number, records: Int32Array, first: number, count: number, peer: number, target: SendTarget): void {
    const fd = target.family === 4 ? sockets.fd4 : sockets.fd6;
    if (fd < 0) {
      this.sendErrors += count;
      return;
    }
    const lengths = this.runLengths;
    for (let k = 0; k < count; k++) lengths[k] = records[(first + k) * RECORD_INTS + R_LENGTH];
    const { name, source } = this.nameOf(peer, target);
    const data = slots.subarray(first * stride, (first + count) * stride);
    const base = this.addresses.of(data);
    let from = 0;
    let sendingSource = source;
    let deadline = Infinity;
    for (;;) {
      const r = sendInPlace(this.libc, this.tx, fd, data, base, stride, lengths, from, count, name, sendingSource, sockets.gso, this.progress);
      this.sendErrors += r.refused;
      if (r.stop === STOPPED_SOURCE) {
        // The sticky source is gone: the rest leaves from an address the kernel picks, and the
        // main thread learns it from the records (it clears the endpoint's source).
        for (let k = r.next; k < count; k++) records[(first + k) * RECORD_INTS + R_OUTCOME] = SOURCE_REFUSED;
        sendingSource = undefined;
      } else if (r.stop === STOPPED_GSO) {
        sockets.gso = false;
      } else if (r.stop === STOPPED_FULL) {
        const now = performance.now();
        if (deadline === Infinity) deadline = now + FULL_WAIT_MS;
        if (now >= deadline || !this.waitForRoom(fd, deadline - now)) {
          for (let k = r.next; k < count; k++) records[(first + k) * RECORD_INTS + R_OUTCOME] = NO_ROOM;
          this.sendErrors += count - r.next;
          return;
        }
      } else {
        return;
      }
      from = r.next;
    }
  }

  /** Waits (poll) until `fd` can take a datagram, at most `ms`; false when it still cannot. */
  private waitForRoom(fd: number, ms: number): boolean {
    const p32 = new Int32Array(this.pollBytes.buffer);
    const p16 = new Int16Array(this.pollBytes.buffer);
    for (;;) {
      p32[0] = fd;
      p16[2] = POLLOUT;
      p16[3] = 0;
      const n = this.libc.poll(this.pollBytes, 1, Math.max(1, Math.ceil(ms)));
      if (n > 0) return (p16[3] & POLLOUT) !== 0;
      if (n === 0) return false;
      if (this.libc.errno() !== EINTR) return false;
    }
  }

  private nameOf(peer: number, target: SendTarget): { name: Uint8Array; source: Uint8Array | undefined } {
    const known = this.names.get(peer);
    if (known !== undefined && known.seq === target.seq) return known;
    const v4 = target.family === 4;
    const made = {
      seq: target.seq,
      name: encodeSockaddr(target.address.slice(0, v4 ? 4 : 16), target.port),
      source: target.sourceFamily === 0 ? undefined : encodeSourceControl(target.sourceAddress.slice(0, target.sourceFamily === 4 ? 4 : 16)),
    };
    this.names.set(peer, made);
    return made;
  }

  /** Applies what the main thread posted since the last look (one load when nothing was). */
  takeChanges(): void {
    const { posted, port } = this;
    if (posted === undefined || port === undefined) return;
    const count = Atomics.load(posted, 0);
    if (count === this.postedSeen) return;
    this.postedSeen = count;
    for (let m = receiveMessageOnPort(port); m !== undefined; m = receiveMessageOnPort(port)) {
      const message = m.message as SenderMessage;
      this.closeSockets();
      this.sockets = message.sockets;
    }
  }

  private closeSockets(): void {
    const s = this.sockets;
    if (s === undefined) return;
    this.libc.close(s.fd4);
    if (s.fd6 >= 0) this.libc.close(s.fd6);
    this.sockets = undefined;
  }
}
