/**
 * The Linux TUN device: /dev/net/tun with IFF_TUN | IFF_NO_PI (whole IP packets, no packet-info
 * header), libc reached through FFI (libc.ts: koffi on Node, bun:ffi on Bun).
 *
 * Queues. With `queues` above 1 the device is multi-queue (IFF_MULTI_QUEUE): one descriptor per
 * queue, each read by its own thread (tun-queue.ts), so that the packets the host sends are read,
 * sealed and sent on several cores. The kernel keeps a flow on one queue, and writes keep each
 * flow's two directions on the same one (flow-queue.ts). A device that cannot be multi-queue (a
 * persistent one made without it) is opened with one queue.
 *
 * Reading. Node cannot poll an arbitrary fd, and a blocking read through the libuv thread pool
 * costs one thread-pool round trip per packet and parks a pool thread (there are four). Instead a
 * dedicated worker thread per queue (reader-worker.ts) polls the non-blocking fd, reads each ready
 * packet straight into a slot of a SharedArrayBuffer ring (ring.ts), seals and sends what it may,
 * and wakes the main thread with Atomics.notify; the main thread waits with Atomics.waitAsync and
 * hands every ready slot to the handler as one batch, as views into the ring (no copy). Measured
 * figures and the alternatives that were compared are in bench/tun-micro.ts and
 * docs/performance.md. The same code runs on Bun (bun:ffi in both threads, Bun's worker_threads
 * and Atomics.waitAsync).
 *
 * Writing happens on the main thread and in the UDP reader thread (on its own dups), through the
 * queue of each packet's flow (tun-writer.ts). TUN writes never block (the packet is injected into
 * the stack at once); the fds are non-blocking anyway, and any error (EAGAIN, EINVAL for a
 * malformed packet, EIO while the link is down) only counts.
 *
 * Offloads (the default; `offload: false` turns them off). The device is
 * opened with IFF_VNET_HDR and TUNSETOFFLOAD(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6): the kernel's
 * TCP hands over super-packets of up to 64 KiB, which the reader splits into MTU-sized
 * segments (offload.ts) before the handler sees them, so the pipelines still get ordinary packets;
 * and write() coalesces the TCP segments of one call per flow into super-packets again (GRO), one
 * write(2) each. Measured with the bench suite (iperf3, one TCP stream): tunnel CPU per GB
 * 81-109 s -> 56-67 s with dgram UDP; the kernel's TCP on both ends does far less work too.
 *
 * Disappearance. `ip link del` detaches the fds: a reader's poll reports POLLERR and read fails
 * with EBADFD, so the reader reports DEVICE_GONE at once. As a fallback, every second the main
 * thread checks that /sys/class/net/NAME still exists and, when it does not (deleted, or renamed),
 * confirms with a zero-length write, which fails with EBADFD only on a detached fd. onClose
 * handlers run once.
 */
import { existsSync } from 'node:fs';
import {
  AF_INET, EBADFD, IFF_MULTI_QUEUE, IFF_NO_PI, IFF_TUN, IFF_VNET_HDR, IFNAMSIZ, IFREQ_SIZE,
  O_CLOEXEC, O_NONBLOCK, O_RDWR, SIOCGIFMTU, SIOCSIFMTU, SOCK_CLOEXEC, SOCK_DGRAM, TUNSETIFF, TUNSETOFFLOAD, TUN_F_CSUM, TUN_F_TSO4,
  TUN_F_TSO6, cString, errnoError, loadLibc, type Libc,
} from '../sys/libc.ts';
import { TunPacketWriter } from './tun-writer.ts';
import { TunQueue, type QueueOptions, type QueueOwner } from './tun-queue.ts';
import type { Liveness, StallHandler } from '../watchdog.ts';
import type { OpenTunOptions, SentHandler, Tun, TunSending, TunStats, TunThreadWriter } from './tun.ts';

/** How often the fallback existence check runs. */
const WATCH_INTERVAL_MS = 1000;
/** How long ready() waits for the reader threads (tsx compiles their modules first under Node). */
const READY_TIMEOUT_MS = 30_000;

class LinuxTunStats implements TunStats {
  readPackets = 0;
  writePackets = 0;
  writeErrors = 0;
  readonly #queues: readonly TunQueue[];
  constructor(queues: readonly TunQueue[]) {
    this.#queues = queues;
  }
  get readErrors(): number {
    let sum = 0;
    for (const q of this.#queues) sum += q.readErrors;
    return sum;
  }
  /** Datagrams the readers sealed that the kernel refused or had no room for. */
  get sendErrors(): number {
    let sum = 0;
    for (const q of this.#queues) sum += q.sendErrors;
    return sum;
  }
}

/**
 * Attaches `fd` to the interface `name` with `flags`; returns the ifreq (with the name the kernel
 * gave) or undefined when the kernel refused.
 */
function attach(libc: Libc, fd: number, name: string, flags: number): Uint8Array | undefined {
  const ifr = ifreq(name);
  new Uint16Array(ifr.buffer, 16, 1)[0] = flags;
  return libc.ioctl(fd, TUNSETIFF, ifr) < 0 ? undefined : ifr;
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

export class LinuxTun implements Tun, Liveness, QueueOwner {
  readonly stats: LinuxTunStats;
  onStall: StallHandler | undefined = undefined;
  /** Why the device closed by itself (device deleted, reader failure); undefined otherwise. */
  closeReason: Error | undefined;

  /** One per queue of the device, in queue order. */
  private readonly queues: TunQueue[];
  private readonly closeHandlers: Array<() => void> = [];
  private readonly probe = new Uint8Array(1);
  /** The main thread's writes (with their own scratch buffers). */
  private readonly writer: TunPacketWriter;
  private handler: ((packets: Uint8Array[], count: number) => void) | undefined;
  /** With sendOnThread: what the readers get to send, and the books' handler. */
  private sending: TunSending | undefined;
  onSent: SentHandler | undefined;
  private closed = false;
  private gone_ = false;
  private lastMtu: number;
  private watchTimer: ReturnType<typeof setInterval> | undefined;
  private readonly sysfsPath: string;
  private sysfsUsable: boolean;

  private constructor(
    private readonly libc: Libc,
    /** One descriptor per queue, in queue order. */
    private readonly fds: readonly number[],
    private readonly ctlFd: number,
    readonly name: string,
    /** The fds carry a vnet header (IFF_VNET_HDR); offloads are on when `offloads` is not 0. */
    readonly vnetHeader: boolean,
    /** The TUN_F_* offloads the kernel accepted (0 = none). */
    readonly offloads: number,
    queueOptions: QueueOptions = {},
  ) {
    this.queues = fds.map((fd, i) => new TunQueue(libc, fd, i, this, queueOptions));
    this.writer = new TunPacketWriter(libc, fds, vnetHeader, offloads);
    this.stats = new LinuxTunStats(this.queues);
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
    const wantedQueues = Math.max(1, Math.floor(options.queues ?? 1));
    const fd = libc.open(cString('/dev/net/tun'), O_RDWR | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0) throw errnoError('open(/dev/net/tun)', libc.errno());
    const fds = [fd];
    let ctlFd = -1;
    let vnetHeader = false;
    let offloads = 0;
    let actual: string;
    try {
      // The first attach that the kernel takes, best first: a persistent device made without
      // IFF_VNET_HDR, or without IFF_MULTI_QUEUE, takes only what it was made with.
      const tries: Array<{ vnet: boolean; multi: boolean }> = [];
      for (const vnet of options.offload ?? true ? [true, false] : [false]) {
        if (wantedQueues > 1) tries.push({ vnet, multi: true });
        tries.push({ vnet, multi: false });
      }
      let ifr: Uint8Array | undefined;
      let flags = 0;
      for (const t of tries) {
        flags = IFF_TUN | IFF_NO_PI | (t.vnet ? IFF_VNET_HDR : 0) | (t.multi ? IFF_MULTI_QUEUE : 0);
        ifr = attach(libc, fd, name, flags);
        if (ifr !== undefined) {
          vnetHeader = t.vnet;
          break;
        }
      }
      if (ifr === undefined) throw errnoError('ioctl(TUNSETIFF)', libc.errno(), name);
      actual = readName(ifr);
      if ((flags & IFF_MULTI_QUEUE) !== 0) {
        // The other queues: the same interface, the same flags. One the kernel refuses ends the list.
        while (fds.length < wantedQueues) {
          const more = libc.open(cString('/dev/net/tun'), O_RDWR | O_CLOEXEC | O_NONBLOCK, 0);
          if (more < 0) break;
          if (attach(libc, more, actual, flags) === undefined) {
            libc.close(more);
            break;
          }
          fds.push(more);
        }
      }
      if (vnetHeader) {
        const wanted = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
        // Without them (an old kernel) the vnet header stays, with every packet whole (GSO_NONE).
        if (libc.ioctlValue(fd, TUNSETOFFLOAD, wanted) === 0) offloads = wanted;
        else if (libc.ioctlValue(fd, TUNSETOFFLOAD, TUN_F_CSUM) === 0) offloads = TUN_F_CSUM;
      }
      ctlFd = libc.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (ctlFd < 0) throw errnoError('socket(AF_INET, SOCK_DGRAM)', libc.errno());
    } catch (err) {
      for (const f of fds) libc.close(f);
      throw err;
    }
    // From here on the object owns the descriptors; close() releases them.
    const tun = new LinuxTun(libc, fds, ctlFd, actual, vnetHeader, offloads);
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
  static async overDescriptorForTests(fd: number, options: QueueOptions = {}): Promise<LinuxTun> {
    const libc = await loadLibc();
    const tun = new LinuxTun(libc, [fd], -1, 'test-descriptor', false, 0, options);
    if (tun.watchTimer) clearInterval(tun.watchTimer); // no interface to watch
    tun.watchTimer = undefined;
    return tun;
  }

  /** How many queues (reader threads) the device has. */
  get queueCount(): number {
    return this.queues.length;
  }

  /** Packets each queue's reader handed over so far (sealed and sent, or left), in queue order. */
  get readPerQueue(): number[] {
    return this.queues.map((q) => q.read);
  }

  /** Reads of each queue by the UDP reader that brought a reply (tun/reply-reader.ts), in queue order. */
  get repliesReadPerQueue(): number[] {
    return this.queues.map((q) => q.repliesRead);
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
    if (this.handler) throw new Error(`${this.name}: sendOnThread() after start()`);
    this.sending = sending;
    this.onSent = onSent;
  }

  sendingMtu(mtu: number): void {
    for (const queue of this.queues) queue.sendingMtu(mtu);
  }

  /** Whether a reader thread could not load an AEAD provider (it then seals nothing: the main thread does). */
  get senderFailed(): boolean {
    return this.queues.some((q) => q.senderFailed);
  }

  start(onPackets: (packets: Uint8Array[], count: number) => void): void {
    if (this.handler) throw new Error(`${this.name}: start() was already called`);
    if (this.closed) throw new Error(`${this.name}: device is closed`);
    this.handler = onPackets;
    for (const queue of this.queues) queue.start(this.vnetHeader, this.sending);
  }

  /** See Tun.ready: waits (at most 30 s) for the reader threads to begin. */
  async ready(): Promise<void> {
    const deadline = performance.now() + READY_TIMEOUT_MS;
    for (const queue of this.queues) await queue.ready(deadline, READY_TIMEOUT_MS);
  }

  /** See Tun.threadsEnded: every queue's reader thread has exited. */
  async threadsEnded(): Promise<void> {
    await Promise.all(this.queues.map((queue) => queue.ended));
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
    if (this.gone_) {
      setTimeout(handler, 0);
      return;
    }
    this.closeHandlers.push(handler);
  }

  /** Dups of the device's descriptors, one per queue, for another thread's writes (its owner closes them), and the write format. */
  threadWriter(): TunThreadWriter | undefined {
    if (this.closed) return undefined;
    const fds: number[] = [];
    for (const fd of this.fds) {
      const copy = this.libc.dup(fd);
      if (copy < 0) {
        for (const f of fds) this.libc.close(f);
        return undefined;
      }
      fds.push(copy);
    }
    // The queues' rings when their threads seal and send (the readers may not run yet: the
    // other thread looks at each ring's state before it reads a queue).
    const queues = this.sending !== undefined ? this.queues.map((q) => q.shared) : undefined;
    return { fds, vnetHeader: this.vnetHeader, offloads: this.offloads, queues };
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.watchTimer) clearInterval(this.watchTimer);
    this.watchTimer = undefined;
    // Every reader stops before any descriptor closes (a number could be reused under a reader).
    for (const queue of this.queues) queue.stop();
    for (const fd of this.fds) this.libc.close(fd);
    if (this.ctlFd >= 0) this.libc.close(this.ctlFd);
  }

  // --- the queues' reports (QueueOwner) ---------------------------------------------------------------

  onPackets(packets: Uint8Array[], count: number): void {
    this.handler!(packets, count);
  }

  countRead(packets: number): void {
    this.stats.readPackets += packets;
  }

  gone(reason: Error): void {
    if (this.closed) return;
    this.deviceGone(reason);
  }

  // --- liveness: the worst of the queues' rings ------------------------------------------------------

  get liveness(): Liveness | undefined {
    return this;
  }

  get stalls(): number {
    let sum = 0;
    for (const q of this.queues) sum += q.stalls;
    return sum;
  }

  get stalledMs(): number {
    let worst = 0;
    for (const q of this.queues) worst = Math.max(worst, q.stalledMs);
    return worst;
  }

  // --- disappearance ---------------------------------------------------------------------------------

  private watch(): void {
    if (this.closed) return;
    if (this.sysfsUsable && existsSync(this.sysfsPath)) return;
    // Missing from sysfs (deleted, or renamed), or sysfs not usable: ask the fd itself. A
    // zero-length write fails with EBADFD only when the device is detached.
    if (this.libc.write(this.fds[0], this.probe, 0) < 0 && this.libc.errno() === EBADFD) {
      this.deviceGone(new Error(`${this.name}: interface deleted`));
    }
  }

  private deviceGone(reason: Error): void {
    if (this.gone_) return;
    this.gone_ = true;
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
