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
 * How a wake-up's packets go into the ring, with a vnet header (split super-packets) or without,
 * and with `sending` (docs/data-workers.md step 3: sealed and sent here, only books left for the
 * main thread) is queue-drain.ts. While this thread sleeps in poll, the UDP reader may read the
 * queue itself right after writing to it (reply-reader.ts); queue-token.ts keeps the two from
 * reading at once, and this thread holds the queue whenever it is awake.
 *
 * When the interface is deleted the kernel detaches the fd: poll reports POLLERR and read fails
 * with EBADFD. The worker then sets DEVICE_GONE, answers STOPPED and ends.
 *
 * Runs under Node (started through a small tsx trampoline, see linux-tun.ts) and Bun alike; libc
 * is bound again in this thread (koffi or bun:ffi).
 */
import { workerData } from 'node:worker_threads';
import { EBADFD, EINTR, POLLERR, POLLHUP, POLLIN, POLLNVAL, loadLibc, type Libc } from '../sys/libc.ts';
import { SENDER_FAILED, ringViews } from './ring.ts';
import { beginRunning, finishWorker } from '../ring/shared-ring.ts';
import { DRAINED, DRAIN_STOPPED, QueueDrain } from './queue-drain.ts';
import { leaveQueue, takeQueue } from './queue-token.ts';
import { selectAead, type SelectOptions } from '../crypto/select.ts';
import { ReaderSender, type ReaderSendingConfig } from './reader-sender.ts';
import { SentBooks } from './sent-books.ts';

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

export function runReader(libc: Libc, config: ReaderConfig, sender?: ReaderSender): void {
  try {
    readLoop(libc, config, sender);
  } finally {
    sender?.close();
  }
}

function readLoop(libc: Libc, config: ReaderConfig, sender: ReaderSender | undefined): void {
  const { fd, wakeFd, slots, slotSize } = config;
  const ring = ringViews(config.buffer, config);
  const header = ring.header;
  if (!beginRunning(header)) return; // closed before we began

  // struct pollfd[2] = { {fd, POLLIN, 0}, {wakeFd, POLLIN, 0} }
  const pollBytes = new Uint8Array(16);
  const poll32 = new Int32Array(pollBytes.buffer);
  const poll16 = new Int16Array(pollBytes.buffer);
  poll32[0] = fd;
  poll16[2] = POLLIN;
  poll32[2] = wakeFd;
  poll16[6] = POLLIN;
  const wakeBytes = new Uint8Array(8);

  const books = config.books !== undefined ? new SentBooks(config.books) : undefined;
  const drain = new QueueDrain({ libc, fd, ring, slots, slotSize, sender, books, vnetHeader: config.vnetHeader });

  /** The reader's last act; a non-zero errno says the device is gone (DEVICE_GONE). */
  const finish = (goneErrno: number) => finishWorker(header, goneErrno);

  // This thread holds the queue (queue-token.ts) whenever it is not in poll.
  // After each take, the ring is picked up where the helper may have left it (resume).
  takeQueue(header);
  drain.resume();
  for (;;) {
    // Ends on a stop request; with the ring full, first waits until the main thread has consumed
    // something. The kernel queues (and, past txqueuelen, drops) meanwhile.
    if (!drain.awaitRoom()) return finish(0);

    poll16[3] = 0;
    poll16[7] = 0;
    leaveQueue(header);
    const polled = libc.poll(pollBytes, 2, -1);
    const pollErrno = polled < 0 ? libc.errno() : 0;
    takeQueue(header);
    drain.resume();
    if (polled < 0) {
      if (pollErrno === EINTR) continue;
      return finish(pollErrno);
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

    const drained = drain.drain(Infinity);
    if (drained === DRAIN_STOPPED) return finish(0);
    if (drained !== DRAINED) return finish(drained);
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
    return new ReaderSender(libc, await selectAead(sending.selection), { owned: sending });
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
