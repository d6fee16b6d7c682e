/**
 * The UDP reader of FfiUdpBind: a worker thread that waits on the bind's (non-blocking) sockets
 * with poll(2) and drains each ready one with recvmmsg(2) straight into consecutive slots of the
 * shared ring (udp-ring.ts): datagram bytes, source address and length, up to a whole run of free
 * slots per system call. It wakes the main thread through the ring's doorbell (ring/shared-ring.ts:
 * a notify only when the main thread said it waits), so under load one wake-up carries many
 * datagrams and the receive system calls run beside the main thread's packet processing.
 *
 * The sockets ask for IP_PKTINFO / IPV6_RECVPKTINFO: each datagram comes with the local address
 * it arrived on, which the reader copies into the slot's `locals` words; the main thread keeps it
 * in the source Endpoint, so replies leave from that address (sticky sources, endpoint.ts).
 *
 * The sockets have SO_RXQ_OVFL set: a datagram comes with the socket's count of datagrams the
 * kernel dropped so far because its receive queue was full (when that count is not zero). The
 * reader publishes the latest count per socket (KERNEL_DROPS), so the main thread can count those
 * drops too, though it never saw the datagrams.
 *
 * Asked to (`opening`), the reader opens transport messages of known sessions in place before it
 * publishes their slot (session/transport-opener.ts, docs/data-workers.md step 2a): it loads the
 * AEAD provider as a crypto worker does, finds keys through the shared keypair table and index
 * map, and learns of new table chunks and a moved map from its MessagePort (read only when it
 * meets one it lacks: it never returns to its event loop). Each slot then carries one outcome
 * record per datagram, which the main thread acts on.
 *
 * Stopping follows the TUN reader (tun/reader-worker.ts): poll also watches an eventfd the main
 * thread writes to; the main thread sets STATE to STOP_REQUESTED, and the worker answers STOPPED
 * and touches the sockets no more, after which the main thread closes them.
 *
 * Runs under Node (started through a tsx trampoline, see ffi-udp-bind.ts) and Bun alike; libc is
 * bound again in this thread (koffi or bun:ffi).
 */
import { receiveMessageOnPort, workerData, type MessagePort } from 'node:worker_threads';
import {
  CMSGHDR_SIZE, EAGAIN, EBADF, EINTR, IPPROTO_IP, IPPROTO_IPV6, IPV6_PKTINFO, IP_PKTINFO, MSG_DONTWAIT, MSG_TRUNC, MMSGHDR_SIZE, IOVEC_SIZE,
  POLLIN, POLLNVAL, SOCKADDR_IN6_SIZE, SOL_SOCKET, SOL_UDP, SO_RXQ_OVFL, UDP_GRO, loadLibc, type Libc } from '../sys/libc.ts';
import {
  CONTROL_SIZE, KERNEL_DROPS, LOCAL_FAMILY, LOCAL_IFINDEX, LOCAL_WORDS, NAME_SIZE, OPENER_FAILED, READ_ERRORS, SLOT_RECORD_INTS, TRUNCATED,
  TUN_WRITE_ERRORS, TUN_WRITTEN,
  udpRingViews } from './udp-ring.ts';
import { selectAead, type SelectOptions } from '../crypto/select.ts';
import { TransportOpener } from '../session/transport-opener.ts';
import { TunPacketWriter } from '../tun/tun-writer.ts';
import { ReplyReader } from '../tun/reply-reader.ts';
import { ReaderSender } from '../tun/reader-sender.ts';
import type { TunThreadWriter } from '../tun/tun.ts';
import { SharedSessionsView, type SharedSessionsInit, type SharedSessionsMessage } from '../session/shared-sessions.ts';
import {
  CHUNK_ENTRIES as SEND_CHUNK_ENTRIES, CHUNK_SHIFT as SEND_CHUNK_SHIFT, fromTarget, newSendTarget, readSendTarget,
} from '../session/send-table.ts';
import {
  LAST_ERRNO, READ_SEQ, WRITE_SEQ, awaitRoom, beginRunning, finishWorker, publish, publishQuietly, seqAdd, seqDistance } from '../ring/shared-ring.ts';

export interface UdpReaderConfig {
  /** The bind's sockets (IPv4 first, then IPv6 when there is one), non-blocking. */
  fds: number[];
  /** eventfd the main thread writes to in order to interrupt poll. */
  wakeFd: number;
  buffer: SharedArrayBuffer;
  slots: number;
  slotSize: number;
  /** Open transport messages in place (absent: hand every datagram over as it came). */
  opening?: {
    /** How to pick the AEAD: as the main thread picked its own. */
    selection: Pick<SelectOptions, 'only' | 'libsodium'>;
    sessions: SharedSessionsInit;
    /** Where the main thread posts SharedSessionsMessages. */
    port: MessagePort;
    /** The TUN to write what it may deliver itself (absent: every opened packet goes to the main thread). */
    tun?: TunThreadWriter;
    /** Whether UDP GSO is worth trying on the sockets (for the replies sent here: reply-reader.ts). */
    gso: boolean;
  };
}

/**
 * How long nothing may have come before a datagram whose replies this thread reads itself
 * (reply-reader.ts): an idle ping (10 ms apart in the bench) or a request now and then, never a
 * transfer's stream, whose datagrams come microseconds apart.
 */
const QUIET_BEFORE_REPLIES_MS = 1;

/** At most this many datagrams per recvmmsg (the kernel's limit is UIO_MAXIOV = 1024). */
const MAX_VLEN = 256;

/**
 * Points slot i's mmsghdr at its name and iovec, and its iovec at its data slot. The addresses are
 * the shared memory's own: the same in every thread of the process, and a SharedArrayBuffer's
 * backing store never moves (see ffi-udp-bind.ts). Little-endian (x86-64, AArch64).
 */
function buildMessageHeaders(libc: Libc, config: UdpReaderConfig, offsets: ReturnType<typeof udpRingViews>['offsets']): void {
  const { buffer, slots, slotSize } = config;
  const base = libc.address(new Uint8Array(buffer, 0, 1));
  const view = new DataView(buffer);
  for (let i = 0; i < slots; i++) {
    const msg = offsets.msgs + i * MMSGHDR_SIZE;
    const iov = offsets.iovecs + i * IOVEC_SIZE;
    view.setBigUint64(msg, BigInt(base + offsets.names + i * NAME_SIZE), true); // msg_name
    view.setUint32(msg + 8, SOCKADDR_IN6_SIZE, true); // msg_namelen (room for either family)
    view.setBigUint64(msg + 16, BigInt(base + iov), true); // msg_iov
    view.setBigUint64(msg + 24, 1n, true); // msg_iovlen
    view.setBigUint64(msg + 32, BigInt(base + offsets.controls + i * CONTROL_SIZE), true); // msg_control
    view.setBigUint64(msg + 40, BigInt(CONTROL_SIZE), true); // msg_controllen
    view.setUint32(msg + 48, 0, true); // msg_flags
    view.setUint32(msg + 56, 0, true); // msg_len
    view.setBigUint64(iov, BigInt(base + offsets.data + i * slotSize), true); // iov_base
    view.setBigUint64(iov + 8, BigInt(slotSize), true); // iov_len
  }
}

/** The reader's opener, and the shared tables it reads (for the send table: see `moved` below). */
export interface ReaderOpening {
  opener: TransportOpener;
  sessions: SharedSessionsView;
  /** With a TUN whose queues' threads send: the replies to what it wrote, read here while those threads sleep. */
  replies?: { reader: ReplyReader; touched: Uint8Array };
}

export function runUdpReader(libc: Libc, config: UdpReaderConfig, opening?: ReaderOpening): void {
  const opener = opening?.opener;
  const replies = opening?.replies;
  const { fds, wakeFd, buffer, slots, slotSize } = config;
  const { header, lengths, segments, locals, opened, records, offsets } = udpRingViews(buffer, config);
  const bytes = new Uint8Array(buffer);
  const localBytes = new Uint8Array(buffer, offsets.locals, slots * LOCAL_WORDS * 4);
  // The control buffers as 32-bit words: per slot, cmsg_len at +0, cmsg_level at +2, cmsg_type at +3, the value at +4.
  const control32 = new Int32Array(buffer, offsets.controls, (slots * CONTROL_SIZE) / 4);
  const CONTROL_WORDS = CONTROL_SIZE / 4;
  if (!beginRunning(header)) return; // closed before we began
  buildMessageHeaders(libc, config, offsets);

  const mask = slots - 1;
  // Per slot: a view of the mmsghdr array from that slot on (recvmmsg's msgvec argument).
  const vectors: Uint8Array[] = [];
  for (let i = 0; i < slots; i++) vectors.push(new Uint8Array(buffer, offsets.msgs + i * MMSGHDR_SIZE, (slots - i) * MMSGHDR_SIZE));
  // 32-bit words of the mmsghdrs: per slot, msg_namelen at +2, msg_flags at +12, msg_len at +14.
  const msg32 = new Uint32Array(buffer, offsets.msgs, (slots * MMSGHDR_SIZE) / 4);
  const MSG_WORDS = MMSGHDR_SIZE / 4;

  // struct pollfd[] = the sockets, then the eventfd; 8 bytes each (int fd, short events, short revents).
  const count = fds.length + 1;
  const pollBytes = new Uint8Array(8 * count);
  const poll32 = new Int32Array(pollBytes.buffer);
  const poll16 = new Int16Array(pollBytes.buffer);
  for (let i = 0; i < count; i++) {
    poll32[2 * i] = i < fds.length ? fds[i] : wakeFd;
    poll16[4 * i + 2] = POLLIN;
  }
  const wakeIndex = fds.length;

  let write = Atomics.load(header, WRITE_SEQ);
  // Whether a datagram published since the last doorbell needs the main thread: anything but a
  // packet this thread delivered itself. For those only the books are left (timers, counters,
  // the endpoint), and waking the main thread for each cost an idle ping's round trip a wake-up
  // at each end, right when the reply was about to need that thread. Their records wait for a
  // doorbell rung for something else, for the main thread's next send (Bind.takeReceived), for
  // a quarter of the ring, or at most for its wait's backstop (READER_WAIT_BACKSTOP_MS).
  let urgent = false;
  const booksBacklog = Math.max(1, slots >>> 2);
  /** When datagrams last came (performance.now()): replies are read here only after a quiet spell. */
  let lastReceived = -Infinity;
  /**
   * Whether the message in `slot`, delivered here whole, came from somewhere other than where
   * its peer's packets are sent (the send table, which a TUN reader that sends reads): the peer
   * roamed. Its books then must not wait: the main thread moves the endpoint, and until it does
   * replies go to the old address.
   */
  const target = newSendTarget();
  const moved = (slot: number): boolean => {
    const peer = opener!.deliveredPeer;
    const words = opening!.sessions.sendChunkAt(peer >> SEND_CHUNK_SHIFT);
    if (words === undefined || !readSendTarget(words, peer & (SEND_CHUNK_ENTRIES - 1), target)) return false;
    const local = slot * LOCAL_WORDS;
    return !fromTarget(target, bytes, offsets.names + slot * NAME_SIZE, locals[local + LOCAL_FAMILY], localBytes, local * 4);
  };

  /** The reader's last act; a non-zero errno raises READER_FAILED. */
  const finish = (errno: number) => finishWorker(header, errno);

  /** Receives from socket `which` (index into fds) until it has nothing more or the ring is full; returns a fatal errno or 0. */
  const drain = (which: number): number => {
    const fd = fds[which];
    let consumed = Atomics.load(header, READ_SEQ);
    for (;;) {
      let free = slots - seqDistance(write, consumed);
      if (free <= 0) {
        consumed = Atomics.load(header, READ_SEQ);
        free = slots - seqDistance(write, consumed);
        if (free <= 0) return 0; // ring full: the kernel queues meanwhile
      }
      const first = write & mask;
      const vlen = Math.min(free, slots - first, MAX_VLEN);
      const n = libc.recvmmsg(fd, vectors[first], vlen, MSG_DONTWAIT);
      if (n > 0) {
        const now = performance.now();
        const afterQuiet = now - lastReceived >= QUIET_BEFORE_REPLIES_MS;
        lastReceived = now;
        for (let k = 0; k < n; k++) {
          const slot = (first + k) & mask;
          const words = slot * MSG_WORDS;
          if ((msg32[words + 12] & MSG_TRUNC) !== 0) {
            lengths[slot] = -1;
            Atomics.add(header, TRUNCATED, 1);
          } else {
            lengths[slot] = msg32[words + 14];
          }
          // Control messages: a coalesced datagram (UDP GRO) comes with its segment size, after
          // the first kernel drop every datagram with the socket's drop count (SO_RXQ_OVFL), and
          // each with the local address it arrived on (IP_PKTINFO / IPV6_PKTINFO).
          const c = slot * CONTROL_WORDS;
          const controlLength = Math.min(msg32[words + 10], CONTROL_SIZE);
          const local = slot * LOCAL_WORDS;
          let segment = 0;
          let localFamily = 0;
          for (let at = 0; at + CMSGHDR_SIZE + 4 <= controlLength;) {
            const w = c + (at >>> 2);
            const length = control32[w]; // cmsg_len (a size_t; the high word is 0)
            if (length < CMSGHDR_SIZE || at + length > controlLength) break;
            const level = control32[w + 2], type = control32[w + 3];
            if (level === SOL_UDP && type === UDP_GRO) segment = control32[w + 4];
            else if (level === SOL_SOCKET && type === SO_RXQ_OVFL) Atomics.store(header, KERNEL_DROPS + which, control32[w + 4]);
            else if (level === IPPROTO_IP && type === IP_PKTINFO && length >= CMSGHDR_SIZE + 12) {
              // struct in_pktinfo: int ipi_ifindex, struct in_addr ipi_spec_dst (the local address), ipi_addr.
              locals[local] = control32[w + 5];
              locals[local + 1] = 0;
              locals[local + 2] = 0;
              locals[local + 3] = 0;
              locals[local + LOCAL_IFINDEX] = control32[w + 4];
              localFamily = 4;
            } else if (level === IPPROTO_IPV6 && type === IPV6_PKTINFO && length >= CMSGHDR_SIZE + 20) {
              // struct in6_pktinfo: struct in6_addr ipi6_addr, int ipi6_ifindex.
              locals[local] = control32[w + 4];
              locals[local + 1] = control32[w + 5];
              locals[local + 2] = control32[w + 6];
              locals[local + 3] = control32[w + 7];
              locals[local + LOCAL_IFINDEX] = control32[w + 8];
              localFamily = 6;
            }
            at += (length + 7) & ~7; // CMSG_ALIGN
          }
          segments[slot] = segment;
          locals[local + LOCAL_FAMILY] = localFamily;
          const length = lengths[slot];
          opened[slot] = opener !== undefined && length > 0
            ? opener.openMessage(bytes, offsets.data + slot * slotSize, length, segment, records, slot * SLOT_RECORD_INTS)
            : 0;
          if (opened[slot] === 0 || !opener!.deliveredWhole || moved(slot)) urgent = true;
          msg32[words + 2] = SOCKADDR_IN6_SIZE; // the kernel wrote the actual name length back
          msg32[words + 10] = CONTROL_SIZE; // and the control length
        }
        // What the opener delivered is written before the slots are handed over (it points into them).
        opener?.flush();
        // After a quiet spell: perhaps a request whose reply the kernel queued during its TUN
        // write (reply-reader.ts), read at once: the queue's thread, woken by the same reply, is
        // racing this thread to it. Never in a stream: this thread is then the inbound bottleneck
        // (sealing a TCP receiver's ACKs here cost one stream 4-10 % in three full runs, and
        // sealing one batch's in 64, 13 % of Node's in one: docs/performance.md).
        if (replies !== undefined) {
          if (afterQuiet) replies.reader.readReplies(replies.touched);
          else replies.touched.fill(0);
        }
        write = seqAdd(write, n);
        if (urgent || seqDistance(write, Atomics.load(header, READ_SEQ)) >= booksBacklog) {
          urgent = false;
          publish(header, write);
        } else {
          publishQuietly(header, write);
        }
        if (n < vlen) return 0; // the socket's queue is (momentarily) empty
        continue;
      }
      const errno = libc.errno();
      if (errno === EAGAIN) return 0;
      if (errno === EINTR) continue;
      // A pending socket error (e.g. an ICMP report) is returned once and cleared: count it and go on.
      Atomics.add(header, READ_ERRORS, 1);
      Atomics.store(header, LAST_ERRNO, errno);
      return 0;
    }
  };

  for (;;) {
    // Ends on a stop request; with the ring full, first waits until the main thread has consumed
    // something. The kernel queues meanwhile.
    if (!awaitRoom(header, write, slots)) return finish(0);

    for (let i = 0; i < count; i++) poll16[4 * i + 3] = 0;
    if (libc.poll(pollBytes, count, -1) < 0) {
      const errno = libc.errno();
      if (errno === EINTR) continue;
      return finish(errno);
    }
    if (poll16[4 * wakeIndex + 3] !== 0) continue; // woken by the main thread: re-check STATE
    for (let i = 0; i < fds.length; i++) {
      const revents = poll16[4 * i + 3];
      if (revents === 0) continue;
      if ((revents & POLLNVAL) !== 0) return finish(EBADF); // the socket was closed under us
      drain(i);
    }
  }
}

/** The opener the config asks for; undefined (OPENER_FAILED set) when no AEAD provider loads here. */
async function openerFor(config: UdpReaderConfig, libc: Promise<Libc>): Promise<ReaderOpening | undefined> {
  const opening = config.opening;
  if (opening === undefined) return undefined;
  try {
    const aead = await selectAead(opening.selection);
    const port = opening.port;
    const sessions = new SharedSessionsView(opening.sessions, () => receiveMessageOnPort(port)?.message as SharedSessionsMessage | undefined);
    const tun = opening.tun;
    if (tun === undefined) return { opener: new TransportOpener(aead, sessions.chunkAt, sessions.indices), sessions };
    const writer = new TunPacketWriter(await libc, tun.fds, tun.vnetHeader, tun.offloads);
    const header = new Int32Array(config.buffer);
    // The replies go out on the sockets this thread receives on (IPv4 first).
    const sockets = { fd4: config.fds[0], fd6: config.fds[1] ?? -1, gso: opening.gso };
    const replies = tun.queues !== undefined
      ? { reader: new ReplyReader(await libc, tun.fds, tun.queues, tun.vnetHeader, new ReaderSender(await libc, aead, { borrowed: sockets, sessions })), touched: writer.touched }
      : undefined;
    return { sessions, replies, opener: new TransportOpener(aead, sessions.chunkAt, sessions.indices, {
      routes: () => sessions.routes(),
      write: (packets, count) => {
        const written = writer.write(packets, count);
        Atomics.add(header, TUN_WRITTEN, written);
        if (written < count) Atomics.add(header, TUN_WRITE_ERRORS, count - written);
      },
    }) };
  } catch {
    Atomics.store(new Int32Array(config.buffer), OPENER_FAILED, 1);
    return undefined;
  }
}

const config = workerData as UdpReaderConfig | undefined;
if (config && Array.isArray(config.fds) && config.buffer instanceof SharedArrayBuffer) {
  const libcLoaded = loadLibc();
  const [libc, opening] = await Promise.all([libcLoaded, openerFor(config, libcLoaded)]);
  runUdpReader(libc, config, opening);
}
