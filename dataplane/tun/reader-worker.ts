/**
 * The TUN reader: a worker thread that waits for the (non-blocking) TUN file descriptor with
 * poll(2), reads every packet that is ready straight into the next free slot of the shared ring
 * (ring.ts) and wakes the main thread through the ring's doorbell (ring/shared-ring.ts). The main
 * thread drains all ready slots as one batch, so under load one wake-up carries many packets, and
 * the read syscalls run here, in parallel with the main thread's packet processing.
 *
 * poll also watches an eventfd that the main thread writes to when it wants the worker to stop:
 * closing a descriptor does not wake a thread blocked on it, and the main thread must not close
 * the TUN fd while this thread may still use it (the number could be reused). The stop handshake
 * is STATE in the ring header: the main thread sets STOP_REQUESTED and waits (briefly, with
 * Atomics.wait) until this thread answers STOPPED; after that it is free to close the fds.
 *
 * With a vnet header (IFF_VNET_HDR, see offload.ts) each read lands in a private buffer first
 * (vnet-read.ts): a TCP super-packet is split into segments, one
 * ring slot each (waiting for room in the ring when needed), and a partial checksum the kernel
 * left is completed, so the main thread only ever sees whole MTU-sized packets.
 *
 * With `sending` (docs/data-workers.md step 3) the packets of one round of reads are first offered
 * to the ReaderSender (reader-sender.ts), which seals and sends those it may in place and writes
 * each slot's record; only then are the slots published. A round the sender took whole leaves
 * only books for the main thread: they go to a shared table (sent-books.ts) and the round's slots
 * are used again at once. Where the table is busy or full, the round is published with its
 * records instead, without ringing (publishQuietly) unless a quarter of the ring waits: the main
 * thread takes them at its next wake-up or its wait's backstop, as it takes the table. Packets lie
 * PACKET_OFFSET bytes into their slots (ring.ts), room for the header.
 *
 * When the interface is deleted the kernel detaches the fd: poll reports POLLERR and read fails
 * with EBADFD. The worker then sets DEVICE_GONE, answers STOPPED and ends.
 *
 * Runs under Node (started through a small tsx trampoline, see linux-tun.ts) and Bun alike; libc
 * is bound again in this thread (koffi or bun:ffi).
 */
import { workerData } from 'node:worker_threads';
import { DEVICE_GONE_ERRNOS, EAGAIN, EBADFD, EINTR, POLLERR, POLLHUP, POLLIN, POLLNVAL, loadLibc, type Libc } from '../sys/libc.ts';
import { PACKET_OFFSET, READ_ERRORS, SEAL_ROOM, SENDER_FAILED, SEND_ERRORS, ringViews } from './ring.ts';
import {
  READ_SEQ, WRITE_SEQ, awaitRoom, beginRunning, finishWorker, publish, publishQuietly, ringFull, seqAdd, seqDistance } from '../ring/shared-ring.ts';
import { selectAead, type SelectOptions } from '../crypto/select.ts';
import { ReaderSender, type ReaderSendingConfig } from './reader-sender.ts';
import { SentBooks } from './sent-books.ts';
import { VNET_READ_SIZE, wordsOf } from './offload.ts';
import { VNET_READ_REFUSED, VNET_READ_STOPPED, VnetReader, type SlotSink } from './vnet-read.ts';
import { copierFor } from '../sys/copy-bytes.ts';

export interface ReaderConfig {
  /** The TUN fd, opened with O_NONBLOCK. */
  fd: number;
  /** eventfd the main thread writes to in order to interrupt poll. */
  wakeFd: number;
  buffer: SharedArrayBuffer;
  slots: number;
  slotSize: number;
  /**
   * The fd was opened with IFF_VNET_HDR (offload.ts): every read starts with a virtio_net_hdr;
   * TCP super-packets are split into segments, one per slot, and partial checksums completed.
   */
  vnetHeader?: boolean;
  /** Seal and send what it may itself (reader-sender.ts), with the AEAD `selection` picks. */
  sending?: ReaderSendingConfig & { selection: Pick<SelectOptions, 'only' | 'libsodium'> };
  /** With `sending`: where the books of rounds sent whole go (sent-books.ts; SENT_BOOKS_BYTES). */
  books?: SharedArrayBuffer;
}

/** Packets read before the round is offered to the sender and published: a bound on the first one's wait. */
const ROUND_PACKETS = 64;

export function runReader(libc: Libc, config: ReaderConfig, sender?: ReaderSender): void {
  try {
    readLoop(libc, config, sender);
  } finally {
    sender?.close();
  }
}

function readLoop(libc: Libc, config: ReaderConfig, sender: ReaderSender | undefined): void {
  const { fd, wakeFd, slots, slotSize } = config;
  const { header, lengths, records, data } = ringViews(config.buffer, config);
  if (!beginRunning(header)) return; // closed before we began

  const mask = slots - 1;
  // Each packet lands PACKET_OFFSET into its slot and leaves SEAL_ROOM after it (ring.ts).
  const room = slotSize - PACKET_OFFSET - SEAL_ROOM;
  const slotViews: Uint8Array[] = [];
  for (let i = 0; i < slots; i++) slotViews.push(data.subarray(i * slotSize + PACKET_OFFSET, i * slotSize + PACKET_OFFSET + room));

  // struct pollfd[2] = { {fd, POLLIN, 0}, {wakeFd, POLLIN, 0} }
  const pollBytes = new Uint8Array(16);
  const poll32 = new Int32Array(pollBytes.buffer);
  const poll16 = new Int16Array(pollBytes.buffer);
  poll32[0] = fd;
  poll16[2] = POLLIN;
  poll32[2] = wakeFd;
  poll16[6] = POLLIN;

  const books = config.books !== undefined ? new SentBooks(config.books) : undefined;
  const wakeBytes = new Uint8Array(8);
  let write = Atomics.load(header, WRITE_SEQ);
  /** The first slot of the round not yet published. */
  let roundStart = write;

  /** Offers the round's slots to the sender (in at most two pieces: the ring wraps), then publishes them. */
  const finishRound = (): void => {
    const count = seqDistance(write, roundStart);
    if (count <= 0) return;
    // Whether the sender took every packet of the round (without a sender every record stays
    // LEFT, zero, as the ring was made, and the main thread is rung for them).
    let handled = false;
    if (sender !== undefined) {
      const first = roundStart & mask;
      const head = Math.min(count, slots - first);
      handled = sender.handle(data, slotSize, lengths, records, first, head);
      if (head < count) handled = sender.handle(data, slotSize, lengths, records, 0, count - head) && handled;
      if (sender.sendErrors > 0) {
        Atomics.add(header, SEND_ERRORS, sender.sendErrors);
        sender.sendErrors = 0;
      }
    }
    // Sent whole: the books go to the shared table and the slots are used again at once.
    if (handled && books !== undefined && books.tryAdd(records, roundStart & mask, count, mask)) {
      write = roundStart;
      return;
    }
    roundStart = write;
    // Only books for the main thread: they wait for its next look, unless a quarter of the ring does.
    if (handled && seqDistance(write, Atomics.load(header, READ_SEQ)) < slots / 4) publishQuietly(header, write);
    else publish(header, write);
  };

  /** The reader's last act; a non-zero errno says the device is gone (DEVICE_GONE). */
  const finish = (goneErrno: number) => finishWorker(header, goneErrno);

  // With a vnet header: reads land in a private buffer and are copied or split into ring slots
  // (vnet-read.ts).
  const vnet = config.vnetHeader === true ? new VnetReader(room, wordsOf(config.buffer), copierFor(libc)) : undefined;

  /** Waits until a slot is free (finishing the round first); false when a stop was requested meanwhile. */
  const waitForRoom = (): boolean => {
    finishRound();
    publish(header, write); // ring: the main thread must free slots
    return awaitRoom(header, write, slots);
  };

  // The slots of one read: the first is known to be free; a super-packet's later segments wait
  // for room when the ring fills (`waited` then tells the read loop to look at READ_SEQ again).
  let waited = false;
  const sink: SlotSink = {
    slot: () => {
      if (ringFull(write, Atomics.load(header, READ_SEQ), slots)) {
        if (!waitForRoom()) return undefined;
        waited = true;
      }
      return slotViews[write & mask];
    },
    filled: (length) => {
      lengths[write & mask] = length;
      write = seqAdd(write, 1);
    },
  };

  for (;;) {
    // Ends on a stop request; with the ring full, first waits until the main thread has consumed
    // something. The kernel queues (and, past txqueuelen, drops) meanwhile.
    if (!awaitRoom(header, write, slots)) return finish(0);
    const read = Atomics.load(header, READ_SEQ);

    poll16[3] = 0;
    poll16[7] = 0;
    if (libc.poll(pollBytes, 2, -1) < 0) {
      const errno = libc.errno();
      if (errno === EINTR) continue;
      return finish(errno);
    }
    if (poll16[7] !== 0) {
      // Woken by the main thread: to stop (STATE, checked above) or to take a change (new
      // sockets: the old ones must not stay open here). The eventfd's count is reset first.
      libc.read(wakeFd, wakeBytes, 8);
      sender?.takeChanges();
      continue;
    }
    const revents = poll16[3];
    if ((revents & POLLIN) === 0 && (revents & (POLLERR | POLLHUP | POLLNVAL)) === 0) continue;

    // Read until the kernel queue is empty or the ring is full. What the first read brought is
    // sent at once, before the read that finds the queue empty: an idle ping's packet should not
    // wait for a system call that only says there is nothing more (under load the rest of the
    // queue still goes in rounds of up to ROUND_PACKETS).
    let consumed = read;
    let firstRead = true;
    for (;;) {
      if (ringFull(write, consumed, slots)) {
        consumed = Atomics.load(header, READ_SEQ);
        if (ringFull(write, consumed, slots)) break;
      }
      if (seqDistance(write, roundStart) >= ROUND_PACKETS) finishRound();
      const n = vnet ? libc.read(fd, vnet.target, VNET_READ_SIZE) : libc.read(fd, slotViews[write & mask], room);
      if (n > 0) {
        if (!vnet) {
          lengths[write & mask] = n;
          write = seqAdd(write, 1);
        } else {
          waited = false;
          const placed = vnet.ingest(n, sink);
          if (placed === VNET_READ_STOPPED) return finish(0); // stop requested while waiting for room
          if (placed === VNET_READ_REFUSED) Atomics.add(header, READ_ERRORS, 1);
          if (waited) consumed = Atomics.load(header, READ_SEQ);
        }
        if (firstRead) {
          firstRead = false;
          finishRound();
        }
        continue;
      }
      if (n === 0) break;
      const errno = libc.errno();
      if (errno === EAGAIN) break;
      if (errno === EINTR) continue;
      if (DEVICE_GONE_ERRNOS.has(errno)) {
        finishRound();
        return finish(errno);
      }
      Atomics.add(header, READ_ERRORS, 1);
      break;
    }
    finishRound();
    if ((revents & (POLLERR | POLLHUP | POLLNVAL)) !== 0 && (revents & POLLIN) === 0) {
      // The device is gone (tun_chr_poll reports POLLERR for a detached fd) but read did not say so.
      return finish(EBADFD);
    }
  }
}

/** The sender, or undefined without `sending` or when no AEAD provider loads here (SENDER_FAILED: the main thread seals). */
async function startSender(libc: Libc, config: ReaderConfig): Promise<ReaderSender | undefined> {
  const sending = config.sending;
  if (sending === undefined) return undefined;
  try {
    return new ReaderSender(libc, await selectAead(sending.selection), sending);
  } catch {
    Atomics.store(new Int32Array(config.buffer), SENDER_FAILED, 1);
    return undefined;
  }
}

const config = workerData as ReaderConfig | undefined;
if (config && typeof config.fd === 'number' && config.buffer instanceof SharedArrayBuffer) {
  const libc = await loadLibc();
  runReader(libc, config, await startSender(libc, config));
}
