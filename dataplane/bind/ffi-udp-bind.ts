/**
 * A Bind that owns its UDP sockets through FFI (libc.ts: koffi on Node, bun:ffi on Bun) and
 * batches system calls, because node:dgram costs about 11 µs of main-thread time per datagram in
 * each direction (one libuv request and one JS callback per datagram).
 *
 * Sockets. As wireguard-go: an AF_INET socket and an AF_INET6 socket with IPV6_V6ONLY
 * on the same port; port 0 binds the v4 socket to any port, reads it back with getsockname and
 * binds v6 to it (another pick, up to 100 times, when that port is taken for v6). Both are
 * non-blocking and close-on-exec, with 7 MiB socket buffers (SO_RCVBUFFORCE/SO_SNDBUFFORCE first,
 * which pass net.core.rmem_max/wmem_max with CAP_NET_ADMIN, else the plain options, which the
 * kernel caps). A host without IPv6 gets the v4 socket only.
 *
 * Sending (main thread). `send` is one sendto(2), except while received datagrams are being
 * handed to the handler: then datagrams of up to 256 bytes (the answers to them: cookie replies,
 * handshake responses) are copied into a DeferredArea and leave together in one sendmmsg(2), each
 * with its own destination, when the delivery ends (or earlier, in order, when a larger datagram or
 * a batch is sent, or the other family). `sendBatch` (see Bind) hands a whole packet
 * batch to one sendmmsg(2): the mmsghdr and iovec arrays live in this bind's own long-lived
 * shared memory, the iovecs point straight into the caller's SharedArrayBuffer (no copy), and the
 * destination's sockaddr bytes are built once per Endpoint (a WeakMap) and copied into place (one
 * name for the whole batch). All sends use MSG_DONTWAIT. When the kernel's send buffer is full
 * (EAGAIN, after a partial sendmmsg or at once), the rest is copied into a per-socket queue that
 * is retried from the event loop (setImmediate, then every millisecond while the kernel still says
 * EAGAIN); while a socket's queue is not empty, new datagrams for that socket join its end, so the
 * order of datagrams is kept. The queue holds at most 4096 datagrams; what does not fit is
 * dropped and counted in `stats.sendErrors`, as are datagrams the kernel rejects (EMSGSIZE,
 * EHOSTUNREACH, EPERM from a firewall, ...), which are skipped one by one so the rest still leaves.
 *
 * UDP offloads (default on; `offload: false` turns them off). sendBatch
 * sends each run of equal-sized datagrams (the last may be shorter; at most 64 datagrams and
 * 65000 bytes) as one message with a UDP_SEGMENT control message: the kernel takes the run
 * through its stack once and splits it as late as possible (a veth passes it whole). A kernel or
 * path that refuses (EINVAL, EIO, EMSGSIZE, ...) turns GSO off for this bind and the rest is sent
 * one datagram per message. The sockets have UDP_GRO set, so the reader may receive such a run as
 * one coalesced datagram with its segment size in a control message; the main thread cuts it up
 * again before the handler sees it, so the handler always gets single datagrams.
 *
 * Sticky sources. The sockets ask for IP_PKTINFO / IPV6_RECVPKTINFO, so each received datagram's
 * source Endpoint also carries the local address it arrived on (endpoint.ts, LocalSource; the
 * cache below keeps one Endpoint per source and local address). Whatever is sent to such an
 * Endpoint carries an IP_PKTINFO / IPV6_PKTINFO control message with that address (after
 * UDP_SEGMENT in a GSO message; in each collected answer; a single datagram goes through a
 * one-entry sendmmsg, since sendto takes no control message), so replies leave from the address
 * the peer talks to, not from the one the kernel would pick, and the peer never sees us roam
 * between our addresses. When the kernel refuses the source (SOURCE_GONE: the address was
 * removed), the bind clears it from the Endpoint and sends again without it; the next datagram
 * from the peer brings a current one.
 *
 * Receiving (worker thread). A reader thread (udp-reader-worker.ts) polls both sockets and fills
 * a SharedArrayBuffer ring (udp-ring.ts) with recvmmsg(2), datagram bytes, source sockaddr and
 * length in place; it wakes the main thread (Atomics.waitAsync) once per batch, as the TUN reader
 * does. The main thread calls the handler for each datagram in arrival order with a view into the
 * ring (valid during the call) and the source Endpoint, found in a cache keyed by the sockaddr's
 * address and port (so the text form is parsed once per source, not per datagram). open() does
 * not wait for the reader to start (the kernel holds what arrives meanwhile; `ready()` waits).
 * close() stops the reader through an eventfd and the STATE handshake, delivers what the reader had
 * already received, and closes the sockets only after the reader has stopped using them (a closed
 * fd number could be reused at once). At most PUMP_DATAGRAMS datagrams are delivered per turn of
 * the event loop. Datagrams the kernel dropped from a full receive queue are counted too
 * (SO_RXQ_OVFL, reported with the next datagram received): `stats.kernelDrops`, and as they are
 * learnt, `onKernelDrops`.
 *
 * Raw pointers. The iovecs and msghdrs hold raw addresses (libc.address: koffi.address() on
 * Node, ptr() from bun:ffi on Bun), taken of SharedArrayBuffer memory only, because its backing
 * store never moves: V8 allocates it outside the JavaScript heap (small ordinary ArrayBuffers can
 * live on the heap and move; shared ones never do) and frees it only when the last
 * SharedArrayBuffer object referring to it, in any thread, is collected; JavaScriptCore keeps it in
 * a separately allocated, reference-counted block. Addresses are therefore cached per
 * SharedArrayBuffer, and are the same in every thread of the process (the unit tests check that
 * an address survives forced garbage collections). The caller keeps its buffer alive during a
 * sendBatch call, which is all the kernel needs: sendmmsg has read the data when it returns.
 * Batches whose memory is not shared fall back to one sendto per datagram (still no copy: the FFI
 * passes the view itself).
 *
 * Same code on Node and Bun. Layouts (mmsghdr 64 bytes, iovec 16, little-endian) are those of
 * 64-bit Linux on x86-64 and AArch64.
 */
import { MessageChannel, type MessagePort, type Worker } from 'node:worker_threads';
import { Endpoint, LocalSource } from '../net/endpoint.ts';
import { formatIp } from '../net/ip.ts';
import {
  AF_INET, AF_INET6, EADDRINUSE, EADDRNOTAVAIL, EAFNOSUPPORT, EAGAIN, EBADF, EFD_CLOEXEC, EFD_NONBLOCK, EINTR, EINVAL, EIO,
  EMSGSIZE, IOVEC_SIZE, IPPROTO_IP, IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PKTINFO, IPV6_PMTUDISC_PROBE, IPV6_RECVPKTINFO, IPV6_V6ONLY, IP_MTU_DISCOVER, IP_PKTINFO, IP_PMTUDISC_PROBE,
  MMSGHDR_SIZE, MSG_DONTWAIT, SOCKADDR_IN6_SIZE,
  SOCKADDR_IN_SIZE, SOCK_CLOEXEC, SOCK_DGRAM, SOCK_NONBLOCK, SOL_SOCKET, SOL_UDP, SO_MARK, SO_RCVBUF, SO_RCVBUFFORCE, SO_SNDBUF,
  SO_RXQ_OVFL, SO_SNDBUFFORCE, UDP_GRO, UDP_SEGMENT, errnoError, loadLibc, signalEventFd, type Libc,
} from '../sys/libc.ts';
import { SharedAddresses } from '../sys/shared-addresses.ts';
import { startWorker, wakeAtExit } from '../sys/threads.ts';
import type { Bind, BindStats, DeliveryBracket, ReceiveHandler, ThreadSockets, ThreadSocketsFeed, TransportOpening } from './bind.ts';
import { NOT_OPENED, readRecord, type OpenedTransport } from '../session/transport-opener.ts';
import { shareSessions } from '../session/shared-sessions.ts';
import { StallWatch, lookEveryInterval, type Liveness, type StallHandler } from '../watchdog.ts';
import type { UdpReaderConfig } from './udp-reader-worker.ts';
import {
  KERNEL_DROPS, LOCAL_FAMILY, LOCAL_IFINDEX, LOCAL_WORDS, NAME_SIZE, OPENER_FAILED, READER_FAILED, READ_ERRORS, SLOT_RECORD_INTS, TRUNCATED,
  TUN_WRITE_ERRORS, TUN_WRITTEN,
  UDP_RING_SLOTS, UDP_SLOT_SIZE,
  udpRingOffsets, udpRingViews, type UdpRingViews,
} from './udp-ring.ts';
import {
  CONSUMER_WAITING, LAST_ERRNO, READ_SEQ, STATE, STATE_BOOTING, STATE_RUNNING, STATE_STOPPED, STATE_STOP_REQUESTED, WRITE_SEQ, awaitStopped,
  release, requestStop, seqAdd, seqDistance,
} from '../ring/shared-ring.ts';
import { WaitBackstop, awaitBooted, awaitChange, settleWaits } from '../ring/ring-wait.ts';
import {
  PKTINFO6_SPACE, SOURCE_GONE, STOPPED_FULL, STOPPED_GSO, STOPPED_SOURCE, TxArea, encodeSockaddr,
  encodeSourceControl, newSendProgress, sendInPlace,
} from './udp-send.ts';

/** Socket buffers large enough to absorb bursts between event-loop turns (wireguard-go uses 7 MiB). */
const SOCKET_BUFFER_BYTES = 7 * 1024 * 1024;
/** Port 0: the v4 socket picks a port; if v6 cannot take the same one, try again this often. */
const PORT_PICK_ATTEMPTS = 100;
/** Received endpoints are built once per source and reused; the cache is dropped when it grows past this. */
const ENDPOINT_CACHE_LIMIT = 4096;
/** Datagrams waiting per socket while the kernel's send buffer is full; more are dropped. */
const SEND_QUEUE_LIMIT = 4096;
/**
 * Datagrams handed to the handler per turn of the event loop (a coalesced slot is finished first).
 * Without a bound, one wake-up after a stall could turn thousands of coalesced datagrams into
 * hundreds of crypto batches at once: memory, and a standing queue in front of the workers.
 */
const PUMP_DATAGRAMS = 1024;
/** How long close() waits for the reader to acknowledge the stop request (normally microseconds). */
const STOP_TIMEOUT_MS = 2000;
/** How long ready() waits for the reader thread to start (tsx compiles the worker's modules first under Node). */
const START_TIMEOUT_MS = 30_000;

export interface FfiUdpBindOptions {
  /** Receive ring slots (a power of two; default 512). */
  slots?: number;
  /** Bytes per receive slot (default 64 KiB: any datagram fits; larger ones are dropped and counted). */
  slotSize?: number;
  /** SO_RCVBUF/SO_SNDBUF (default 7 MiB). */
  socketBufferBytes?: number;
  /** The libc binding for the main thread's calls (tests wrap it to inject faults); default loadLibc(). */
  libc?: Libc;
  /**
   * UDP segmentation offload for sendBatch (UDP_SEGMENT) and receive offload (UDP_GRO). Default:
   * on (the daemon passes ROAMGUARD_UDP_OFFLOAD, dataplane/settings.ts). Sending falls back to one datagram per message by itself
   * when the kernel or the path refuses GSO.
   */
  offload?: boolean;
  /**
   * Test only: the Nth wake-up (from 1) that the reader's notify brings the waiting main thread
   * is thrown away, as if that notify had been lost (see the ring stress test).
   */
  loseWakeUp?: number;
  /** The receive ring's stall watchdog (default on); the ring stress test turns it off. */
  watchdog?: boolean;
  /** Test only: the ring's first sequence number (e.g. just below 2^31, to cross the wrap-around). */
  startSequence?: number;
}

/** BindStats plus what only this bind knows. */
export class FfiBindStats implements BindStats {
  received = 0;
  sent = 0;
  sendErrors = 0;
  /** Wake-ups of the main thread that delivered datagrams (received / batches = the average batch). */
  batches = 0;
  /** Sticky sources cleared because the kernel refused to send from them (the address was removed). */
  sourcesCleared = 0;
  #retiredReceiveErrors = 0;
  #retiredKernelDrops = 0;
  #header: Int32Array | undefined;
  readonly #queues: SendQueue[];

  constructor(queues: SendQueue[]) {
    this.#queues = queues;
  }

  /** Failed receives and datagrams too large for a ring slot. */
  get receiveErrors(): number {
    const h = this.#header;
    return this.#retiredReceiveErrors + (h ? Atomics.load(h, READ_ERRORS) + Atomics.load(h, TRUNCATED) : 0);
  }

  /**
   * Datagrams the kernel dropped because a socket's receive queue was full (SO_RXQ_OVFL), as far
   * as a later datagram has reported it: the reader never saw them.
   */
  get kernelDrops(): number {
    const h = this.#header;
    return this.#retiredKernelDrops + (h ? (h[KERNEL_DROPS] >>> 0) + (h[KERNEL_DROPS + 1] >>> 0) : 0);
  }

  /** Datagrams waiting for room in a socket's send buffer. */
  get queued(): number {
    let n = 0;
    for (const q of this.#queues) n += q.items.length - q.head;
    return n;
  }

  /** Follows the ring of a new session. */
  attach(header: Int32Array): void {
    this.#header = header;
  }

  /** Keeps the counts of a closed session's ring. */
  detach(): void {
    this.#retiredReceiveErrors = this.receiveErrors;
    this.#retiredKernelDrops = this.kernelDrops;
    this.#header = undefined;
  }
}

interface QueuedDatagram {
  name: Uint8Array;
  data: Uint8Array;
  /** The destination, for its sticky source (endpoint.local at the time of the retry). */
  to: Endpoint;
}

class SendQueue {
  items: QueuedDatagram[] = [];
  head = 0;
  get empty(): boolean {
    return this.head === this.items.length;
  }
}

/**
 * Messages of any size, each from a sticky source or none, to their own destinations (sendmmsg:
 * sendto cannot carry a control message). `send` uses one slot; the send queue's flush fills them
 * all, so a backlog after EAGAIN leaves in a few calls, not one per datagram. The datagrams are
 * copied here, as the kernel needs a raw address for each.
 */
class SendArea {
  readonly msgs: Uint8Array;
  private readonly msg32: Uint32Array;
  private readonly base: number;
  private readonly view: DataView;
  private readonly bytes: Uint8Array;

  constructor(libc: Libc, readonly slots: number) {
    const buffer = new SharedArrayBuffer(slots * (MMSGHDR_SIZE + SEND_SLOT_SIZE));
    this.msgs = new Uint8Array(buffer, 0, slots * MMSGHDR_SIZE);
    this.msg32 = new Uint32Array(buffer, 0, (slots * MMSGHDR_SIZE) / 4);
    this.bytes = new Uint8Array(buffer);
    this.view = new DataView(buffer);
    this.base = libc.address(this.bytes.subarray(0, 1));
    for (let i = 0; i < slots; i++) {
      const m = i * MMSGHDR_SIZE, slot = this.slotOffset(i);
      this.view.setBigUint64(m, BigInt(this.base + slot + IOVEC_SIZE), true); // msg_name
      this.view.setBigUint64(m + 16, BigInt(this.base + slot), true); // msg_iov
      this.view.setBigUint64(m + 24, 1n, true); // msg_iovlen
      this.view.setBigUint64(m + 32, BigInt(this.base + slot + IOVEC_SIZE + NAME_SIZE), true); // msg_control
      this.view.setBigUint64(slot, BigInt(this.base + slot + SEND_SLOT_HEADER), true); // iov_base
    }
  }

  private slotOffset(i: number): number {
    return this.slots * MMSGHDR_SIZE + i * SEND_SLOT_SIZE;
  }

  /** Fills message `i`; false when the datagram cannot be a UDP datagram (the caller counts it). */
  prepare(i: number, name: Uint8Array, datagram: Uint8Array, source: Uint8Array | undefined): boolean {
    if (datagram.length > SEND_SLOT_DATA) return false;
    const slot = this.slotOffset(i), w = (i * MMSGHDR_SIZE) / 4;
    this.bytes.set(name, slot + IOVEC_SIZE);
    this.msg32[w + 2] = name.length; // msg_namelen
    this.bytes.set(datagram, slot + SEND_SLOT_HEADER);
    this.view.setBigUint64(slot + 8, BigInt(datagram.length), true); // iov_len
    if (source !== undefined) this.bytes.set(source, slot + IOVEC_SIZE + NAME_SIZE);
    this.msg32[w + 10] = source?.length ?? 0; // msg_controllen
    return true;
  }
}

/** A send slot: iovec, sockaddr, control (the sticky source), then the datagram. */
const SEND_SLOT_HEADER = IOVEC_SIZE + NAME_SIZE + PKTINFO6_SPACE;
const SEND_SLOT_DATA = 65536;
const SEND_SLOT_SIZE = SEND_SLOT_HEADER + SEND_SLOT_DATA;
/** Queued datagrams sent per sendmmsg when the queue is flushed. */
const FLUSH_SLOTS = 64;

/** Small datagrams sent while received ones are being delivered are collected, up to this many... */
const DEFERRED_CAPACITY = 256;
/** ...of at most this many bytes each (cookie replies 64, handshake responses 92, keepalives 32). */
const DEFERRED_MAX_BYTES = 256;

/**
 * The datagrams `send` is given while the bind delivers received ones (mostly the answers to
 * them: under a handshake flood, one cookie reply per message), copied here and sent with one
 * sendmmsg per delivery instead of one sendto each. Message i has its own destination (name i),
 * data slot i and control buffer i (its sticky source, if any); all are to one socket (a datagram
 * for the other family flushes first).
 */
class DeferredArea {
  readonly msgs: Uint8Array;
  readonly msg32: Uint32Array;
  readonly iov32: Uint32Array;
  readonly names: Uint8Array;
  readonly data: Uint8Array;
  readonly controls: Uint8Array;
  /** Message i's destination (for its sticky source, and to clear that source if the kernel refuses it). */
  readonly destinations: Array<Endpoint | undefined> = new Array(DEFERRED_CAPACITY).fill(undefined);
  count = 0;
  /** The family of the datagrams collected (4 or 6). */
  family = 4;

  constructor(libc: Libc) {
    const iovOffset = DEFERRED_CAPACITY * MMSGHDR_SIZE;
    const nameOffset = iovOffset + DEFERRED_CAPACITY * IOVEC_SIZE;
    const controlOffset = nameOffset + DEFERRED_CAPACITY * NAME_SIZE;
    const dataOffset = controlOffset + DEFERRED_CAPACITY * PKTINFO6_SPACE;
    const buffer = new SharedArrayBuffer(dataOffset + DEFERRED_CAPACITY * DEFERRED_MAX_BYTES);
    this.msgs = new Uint8Array(buffer, 0, iovOffset);
    this.msg32 = new Uint32Array(buffer, 0, iovOffset / 4);
    this.iov32 = new Uint32Array(buffer, iovOffset, (DEFERRED_CAPACITY * IOVEC_SIZE) / 4);
    this.names = new Uint8Array(buffer, nameOffset, DEFERRED_CAPACITY * NAME_SIZE);
    this.data = new Uint8Array(buffer, dataOffset, DEFERRED_CAPACITY * DEFERRED_MAX_BYTES);
    this.controls = new Uint8Array(buffer, controlOffset, DEFERRED_CAPACITY * PKTINFO6_SPACE);
    const base = libc.address(new Uint8Array(buffer, 0, 1));
    const view = new DataView(buffer);
    for (let i = 0; i < DEFERRED_CAPACITY; i++) {
      const msg = i * MMSGHDR_SIZE;
      view.setBigUint64(msg, BigInt(base + nameOffset + i * NAME_SIZE), true); // msg_name
      view.setBigUint64(msg + 16, BigInt(base + iovOffset + i * IOVEC_SIZE), true); // msg_iov
      view.setBigUint64(msg + 24, 1n, true); // msg_iovlen
      view.setBigUint64(msg + 32, BigInt(base + controlOffset + i * PKTINFO6_SPACE), true); // msg_control
      // msg_flags stays 0; msg_namelen and msg_controllen are set per datagram.
      view.setBigUint64(iovOffset + i * IOVEC_SIZE, BigInt(base + dataOffset + i * DEFERRED_MAX_BYTES), true); // iov_base
    }
  }

  /** Copies a datagram, its destination and its sticky source's control message (if any) into the next message. */
  add(to: Endpoint, name: Uint8Array, datagram: Uint8Array, source: Uint8Array | undefined): void {
    const i = this.count++;
    this.names.set(name, i * NAME_SIZE);
    this.msg32[i * (MMSGHDR_SIZE / 4) + 2] = name.length; // msg_namelen
    this.data.set(datagram, i * DEFERRED_MAX_BYTES);
    this.iov32[i * (IOVEC_SIZE / 4) + 2] = datagram.length; // iov_len
    this.destinations[i] = to;
    if (source === undefined) {
      this.msg32[i * (MMSGHDR_SIZE / 4) + 10] = 0; // msg_controllen
    } else {
      this.controls.set(source, i * PKTINFO6_SPACE);
      this.msg32[i * (MMSGHDR_SIZE / 4) + 10] = source.length;
    }
  }

  /** Whether message i is to leave from a sticky source. */
  sourced(i: number): boolean {
    return this.msg32[i * (MMSGHDR_SIZE / 4) + 10] !== 0;
  }

  /** Message i leaves from an address the kernel picks. */
  unsource(i: number): void {
    this.msg32[i * (MMSGHDR_SIZE / 4) + 10] = 0;
  }

  /** Message i's destination and bytes (views into this area), for the send queue. */
  name(i: number): Uint8Array {
    return this.names.subarray(i * NAME_SIZE, i * NAME_SIZE + this.msg32[i * (MMSGHDR_SIZE / 4) + 2]);
  }

  datagram(i: number): Uint8Array {
    return this.data.subarray(i * DEFERRED_MAX_BYTES, i * DEFERRED_MAX_BYTES + this.iov32[i * (IOVEC_SIZE / 4) + 2]);
  }
}

/** One open(): the sockets, the receive ring and its reader thread. */
class Session {
  readonly fds: number[];
  readonly views: UdpRingViews;
  readonly mask: number;
  worker: Worker | undefined;
  /** Settles when the reader thread has exited. */
  exited: Promise<void> = Promise.resolve();
  readSeq = 0;
  pumpScheduled = false;
  closed = false;
  /** The reader thread failed (reported once). */
  failed = false;
  /** Identifies the current wait; a wake-up of an abandoned one (the watchdog's recovery) is ignored. */
  waitToken = 0;
  /** With opening: the port the reader learns of new session state from, and the unsubscribe. */
  sessionsPort: MessagePort | undefined;
  stopSharing: (() => void) | undefined;
  /** The reader's own TUN descriptors (one per queue; none without a TUN), closed once it has stopped. */
  tunFds: number[] = [];
  /** Unregisters the reader's wake-up at process exit (threads.ts). */
  forgetAtExit: (() => void) | undefined;
  readonly backstop = new WaitBackstop();

  constructor(
    readonly fd4: number,
    readonly fd6: number,
    readonly wakeFd: number,
    readonly buffer: SharedArrayBuffer,
    readonly slots: number,
    readonly slotSize: number,
  ) {
    this.fds = fd6 >= 0 ? [fd4, fd6] : [fd4];
    this.views = udpRingViews(buffer, { slots, slotSize });
    this.mask = slots - 1;
  }
}

/** A source seen before: the Endpoint handed out for it, and what it was made from. */
interface SourceEntry {
  endpoint: Endpoint;
  /**
   * endpoint.local as it was made: when the bind has cleared it since (the kernel refused to send
   * from it), the next datagram makes a new Endpoint, so an address that came back is used again.
   */
  local: LocalSource | undefined;
  /** The local address words and interface index it was made from (udp-ring.ts, LOCAL_WORDS). */
  l0: number;
  l1: number;
  l2: number;
  l3: number;
  ifindex: number;
  /** IPv6: the remote address words (the map key is a hash of them). */
  w0: number;
  w1: number;
  w2: number;
  w3: number;
}

/** Whether a cached source was made from the local address in slot words `l`, and still has it. */
function sameLocal(entry: SourceEntry, locals: Int32Array, l: number): boolean {
  const local = entry.local;
  if (entry.endpoint.local !== local) return false; // cleared since: see SourceEntry.local
  if (locals[l + LOCAL_FAMILY] === 0) return local === undefined;
  return local !== undefined && entry.l0 === locals[l] && entry.l1 === locals[l + 1] && entry.l2 === locals[l + 2]
    && entry.l3 === locals[l + 3] && entry.ifindex === locals[l + LOCAL_IFINDEX];
}

/** Reader threads of this process that have not exited yet (all FfiUdpBinds). */
let liveReaders = 0;

export class FfiUdpBind implements Bind, Liveness {
  port = 0;
  readonly stats: FfiBindStats;
  /** Receive-ring stalls the watchdog found (datagrams in the ring, none taken for STALL_MS). */
  stalls = 0;
  onStall: StallHandler | undefined = undefined;
  private readonly ringWatch = new StallWatch('UDP ring');
  /** Ends the ring's watch (watchdog.ts). */
  private stopWatching: (() => void) | undefined;
  /** A reader of an earlier session (an earlier listen port) could not load an AEAD provider. */
  private openerFailedBefore = false;
  private wakeUps = 0;

  /** Reader threads of this process that have not exited yet, for diagnostics and tests. */
  static get readerThreads(): number {
    return liveReaders;
  }

  private readonly slots: number;
  private readonly slotSize: number;
  private readonly bufferBytes: number;
  private readonly ringBytes: number;
  private libc: Libc | undefined;
  private tx: TxArea | undefined;
  private readonly progress = newSendProgress();
  private readonly socketListeners = new Set<() => void>();

  /** The sockets for a TUN reader that sends (Bind.threadSockets): duplicates, told anew after each open. */
  readonly threadSockets: ThreadSocketsFeed = {
    current: (): ThreadSockets | undefined => {
      const s = this.session;
      const libc = this.libc;
      if (s === undefined || libc === undefined) return undefined;
      const fd4 = libc.dup(s.fd4);
      if (fd4 < 0) return undefined;
      const fd6 = s.fd6 >= 0 ? libc.dup(s.fd6) : -1;
      return { fd4, fd6, gso: this.gso };
    },
    onChange: (listener: () => void): (() => void) => {
      this.socketListeners.add(listener);
      return () => this.socketListeners.delete(listener);
    },
  };
  private deferred: DeferredArea | undefined;
  /** One slot for `send`; FLUSH_SLOTS for the send queue's flush. */
  private soloArea: SendArea | undefined;
  private flushArea: SendArea | undefined;
  /** True while received datagrams are being handed to the handler: small sends are collected (DeferredArea). */
  private delivering = false;
  private session: Session | undefined;
  private handler: ReceiveHandler = () => {};
  private delivery: DeliveryBracket | undefined;
  /** What the reader threads open (openTransport), for readers started from then on. */
  private opening: TransportOpening | undefined;
  /** Reused for each datagram handed over. */
  private readonly openedRecord: OpenedTransport = { outcome: NOT_OPENED, length: 0, slot: 0, generation: 0 };
  private kernelDropsHandler: (dropped: number) => void = () => {};
  private backlogHandler: (pending: number, capacity: number) => void = () => {};
  /** stats.kernelDrops as last reported to kernelDropsHandler. */
  private kernelDropsReported = 0;
  private mark = 0;
  /** open/close run one at a time. */
  private lifecycle: Promise<unknown> = Promise.resolve();

  private readonly sockaddrs = new WeakMap<Endpoint, Uint8Array>();
  /** The IP_PKTINFO / IPV6_PKTINFO control message of each sticky source, built once. */
  private readonly sourceControls = new WeakMap<LocalSource, Uint8Array>();
  /** Raw addresses of the callers' shared buffers (made with libc, on open). */
  private addresses: SharedAddresses | undefined;
  private readonly endpoints4 = new Map<number, SourceEntry>();
  private readonly endpoints6 = new Map<number, SourceEntry>();

  /** Send runs of equal-sized datagrams as one UDP GSO message (cleared when the kernel refuses it). */
  private gso: boolean;
  /** Ask the kernel for coalesced receives (UDP_GRO). */
  private readonly gro: boolean;

  private readonly queue4 = new SendQueue();
  private readonly queue6 = new SendQueue();
  private flushScheduled = false;

  constructor(private readonly options: FfiUdpBindOptions = {}) {
    this.slots = options.slots ?? UDP_RING_SLOTS;
    this.slotSize = options.slotSize ?? UDP_SLOT_SIZE;
    this.bufferBytes = options.socketBufferBytes ?? SOCKET_BUFFER_BYTES;
    this.ringBytes = udpRingOffsets({ slots: this.slots, slotSize: this.slotSize }).total; // validates the layout early
    this.stats = new FfiBindStats([this.queue4, this.queue6]);
    const offload = options.offload ?? true;
    this.gso = offload;
    this.gro = offload;
  }

  /** Whether sendBatch currently uses UDP GSO (for diagnostics and tests). */
  get segmentationOffload(): boolean {
    return this.gso;
  }

  /** The sockets' file descriptors (-1 = none), for diagnostics and tests. */
  get fileDescriptors(): { v4: number; v6: number } {
    const s = this.session;
    return { v4: s?.fd4 ?? -1, v6: s?.fd6 ?? -1 };
  }

  onReceive(handler: ReceiveHandler, delivery?: DeliveryBracket): void {
    this.handler = handler;
    this.delivery = delivery;
  }

  /** Reader threads started from now on (each open()) open transport messages in place. */
  openTransport(opening: TransportOpening): void {
    this.opening = opening;
  }

  /** Packets the current reader thread wrote to the TUN itself, and those the kernel refused (step 2b). */
  get tunWrites(): { written: number; errors: number } {
    const header = this.session?.views.header;
    return { written: header ? Atomics.load(header, TUN_WRITTEN) : 0, errors: header ? Atomics.load(header, TUN_WRITE_ERRORS) : 0 };
  }

  /**
   * Whether a reader thread of this bind could not load an AEAD provider (it then leaves every
   * datagram to the main thread). Only a reader that has tried counts: one still booting (a new
   * listen port just applied) is not a failure yet.
   */
  get openerFailed(): boolean {
    const session = this.session;
    return this.openerFailedBefore || (session !== undefined && Atomics.load(session.views.header, OPENER_FAILED) === 1);
  }

  onKernelDrops(handler: (dropped: number) => void): void {
    this.kernelDropsHandler = handler;
  }

  onBacklog(handler: (pending: number, capacity: number) => void): void {
    this.backlogHandler = handler;
  }

  get liveness(): Liveness {
    return this;
  }

  get stalledMs(): number {
    return this.ringWatch.stalledMs(performance.now());
  }

  /**
   * The watchdog (every WATCH_INTERVAL_MS while open): datagrams the reader published and the
   * main thread has not taken for STALL_MS mean its wake-up went astray. Reported once, counted,
   * recovered by abandoning the wait and pumping now.
   */
  private readonly watchRing = (): void => {
    const session = this.session;
    if (!session || session.closed || session.failed) return;
    const header = session.views.header;
    const written = Atomics.load(header, WRITE_SEQ);
    const before = this.ringWatch.stalls;
    const recover = this.ringWatch.check(performance.now(), written !== session.readSeq, session.readSeq, () => ({
      written, consumed: session.readSeq, slots: session.slots, mainWaiting: Atomics.load(header, CONSUMER_WAITING) !== 0,
      pumpScheduled: session.pumpScheduled, state: Atomics.load(header, STATE),
    }), this.onStall);
    this.stalls += this.ringWatch.stalls - before;
    if (recover) {
      session.waitToken++;
      this.schedulePump(session);
    }
  };

  open(port: number): Promise<number> {
    if (!Number.isInteger(port) || port < 0 || port > 65535) return Promise.reject(new Error(`listen port must be 0..65535, got ${port}`));
    const run = this.lifecycle.then(() => this.openNow(port));
    this.lifecycle = run.catch(() => {});
    return run;
  }

  /**
   * Closes the sockets and stops the reader; settles once the reader thread has exited, also one
   * that was still starting (left to end by itself, see closeNow): the process may exit then.
   */
  close(): Promise<void> {
    const run = this.lifecycle.then(async () => {
      const exited = this.session?.exited;
      await this.closeNow();
      await exited;
    });
    this.lifecycle = run.catch(() => {});
    return run;
  }

  async setMark(mark: number): Promise<void> {
    if (!Number.isInteger(mark) || mark < 0 || mark > 0xffffffff) throw new RangeError(`bad mark ${mark}`);
    const s = this.session;
    if (s && this.libc) this.applyMark(this.libc, s.fds, mark);
    this.mark = mark;
  }

  // --- opening and closing ------------------------------------------------------------------------

  private async openNow(port: number): Promise<number> {
    await this.closeNow();
    const libc = (this.libc ??= this.options.libc ?? await loadLibc());
    this.tx ??= new TxArea(libc);
    this.deferred ??= new DeferredArea(libc);
    this.soloArea ??= new SendArea(libc, 1);
    this.flushArea ??= new SendArea(libc, FLUSH_SLOTS);
    const { fd4, fd6, chosen } = this.bindSockets(libc, port);
    let wakeFd = -1;
    try {
      if (this.mark !== 0) this.applyMark(libc, fd6 >= 0 ? [fd4, fd6] : [fd4], this.mark);
      wakeFd = libc.eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
      if (wakeFd < 0) throw errnoError('eventfd', libc.errno());
      const buffer = new SharedArrayBuffer(this.ringBytes);
      const session = new Session(fd4, fd6, wakeFd, buffer, this.slots, this.slotSize);
      if (this.options.startSequence !== undefined) {
        const start = this.options.startSequence | 0;
        Atomics.store(session.views.header, WRITE_SEQ, start);
        Atomics.store(session.views.header, READ_SEQ, start);
        session.readSeq = start;
      }
      this.startReader(session);
      this.session = session;
      if (this.options.watchdog !== false && this.stopWatching === undefined) {
        this.stopWatching = lookEveryInterval(this.watchRing);
      }
      this.stats.attach(session.views.header);
      this.port = chosen;
      this.waitForData(session);
      for (const listener of this.socketListeners) listener();
      return chosen;
    } catch (err) {
      libc.close(fd4);
      if (fd6 >= 0) libc.close(fd6);
      if (wakeFd >= 0) libc.close(wakeFd);
      throw err;
    }
  }

  /** Creates and binds both sockets (see the file comment); throws with code EADDRINUSE when the port is taken. */
  private bindSockets(libc: Libc, port: number): { fd4: number; fd6: number; chosen: number } {
    for (let attempt = 0; ; attempt++) {
      const fd4 = this.newSocket(libc, AF_INET);
      if (fd4 < 0) throw errnoError('socket(AF_INET, SOCK_DGRAM)', libc.errno());
      let fd6 = -1;
      try {
        const any4 = new Uint8Array(SOCKADDR_IN_SIZE);
        new Uint16Array(any4.buffer, 0, 1)[0] = AF_INET;
        any4[2] = port >>> 8;
        any4[3] = port & 0xff;
        if (libc.bind(fd4, any4, SOCKADDR_IN_SIZE) !== 0) throw errnoError('bind', libc.errno(), `0.0.0.0:${port}`);
        const chosen = this.localPort(libc, fd4);

        fd6 = this.newSocket(libc, AF_INET6);
        if (fd6 < 0) {
          const errno = libc.errno();
          if (errno === EAFNOSUPPORT) return { fd4, fd6: -1, chosen }; // no IPv6 in this kernel
          throw errnoError('socket(AF_INET6, SOCK_DGRAM)', errno);
        }
        const one = new Uint8Array(4);
        new Int32Array(one.buffer)[0] = 1;
        if (libc.setsockopt(fd6, IPPROTO_IPV6, IPV6_V6ONLY, one, 4) !== 0) throw errnoError('setsockopt(IPV6_V6ONLY)', libc.errno());
        const any6 = new Uint8Array(SOCKADDR_IN6_SIZE);
        new Uint16Array(any6.buffer, 0, 1)[0] = AF_INET6;
        any6[2] = chosen >>> 8;
        any6[3] = chosen & 0xff;
        if (libc.bind(fd6, any6, SOCKADDR_IN6_SIZE) !== 0) {
          const errno = libc.errno();
          libc.close(fd6);
          fd6 = -1;
          if (errno === EADDRINUSE && port === 0 && attempt < PORT_PICK_ATTEMPTS) {
            libc.close(fd4);
            continue;
          }
          // IPv6 disabled on this host (no address to bind): v4 only, as wireguard-go does.
          if (errno === EADDRNOTAVAIL || errno === EAFNOSUPPORT) return { fd4, fd6: -1, chosen };
          throw errnoError('bind', errno, `[::]:${chosen}`);
        }
        return { fd4, fd6, chosen };
      } catch (err) {
        libc.close(fd4);
        if (fd6 >= 0) libc.close(fd6);
        throw err;
      }
    }
  }

  /** A non-blocking, close-on-exec datagram socket with large buffers, or -1 (errno set). */
  private newSocket(libc: Libc, family: number): number {
    const fd = libc.socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return fd;
    const size = new Uint8Array(4);
    new Int32Array(size.buffer)[0] = this.bufferBytes;
    // The FORCE variants need CAP_NET_ADMIN; without it the plain options apply, capped by the sysctls.
    if (libc.setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, size, 4) !== 0) libc.setsockopt(fd, SOL_SOCKET, SO_RCVBUF, size, 4);
    if (libc.setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, size, 4) !== 0) libc.setsockopt(fd, SOL_SOCKET, SO_SNDBUF, size, 4);
    // Datagrams then carry the socket's count of kernel drops (a full receive queue): see kernelDrops.
    const on = new Uint8Array(4);
    new Int32Array(on.buffer)[0] = 1;
    libc.setsockopt(fd, SOL_SOCKET, SO_RXQ_OVFL, on, 4);
    // Each datagram comes with the local address it arrived on (sticky sources); without it, the kernel picks sources.
    if (family === AF_INET) libc.setsockopt(fd, IPPROTO_IP, IP_PKTINFO, on, 4);
    else libc.setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, on, 4);
    // Every datagram leaves with DF set, never fragmented on the way: a path narrower than the tunnel
    // then loses large datagrams whole instead of carrying them as fragments that NATs and firewalls
    // often drop, which is what lets the agent's probes find each peer's path MTU (control/agent/
    // path-mtu.ts). Without the option, GSO runs would leave without DF (the kernel sets it only on
    // datagrams within the path MTU) and a router would fragment them.
    const probe = new Uint8Array(4);
    new Int32Array(probe.buffer)[0] = family === AF_INET ? IP_PMTUDISC_PROBE : IPV6_PMTUDISC_PROBE;
    libc.setsockopt(fd, family === AF_INET ? IPPROTO_IP : IPPROTO_IPV6, family === AF_INET ? IP_MTU_DISCOVER : IPV6_MTU_DISCOVER, probe, 4);
    if (this.gro) {
      // Coalesced receives: a kernel without UDP_GRO simply delivers one datagram per message.
      const one = new Uint8Array(4);
      new Int32Array(one.buffer)[0] = 1;
      libc.setsockopt(fd, SOL_UDP, UDP_GRO, one, 4);
    }
    return fd;
  }

  private localPort(libc: Libc, fd: number): number {
    const name = new Uint8Array(SOCKADDR_IN6_SIZE);
    const length = new Uint8Array(4);
    new Uint32Array(length.buffer)[0] = name.length;
    if (libc.getsockname(fd, name, length) !== 0) throw errnoError('getsockname', libc.errno());
    return (name[2] << 8) | name[3];
  }

  private applyMark(libc: Libc, fds: number[], mark: number): void {
    const value = new Uint8Array(4);
    new Uint32Array(value.buffer)[0] = mark;
    for (const fd of fds) {
      if (libc.setsockopt(fd, SOL_SOCKET, SO_MARK, value, 4) !== 0) throw errnoError('setsockopt(SO_MARK)', libc.errno());
    }
  }

  /**
   * Starts the reader thread. open() does not wait for it: under Node a worker takes a few hundred
   * milliseconds to boot (tsx compiles its modules), and meanwhile the kernel keeps what arrives in
   * the socket buffers. A thread that fails to start is reported like one that fails later.
   */
  private startReader(session: Session): void {
    const config: UdpReaderConfig = {
      fds: session.fds, wakeFd: session.wakeFd, buffer: session.buffer, slots: session.slots, slotSize: session.slotSize,
    };
    const opening = this.opening;
    if (opening !== undefined) {
      // New chunks and a moved index map reach the reader through this port; it reads it only when it needs to.
      const { port1, port2 } = new MessageChannel();
      port1.unref();
      const shared = shareSessions(opening.keypairs, opening.indices, opening.routes, (message) => port1.postMessage(message), opening.sendTable);
      session.sessionsPort = port1;
      session.stopSharing = shared.stop;
      // With a TUN to write to, the reader delivers what it may itself (through its own descriptor, closed with the session).
      const tun = opening.routes !== undefined ? opening.tunWriter?.() : undefined;
      session.tunFds = tun?.fds ?? [];
      config.opening = { selection: { ...opening.selection }, sessions: shared.init, port: port2, tun, gso: this.gso };
    }
    const entry = new URL(`./udp-reader-worker${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url);
    const worker = startWorker(entry, { ...config }, config.opening ? [config.opening.port] : undefined);
    session.worker = worker;
    const libc = this.libc!;
    session.forgetAtExit = wakeAtExit(() => {
      requestStop(session.views.header);
      signalEventFd(libc, session.wakeFd);
    });
    liveReaders++;
    session.exited = new Promise<void>((resolve) => worker.once('exit', () => { liveReaders--; resolve(); }));
    const header = session.views.header;
    worker.on('error', (err) => this.readerFailed(session, err instanceof Error ? err : new Error(String(err))));
    worker.on('exit', (code) => {
      if (session.closed) return;
      if (Atomics.load(header, READER_FAILED) === 1) {
        this.readerFailed(session, errnoError('UDP reader: poll', Atomics.load(header, LAST_ERRNO)));
      } else {
        this.readerFailed(session, new Error(`UDP reader thread exited unexpectedly (code ${code})`));
      }
    });
  }

  /**
   * Resolves once the reader thread runs (received datagrams are then handed over as they come;
   * before, the kernel holds them). For benchmarks and tests; rejects when the bind is closed or
   * the thread does not start within 30 s.
   */
  async ready(): Promise<void> {
    for (;;) {
      // A new listen port being applied (close, then open) settles first: the daemon asks for
      // readiness while its control socket already takes requests (dataplane/device/daemon.ts).
      await this.lifecycle;
      const session = this.session;
      if (!session) throw new Error('the bind is not open');
      const header = session.views.header;
      const state = Atomics.load(header, STATE);
      if (state === STATE_RUNNING) return;
      if (session.closed) continue; // replaced by a new listen port meanwhile: wait for that one
      if (state !== STATE_BOOTING) throw new Error('the UDP reader thread is not running');
      if ((await awaitBooted(header, START_TIMEOUT_MS)) === 'timed-out') {
        throw new Error(`UDP reader thread did not start within ${START_TIMEOUT_MS} ms`);
      }
    }
  }

  /**
   * The reader thread failed: nothing will be received any more. Datagrams already in the ring
   * are delivered, then the error is thrown from a microtask (an uncaught exception: the daemon
   * must not go on deaf).
   */
  private readerFailed(session: Session, err: Error): void {
    if (session.closed || session.failed) return;
    session.failed = true;
    this.pump(session);
    queueMicrotask(() => { throw err; });
  }

  /**
   * Stop handshake with the reader; afterwards it no longer uses the fds. Returns the state the
   * reader was in: BOOTING (it will return as soon as it has started, without touching the fds),
   * RUNNING (it has stopped now, or is stuck if STATE is not STOPPED) or STOPPED (it had ended).
   */
  private stopReader(session: Session): number {
    const header = session.views.header;
    const previous = requestStop(header);
    if (previous !== STATE_RUNNING && previous !== STATE_STOP_REQUESTED) return previous;
    signalEventFd(this.libc!, session.wakeFd); // it may sit in poll
    awaitStopped(header, STOP_TIMEOUT_MS);
    return STATE_RUNNING;
  }

  /**
   * Stops the reader, then closes the sockets. The reader thread is never terminate()d while it
   * may still be starting: under Node, terminating a worker while it loads koffi's native module
   * aborts the whole process (a fatal napi_throw during the addon's initialisation). A thread
   * that was still starting is left to notice the STOPPED state and end by itself.
   */
  private async closeNow(): Promise<void> {
    const session = this.session;
    this.dropQueued();
    if (!session) return;
    const libc = this.libc!;
    this.session = undefined;
    this.stopWatching?.();
    this.stopWatching = undefined;
    this.port = 0;
    const header = session.views.header;
    const previous = this.stopReader(session);
    // What the reader already took from the sockets is delivered, not dropped (a new listen port
    // must not cost the datagrams in flight; replies the handler sends meanwhile count as errors).
    if (Atomics.load(header, STATE) === STATE_STOPPED && !session.closed) this.deliverReady(session, Infinity);
    session.closed = true;
    this.openerFailedBefore ||= Atomics.load(header, OPENER_FAILED) === 1;
    if (Atomics.load(header, STATE) !== STATE_STOPPED) {
      // Stuck (it has not answered within STOP_TIMEOUT_MS, though it was running): the sockets
      // may only be closed once the thread is gone.
      await session.worker?.terminate().catch(() => 0);
      await session.exited;
    }
    for (const fd of session.fds) libc.close(fd);
    session.forgetAtExit?.();
    libc.close(session.wakeFd);
    session.stopSharing?.();
    session.sessionsPort?.close();
    for (const fd of session.tunFds) libc.close(fd);
    session.tunFds = [];
    this.stats.detach();
    settleWaits(header); // a pending wait for data, and ready()
    if (previous !== STATE_BOOTING) await session.exited; // a stopped reader ends at once
  }

  // --- receiving --------------------------------------------------------------------------------------

  private waitForData(session: Session): void {
    if (session.closed) return;
    const header = session.views.header;
    const seen = Atomics.load(header, WRITE_SEQ);
    if (seen !== session.readSeq) return this.schedulePump(session);
    const token = ++session.waitToken;
    // The wait also ends after its backstop (a lost notify, items published without ringing; the pump looks again).
    const woken = awaitChange(header, WRITE_SEQ, CONSUMER_WAITING, seen, this.options.loseWakeUp === undefined ? session.backstop.next(seen) : undefined);
    if (woken === undefined) return this.schedulePump(session);
    void woken.then(() => {
      if (++this.wakeUps === this.options.loseWakeUp) return; // test only: a lost notify
      if (token === session.waitToken) this.pump(session);
    });
  }

  takeReceived(): void {
    const session = this.session;
    if (session === undefined || session.closed || this.delivering) return;
    if (this.deliverReady(session, PUMP_DATAGRAMS)) this.schedulePump(session);
  }

  /** Runs the pump from the macrotask queue, so a steady stream of datagrams cannot starve other I/O. */
  private schedulePump(session: Session): void {
    if (session.pumpScheduled) return;
    session.pumpScheduled = true;
    setImmediate(() => this.pump(session));
  }

  /** Hands every ready datagram to the handler, in order (a bounded number per turn), then waits for more. */
  private pump(session: Session): void {
    session.pumpScheduled = false;
    if (session.closed) return;
    // Enough for one turn of the event loop: let the crypto results and the TUN side run too.
    if (this.deliverReady(session, PUMP_DATAGRAMS)) return this.schedulePump(session);
    if (Atomics.load(session.views.header, STATE) === STATE_STOPPED) return; // the reader is gone (see readerFailed)
    this.waitForData(session);
  }

  /**
   * Delivers the datagrams in the ring, whole slots at a time, until `limit` were handed over;
   * returns whether slots are left. A throwing handler is a bug in the caller: its error is
   * rethrown from a microtask, with the ring kept consistent.
   */
  private deliverReady(session: Session, limit: number): boolean {
    const { header, lengths, offsets, opened, records } = session.views;
    const write = Atomics.load(header, WRITE_SEQ);
    let seq = session.readSeq;
    const count = seqDistance(write, seq);
    if (count <= 0) return false;
    let failure: unknown;
    let more = false;
    const { buffer, mask, slotSize } = session;
    const segments = session.views.segments;
    const handler = this.handler;
    const stats = this.stats;
    stats.batches++;
    try {
      this.backlogHandler(count, session.slots);
    } catch (err) {
      failure ??= err;
    }
    let delivered = 0;
    const record = this.openedRecord;
    const delivery = this.delivery;
    this.delivering = true;
    try {
      delivery?.begin();
    } catch (err) {
      failure ??= err;
    }
    for (let i = 0; i < count && !session.closed; i++) {
      if (delivered >= limit) {
        more = true;
        break;
      }
      const slot = seq & mask;
      seq = seqAdd(seq, 1);
      const length = lengths[slot];
      if (length < 0) continue; // truncated: counted by the reader
      const source = this.sourceOf(session.views, slot);
      if (source === undefined) continue;
      const start = offsets.data + slot * slotSize;
      // One datagram, or (UDP GRO) several of `size` bytes back to back, the last maybe shorter.
      const size = segments[slot];
      const step = size > 0 && size < length ? size : Math.max(length, 1);
      // What the reader's opener did to each of them (session/transport-opener.ts).
      const recordsAt = slot * SLOT_RECORD_INTS;
      const written = opened[slot];
      let offset = 0;
      let k = 0;
      do {
        stats.received++;
        try {
          handler(new Uint8Array(buffer, start + offset, Math.min(step, length - offset)), source, readRecord(records, recordsAt, k++, written, record));
        } catch (err) {
          failure ??= err ?? new Error('UDP datagram handler threw a nullish value');
        }
        offset += step;
        delivered++;
      } while (offset < length && !session.closed);
    }
    try {
      delivery?.end(); // before the slots are released: what it writes may be views into them
    } catch (err) {
      failure ??= err;
    }
    this.delivering = false;
    this.flushDeferred();
    session.readSeq = seq;
    release(header, seq);
    const kernelDrops = stats.kernelDrops;
    if (kernelDrops > this.kernelDropsReported) {
      const dropped = kernelDrops - this.kernelDropsReported;
      this.kernelDropsReported = kernelDrops;
      try {
        this.kernelDropsHandler(dropped);
      } catch (err) {
        failure ??= err;
      }
    }
    if (failure !== undefined) queueMicrotask(() => { throw failure; });
    return more;
  }

  /**
   * The Endpoint of slot `slot`'s source address and the local address it arrived on, from the
   * cache when this source was seen on that local address before (one entry per source: a peer
   * that moves to another of our addresses replaces it).
   */
  private sourceOf(views: UdpRingViews, slot: number): Endpoint | undefined {
    const { names, names16, names32, locals } = views;
    const b = slot * NAME_SIZE;
    const w = b >>> 2;
    const l = slot * LOCAL_WORDS;
    const port = (names[b + 2] << 8) | names[b + 3];
    const family = names16[b >>> 1];
    if (family === AF_INET) {
      const key = names32[w + 1] * 65536 + port;
      const entry = this.endpoints4.get(key);
      if (entry !== undefined && sameLocal(entry, locals, l)) return entry.endpoint;
      const host = entry?.endpoint.host ?? `${names[b + 4]}.${names[b + 5]}.${names[b + 6]}.${names[b + 7]}`;
      return this.remember(this.endpoints4, key, host, port, locals, l, 0, 0, 0, 0);
    }
    if (family === AF_INET6) {
      const w0 = names32[w + 2], w1 = names32[w + 3], w2 = names32[w + 4], w3 = names32[w + 5];
      let h = Math.imul(port ^ w0, 0x9e3779b1);
      h = Math.imul(h ^ (h >>> 15) ^ w1, 0x85ebca6b);
      h = Math.imul(h ^ (h >>> 13) ^ w2, 0xc2b2ae35);
      h = Math.imul(h ^ (h >>> 16) ^ w3, 0x27d4eb2f);
      const key = (h ^ (h >>> 15)) >>> 0;
      const entry = this.endpoints6.get(key);
      const sameRemote = entry !== undefined && entry.w0 === w0 && entry.w1 === w1 && entry.w2 === w2 && entry.w3 === w3 && entry.endpoint.port === port;
      if (sameRemote && sameLocal(entry, locals, l)) return entry.endpoint;
      const host = sameRemote ? entry.endpoint.host : formatIp(names.slice(b + 8, b + 24));
      return this.remember(this.endpoints6, key, host, port, locals, l, w0, w1, w2, w3);
    }
    return undefined;
  }

  /** A new Endpoint for a source (and the local address of slot words `l`), kept in `cache`. */
  private remember(cache: Map<number, SourceEntry>, key: number, host: string, port: number, locals: Int32Array, l: number,
    w0: number, w1: number, w2: number, w3: number): Endpoint {
    const l0 = locals[l], l1 = locals[l + 1], l2 = locals[l + 2], l3 = locals[l + 3], ifindex = locals[l + LOCAL_IFINDEX];
    const localFamily = locals[l + LOCAL_FAMILY];
    let local: LocalSource | undefined;
    if (localFamily !== 0) {
      const words = Int32Array.of(l0, l1, l2, l3); // the address bytes, in the order the kernel wrote them
      local = new LocalSource(new Uint8Array(words.buffer, 0, localFamily === 4 ? 4 : 16), ifindex);
    }
    const endpoint = new Endpoint(host, port, local);
    if (cache.size >= ENDPOINT_CACHE_LIMIT) cache.clear();
    cache.set(key, { endpoint, local, l0, l1, l2, l3, ifindex, w0, w1, w2, w3 });
    return endpoint;
  }

  // --- sending ----------------------------------------------------------------------------------------

  private sockaddrOf(to: Endpoint): Uint8Array {
    let name = this.sockaddrs.get(to);
    if (name === undefined) {
      name = encodeSockaddr(to.addressBytes, to.port);
      this.sockaddrs.set(to, name);
    }
    return name;
  }

  /** The control message for sending from `to`'s sticky source; undefined when it has none. */
  private sourceControlOf(to: Endpoint): Uint8Array | undefined {
    const local = to.local;
    if (local === undefined) return undefined;
    let control = this.sourceControls.get(local);
    if (control === undefined) {
      control = encodeSourceControl(local.address);
      this.sourceControls.set(local, control);
    }
    return control;
  }

  /**
   * The kernel will not send from `to`'s sticky source (the address was removed): from now on
   * it picks the source. The Endpoint is the peer's own, so its next datagrams go without one
   * too, until one arrives from the peer again (on an address we still have).
   */
  private clearSource(to: Endpoint): void {
    to.local = undefined;
    this.stats.sourcesCleared++;
  }

  /**
   * One datagram now, from `to`'s sticky source if it has one; always a one-entry sendmmsg (sendto
   * takes no control message), so there is one way to send alone. A refused source is cleared and
   * the datagram sent again without it.
   * Returns 0 when sent, else the errno.
   */
  private sendNow(fd: number, to: Endpoint, name: Uint8Array, datagram: Uint8Array): number {
    const libc = this.libc!;
    const area = this.soloArea!;
    for (;;) {
      const source = this.sourceControlOf(to);
      if (!area.prepare(0, name, datagram, source)) return EMSGSIZE;
      if (libc.sendmmsg(fd, area.msgs, 1, MSG_DONTWAIT) === 1) return 0;
      const errno = libc.errno();
      if (errno === EINTR) continue;
      if (source !== undefined && SOURCE_GONE.has(errno)) {
        this.clearSource(to);
        continue;
      }
      return errno;
    }
  }


  send(to: Endpoint, datagram: Uint8Array): void {
    const s = this.session;
    const fd = s === undefined ? -1 : to.family === 4 ? s.fd4 : s.fd6;
    if (fd < 0) {
      this.stats.sendErrors++;
      return;
    }
    const name = this.sockaddrOf(to);
    const queue = to.family === 4 ? this.queue4 : this.queue6;
    const deferred = this.deferred!;
    if (deferred.count > 0 && (!this.delivering || deferred.family !== to.family || datagram.length > DEFERRED_MAX_BYTES)) {
      this.flushDeferred(); // keeps the order of what was collected and this datagram
    }
    if (!queue.empty) return this.enqueue(queue, to, name, datagram);
    if (this.delivering && datagram.length <= DEFERRED_MAX_BYTES) {
      deferred.family = to.family;
      deferred.add(to, name, datagram, this.sourceControlOf(to));
      if (deferred.count === DEFERRED_CAPACITY) this.flushDeferred();
      return;
    }
    const errno = this.sendNow(fd, to, name, datagram);
    if (errno === 0) this.stats.sent++;
    else if (errno === EAGAIN) this.enqueue(queue, to, name, datagram);
    else this.stats.sendErrors++;
  }

  sendBatch(to: Endpoint, data: Uint8Array, stride: number, lengths: ArrayLike<number>, count: number): void {
    // The kernel reads what the iovecs say: only offsets inside `data` may ever reach them.
    if (!Number.isSafeInteger(stride) || stride < 0) throw new RangeError(`bad stride ${stride}`);
    this.sendRange(to, data, stride, lengths, 0, count);
  }

  /**
   * Datagrams [from, count) of a batch (see sendBatch). With UDP GSO, runs of datagrams of one size
   * (the last of a run may be shorter) leave as one message with a UDP_SEGMENT control message: the
   * kernel takes each run through its stack once, and a receiver with UDP_GRO gets it in one piece.
   */
  private sendRange(to: Endpoint, data: Uint8Array, stride: number, lengths: ArrayLike<number>, from: number, count: number): void {
    if (this.deferred !== undefined && this.deferred.count > 0) this.flushDeferred(); // in order
    const s = this.session;
    const fd = s === undefined ? -1 : to.family === 4 ? s.fd4 : s.fd6;
    if (fd < 0) {
      for (let i = from; i < count; i++) if (lengths[i] > 0) this.stats.sendErrors++;
      return;
    }
    const buffer = data.buffer;
    const queue = to.family === 4 ? this.queue4 : this.queue6;
    if (!queue.empty || !(buffer instanceof SharedArrayBuffer) || data.length === 0) {
      // Behind queued datagrams (order), or memory that may move: one by one (send copies only what it must queue).
      for (let i = from; i < count; i++) {
        const length = lengths[i];
        const start = i * stride;
        if (!(length > 0)) continue;
        if (start + length > data.length) this.stats.sendErrors++;
        else this.send(to, data.subarray(start, start + length));
      }
      return;
    }
    const libc = this.libc!;
    const tx = this.tx!;
    const base = (this.addresses ??= new SharedAddresses(libc)).of(data);
    const name = this.sockaddrOf(to);
    const source = this.sourceControlOf(to);
    const r = sendInPlace(libc, tx, fd, data, base, stride, lengths, from, count, name, source, this.gso, this.progress);
    this.stats.sent += r.sent;
    this.stats.sendErrors += r.refused;
    if (r.stop === STOPPED_FULL) {
      // The send buffer is full: queue copies of the rest, in order.
      for (let k = r.next; k < count; k++) {
        const length = lengths[k] | 0;
        const start = k * stride;
        if (length <= 0) continue;
        if (start + length > data.length) this.stats.sendErrors++;
        else this.enqueue(queue, to, name, data.subarray(start, start + length));
      }
    } else if (r.stop === STOPPED_SOURCE) {
      // The sticky source is gone: the rest leaves from an address the kernel picks.
      this.clearSource(to);
      this.sendRange(to, data, stride, lengths, r.next, count);
    } else if (r.stop === STOPPED_GSO) {
      // This path or kernel does not take UDP GSO (e.g. a path MTU below the datagram size): without it from now on.
      this.gso = false;
      this.sendRange(to, data, stride, lengths, r.next, count);
    }
  }

  /**
   * Sends the collected datagrams with sendmmsg. As with sendBatch: what the kernel has no room
   * for (EAGAIN) is queued in order, a datagram it refuses is counted and skipped.
   */
  private flushDeferred(): void {
    const deferred = this.deferred;
    if (deferred === undefined || deferred.count === 0) return;
    const m = deferred.count;
    deferred.count = 0;
    const s = this.session;
    const fd = s === undefined ? -1 : deferred.family === 4 ? s.fd4 : s.fd6;
    if (fd < 0) {
      this.stats.sendErrors += m;
      deferred.destinations.fill(undefined, 0, m);
      return;
    }
    const libc = this.libc!;
    const queue = deferred.family === 4 ? this.queue4 : this.queue6;
    let done = 0;
    while (done < m) {
      const sent = libc.sendmmsg(fd, done === 0 ? deferred.msgs : deferred.msgs.subarray(done * MMSGHDR_SIZE), m - done, MSG_DONTWAIT);
      if (sent > 0) {
        this.stats.sent += sent;
        done += sent;
        continue;
      }
      const errno = libc.errno();
      if (errno === EINTR) continue;
      if (errno === EAGAIN) {
        for (let k = done; k < m; k++) this.enqueue(queue, deferred.destinations[k]!, deferred.name(k).slice(), deferred.datagram(k));
        break;
      }
      if (deferred.sourced(done) && SOURCE_GONE.has(errno)) {
        // Its sticky source is gone: this message again, from an address the kernel picks.
        const to = deferred.destinations[done]!;
        if (to.local !== undefined) this.clearSource(to);
        deferred.unsource(done);
        continue;
      }
      this.stats.sendErrors++;
      done++;
    }
    deferred.destinations.fill(undefined, 0, m);
  }

  /** Queues a copy of a datagram behind the socket's earlier ones (the kernel's send buffer is full). */
  private enqueue(queue: SendQueue, to: Endpoint, name: Uint8Array, datagram: Uint8Array): void {
    if (queue.items.length - queue.head >= SEND_QUEUE_LIMIT) {
      this.stats.sendErrors++;
      return;
    }
    queue.items.push({ name, data: datagram.slice(), to });
    this.scheduleFlush(true);
  }

  private scheduleFlush(soon: boolean): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    if (soon) setImmediate(this.flush);
    else setTimeout(this.flush, 1);
  }

  /** Retries the queued datagrams in order, until the kernel says EAGAIN again. */
  private readonly flush = (): void => {
    this.flushScheduled = false;
    const s = this.session;
    if (!s) return this.dropQueued();
    let progress = false;
    let blocked = false;
    for (const [queue, fd] of [[this.queue4, s.fd4], [this.queue6, s.fd6]] as const) {
      while (!queue.empty && !blocked) {
        const sent = fd >= 0 ? this.sendQueued(fd, queue) : -EBADF;
        if (sent > 0) {
          this.stats.sent += sent;
          progress = true;
          for (let k = 0; k < sent; k++) queue.items[queue.head++] = undefined as unknown as QueuedDatagram;
        } else if (sent === -EAGAIN) {
          blocked = true;
        } else {
          // The first queued datagram cannot be sent (too large, or the socket refuses it): dropped.
          this.stats.sendErrors++;
          queue.items[queue.head++] = undefined as unknown as QueuedDatagram;
        }
      }
      if (queue.empty) {
        queue.items.length = 0;
        queue.head = 0;
      }
    }
    if (blocked) this.scheduleFlush(progress);
  };

  /**
   * Sends the datagrams at the head of `queue` with one sendmmsg (up to FLUSH_SLOTS): how many
   * left, or -errno when the first did not. A refused sticky source of the first is cleared and
   * the call made again, as in sendNow.
   */
  private sendQueued(fd: number, queue: SendQueue): number {
    const libc = this.libc!;
    const area = this.flushArea!;
    for (;;) {
      let n = 0;
      let firstSource: Uint8Array | undefined;
      while (n < area.slots && queue.head + n < queue.items.length) {
        const { name, data, to } = queue.items[queue.head + n];
        const source = this.sourceControlOf(to);
        if (!area.prepare(n, name, data, source)) break;
        if (n === 0) firstSource = source;
        n++;
      }
      if (n === 0) return -EMSGSIZE;
      const sent = libc.sendmmsg(fd, area.msgs, n, MSG_DONTWAIT);
      if (sent > 0) return sent;
      const errno = libc.errno();
      if (errno === EINTR) continue;
      if (firstSource !== undefined && SOURCE_GONE.has(errno)) {
        this.clearSource(queue.items[queue.head].to);
        continue;
      }
      return -errno;
    }
  }

  private dropQueued(): void {
    for (const queue of [this.queue4, this.queue6]) {
      this.stats.sendErrors += queue.items.length - queue.head;
      queue.items.length = 0;
      queue.head = 0;
    }
  }
}
