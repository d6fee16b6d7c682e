/**
 * The TUN device as the daemon sees it: whole IP packets in and out, in batches, behind one narrow
 * interface. The Linux implementation (linux-tun.ts) and the in-memory double (memory-tun.ts)
 * behave the same, so the daemon is tested without a kernel device.
 *
 * This module is runtime-independent; `openTun` loads the Linux implementation lazily, which in
 * turn binds libc through koffi on Node or bun:ffi on Bun.
 */

import type { Liveness } from '../watchdog.ts';
import type { Endpoint } from '../net/endpoint.ts';
import type { SlotAead } from '../crypto/primitives.ts';
import type { SelectOptions } from '../crypto/select.ts';
import type { KeypairTable } from '../session/keypair-table.ts';
import type { PeerSendTable } from '../session/send-table.ts';
import type { SharedIndexMap } from '../session/shared-index-map.ts';
import type { RoutesFeed } from '../allowedips/published-routes.ts';
import type { ThreadSocketsFeed } from '../bind/bind.ts';

export interface TunStats {
  /** Packets delivered to the `start` handler. */
  readPackets: number;
  /** Packets handed to the kernel. */
  writePackets: number;
  /** Packets the kernel refused (bad packet, device down, EAGAIN) or that were empty. */
  writeErrors: number;
  /** Failed reads other than "nothing to read" and "device gone". */
  readErrors: number;
}

/** What another thread needs to write packets to the device itself (Tun.threadWriter). */
export interface TunThreadWriter {
  /** Descriptors of its own (dups), one per queue in queue order: the receiver closes them when done, whatever the Tun does meanwhile. */
  fds: number[];
  /** Each write starts with a virtio-net header (IFF_VNET_HDR). */
  vnetHeader: boolean;
  /** The TUN_F_* offloads the kernel accepted (0 = none): with TSO, TCP packets may be written coalesced. */
  offloads: number;
  /**
   * Per queue, in queue order, when the queues' threads seal and send: their rings, so that the
   * writing thread can read a queue's reply itself while the queue's thread sleeps (reply-reader.ts).
   */
  queues?: TunQueueRing[];
}

/** A TUN queue's ring (ring.ts: DEFAULT_SLOTS slots of SLOT_SIZE) and its sent-books table (sent-books.ts). */
export interface TunQueueRing {
  ring: SharedArrayBuffer;
  books: SharedArrayBuffer;
}

/**
 * What a Tun needs to seal and send the packets it reads itself, where a peer's send-table entry
 * allows (docs/data-workers.md step 3, session/transport-sealer.ts); the rest still goes to the
 * start() handler.
 */
export interface TunSending {
  keypairs: KeypairTable;
  /** Part of what a thread is handed of the sessions (shared-sessions.ts); the sender does not use it. */
  indices: SharedIndexMap;
  sendTable: PeerSendTable;
  routes: RoutesFeed;
  /** The MTU the padding is computed for (the device's when sending starts; later ones through sendingMtu). */
  mtu: number;
  /** The AEAD, for a Tun that seals on the calling thread (MemoryTun). */
  aead: SlotAead;
  /** How a Tun's own thread picks its AEAD (as `aead` was picked). */
  selection: Pick<SelectOptions, 'only' | 'libsodium'>;
  /** For a Tun whose own thread sends (LinuxTun): the UDP sockets, duplicated for it, now and after each change. */
  sockets?: ThreadSocketsFeed;
  /** For a Tun that sends on the calling thread (MemoryTun): how a sealed datagram leaves. */
  send?: (to: Endpoint, datagram: Uint8Array) => void;
}

/**
 * The books of what a Tun sealed itself, one call per run of one outcome to one peer (by number):
 * SEALED (sent), SOURCE_REFUSED (sent from an address the kernel picked: the sticky source is
 * gone) or ZERO_KEY_REFUSED (nothing sealed) from transport-sealer.ts / reader-sender.ts; the
 * datagrams and their bytes.
 */
export type SentHandler = (peer: number, outcome: number, datagrams: number, bytes: number) => void;

export interface Tun {
  /** The actual interface name (what the kernel picked when the requested name contained %d). */
  readonly name: string;
  /** The reader ring's stall watch (dataplane/watchdog.ts), where there is one. */
  readonly liveness?: Liveness;
  /** The interface's current MTU (as the kernel reports it, so also after `ip link set mtu`). */
  readonly mtu: number;
  /** Sets the interface MTU. Throws when the kernel refuses (e.g. out of range). */
  setMtu(mtu: number): void;
  /**
   * Starts reading; calls `onPackets` with a batch of whole IP packets. The views (and the array)
   * are valid only during the call and are reused afterwards: copy what must outlive it. Only the
   * first `count` entries are valid. May be called once.
   */
  start(onPackets: (packets: Uint8Array[], count: number) => void): void;
  /**
   * Optional, before start(): seal and send what it may itself (TunSending); `onSent` gets the
   * books of it, before the handler gets the packets of the same read.
   */
  sendOnThread?(sending: TunSending, onSent: SentHandler): void;
  /** With sendOnThread: the MTU the packets it seals are padded for, from now on (the device's changed). */
  sendingMtu?(mtu: number): void;
  /** True when the Tun's thread could not load an AEAD provider to seal with (the main thread then seals everything). */
  readonly senderFailed?: boolean;
  /**
   * Resolves once reading really runs after start() (a reader thread may still be starting; the
   * kernel queues what arrives meanwhile, up to the interface's txqueuelen).
   */
  ready?(): Promise<void>;
  /**
   * After close: settles once every reader thread has exited. A thread still starting when the
   * device closed is left to end by itself (terminating a worker while it loads koffi's native
   * addon aborts the process), so whoever exits the process waits for this first.
   */
  threadsEnded?(): Promise<void>;
  /**
   * Writes whole IP packets to the kernel (the first `count` entries of `packets`). Never throws
   * for a bad packet or a full queue: those are counted in `stats.writeErrors`. After close it
   * counts every packet as an error.
   */
  write(packets: Uint8Array[], count: number): void;
  /** Optional: descriptors and the write format for another thread that writes packets itself (undefined once closed). */
  threadWriter?(): TunThreadWriter | undefined;
  /**
   * `handler` runs once when the interface disappears (`ip link del`) or reading fails for good,
   * so the daemon can exit like wireguard-go. Not called for an explicit `close()`. A handler
   * registered after the fact runs on the next tick.
   */
  onClose(handler: () => void): void;
  /** Optional: packets each queue's reader took from the kernel, in queue order (LinuxTun). */
  readonly readPerQueue?: number[];
  /** Optional: reads of each queue by the UDP reader that brought a reply (LinuxTun; tun/reply-reader.ts). */
  readonly repliesReadPerQueue?: number[];
  /** Stops reading and releases the device (the interface goes away unless it is persistent). Idempotent. */
  close(): void;
  readonly stats: TunStats;
}

export interface OpenTunOptions {
  /** MTU to set right after creation. Default: leave the kernel's default (1500). */
  mtu?: number;
  /**
   * TCP segmentation and receive offloads through a vnet header (tun/offload.ts): the kernel hands
   * over TCP super-packets of up to 64 KiB, split into MTU-sized packets by the reader thread,
   * and written TCP segments are coalesced per flow. Default: on (the daemon passes
   * ROAMGUARD_TUN_OFFLOAD, dataplane/settings.ts).
   */
  offload?: boolean;
  /**
   * Queues (IFF_MULTI_QUEUE), each read, sealed and sent by its own thread; the kernel keeps a
   * flow on one. Default 1. A device that cannot be multi-queue gets one.
   */
  queues?: number;
}

/** Maximum interface name length (IFNAMSIZ - 1). */
export const MAX_INTERFACE_NAME = 15;

/** Checks a requested interface name; `%d` asks the kernel to pick a number. */
export function validateInterfaceName(name: string): void {
  if (typeof name !== 'string' || name.length === 0) throw new TypeError('interface name must be a non-empty string');
  if (Buffer.byteLength(name) > MAX_INTERFACE_NAME) throw new RangeError(`interface name ${JSON.stringify(name)} is longer than ${MAX_INTERFACE_NAME} bytes`);
  if (/[\s/:\0]/.test(name) || name === '.' || name === '..') throw new RangeError(`bad interface name ${JSON.stringify(name)}`);
}

/**
 * Creates (or attaches to) the TUN interface `name` in the network namespace this process runs
 * in. Linux only; needs CAP_NET_ADMIN.
 */
export async function openTun(name: string, options: OpenTunOptions = {}): Promise<Tun> {
  validateInterfaceName(name);
  if (process.platform !== 'linux') throw new Error(`TUN devices are implemented for Linux only (this is ${process.platform})`);
  const { LinuxTun } = await import('./linux-tun.ts');
  return LinuxTun.open(name, options);
}
