/**
 * The UDP side of the device, behind a narrow interface (wireguard-go calls it a "bind"):
 * one IPv4 and one IPv6 socket on the same port, datagrams in and out with their endpoints.
 * `FfiUdpBind` (ffi-udp-bind.ts, the daemon's) owns its sockets through FFI and batches system
 * calls (sendmmsg/recvmmsg); `MemoryBind` (memory-bind.ts) is the test double.
 */
import type { Endpoint } from '../net/endpoint.ts';
import type { Liveness } from '../watchdog.ts';
import type { SlotAead } from '../crypto/primitives.ts';
import type { SelectOptions } from '../crypto/select.ts';
import type { KeypairTable } from '../session/keypair-table.ts';
import type { SharedIndexMap } from '../session/shared-index-map.ts';
import type { PeerSendTable } from '../session/send-table.ts';
import type { OpenedTransport } from '../session/transport-opener.ts';
import type { RoutesFeed } from '../allowedips/published-routes.ts';
import type { TunThreadWriter } from '../tun/tun.ts';

/**
 * What a bind needs to open transport messages before the handler sees them
 * (session/transport-opener.ts): the device's shared session state and its AEAD.
 */
export interface TransportOpening {
  keypairs: KeypairTable;
  indices: SharedIndexMap;
  /** The AEAD, for a bind that opens on the calling thread (MemoryBind). */
  aead: SlotAead;
  /** How a bind's own thread picks its AEAD (as `aead` was picked: ROAMGUARD_CRYPTO, ROAMGUARD_LIBSODIUM). */
  selection: Pick<SelectOptions, 'only' | 'libsodium'>;
  /**
   * To deliver what it opens itself (docs/data-workers.md step 2b): the published allowed-IPs
   * table, and where packets go: `deliver` for a bind that delivers on the calling thread
   * (MemoryBind), `tunWriter` for one whose own thread writes to the TUN (FfiUdpBind; called once
   * per reader thread, which owns the descriptor it returns).
   */
  routes?: RoutesFeed;
  /**
   * Where a thread that sends reads each peer's endpoint (send-table.ts): a bind's reader that
   * delivers a datagram from elsewhere wakes the main thread at once, so that it moves the
   * endpoint before more is sent to the old one.
   */
  sendTable?: PeerSendTable;
  deliver?: (packets: Uint8Array[], count: number) => void;
  tunWriter?: () => TunThreadWriter | undefined;
}

/**
 * Gets each received datagram (valid only during the call) with its source, and what the bind's
 * opener did to it (`opened.outcome`: NOT_OPENED unless the bind opens, see TransportOpening).
 * `opened` is reused for the next datagram.
 */
export type ReceiveHandler = (datagram: Uint8Array, source: Endpoint, opened: OpenedTransport) => void;

/** Brackets each run of datagrams the bind hands over: what the handler produced is flushed at `end`. */
export interface DeliveryBracket {
  begin(): void;
  end(): void;
}

/** The bind's UDP sockets, duplicated for another thread that sends (it closes them when done). */
export interface ThreadSockets {
  /** -1 when that family has no socket. */
  fd4: number;
  fd6: number;
  /** Whether UDP GSO is worth trying on them. */
  gso: boolean;
}

/** The current ThreadSockets (fresh duplicates each call; undefined while closed), and each new set after a reopen. */
export interface ThreadSocketsFeed {
  current(): ThreadSockets | undefined;
  onChange(listener: () => void): () => void;
}

export interface BindStats {
  received: number;
  sent: number;
  sendErrors: number;
}

export interface Bind {
  /** The bound port (0 while closed). */
  readonly port: number;
  /** Binds both families to `port` (0 = pick one free for both). Rejects with code EADDRINUSE when taken. */
  open(port: number): Promise<number>;
  /** Sends a datagram; the bytes may be reused by the caller as soon as this returns. */
  send(to: Endpoint, datagram: Uint8Array): void;
  /**
   * Optional batched send: `count` datagrams to one endpoint, in this order, with as few system
   * calls as the bind can manage (FfiUdpBind: one sendmmsg). Datagram i is `lengths[i]` bytes at
   * byte offset `i * stride` of `data`; entries with a length <= 0 are skipped. This is the layout
   * of a PacketBatch: `sendBatch(to, batch.data, batch.slotSize, batch.lengths, batch.count)`.
   * When `data` is a view of a SharedArrayBuffer the kernel reads the datagrams in place, without
   * a copy. As with send, the bytes may be reused by the caller as soon as this returns.
   */
  sendBatch?(to: Endpoint, data: Uint8Array, stride: number, lengths: ArrayLike<number>, count: number): void;
  /**
   * Sets the handler of received datagrams; `delivery`, when given, brackets each run of them
   * (the datagrams' bytes stay valid until its `end`).
   */
  onReceive(handler: ReceiveHandler, delivery?: DeliveryBracket): void;
  /**
   * Optional: from now on, opens transport messages of the sessions in `opening` before the
   * handler sees them (FfiUdpBind: in its reader thread; MemoryBind: as a datagram arrives).
   */
  openTransport?(opening: TransportOpening): void;
  /**
   * Optional: hands the handler, now, what the bind has received and not handed over yet
   * (FfiUdpBind: what its reader published without waking the main thread, the books of packets
   * it delivered itself). The device calls it before sending, so that a reply never leaves
   * before the books of what it answers are kept (a roamed peer's new endpoint, above all).
   */
  takeReceived?(): void;
  /**
   * Optional: true once the bind, asked to openTransport, could not (FfiUdpBind: a reader thread
   * that could not load an AEAD provider). Everything stays correct, the main thread opening what
   * the bind leaves, but every packet then costs the main thread.
   */
  readonly openerFailed?: boolean;
  /**
   * Optional: the handler learns of datagrams the kernel dropped before the bind could receive
   * them (a full socket receive queue), `dropped` more each call (FfiUdpBind: SO_RXQ_OVFL).
   */
  onKernelDrops?(handler: (dropped: number) => void): void;
  /**
   * Optional: before each delivery of received datagrams, the handler learns how many were
   * waiting and how many the bind holds (FfiUdpBind: its receive ring; when it is full, the
   * kernel queues the rest, and drops once its queue is full too).
   */
  onBacklog?(handler: (pending: number, capacity: number) => void): void;

  /** Sets the firewall mark (SO_MARK) on outgoing datagrams; 0 clears it. Rejects when the kernel refuses. */
  setMark(mark: number): Promise<void>;
  /** Resolves once receiving really runs (a reader thread may still be starting after open). */
  ready?(): Promise<void>;
  /** Optional: its sockets for another thread that sends (a TUN reader that seals: TunSending). */
  readonly threadSockets?: ThreadSocketsFeed;
  close(): Promise<void>;
  readonly stats: BindStats;
  /** The receive ring's stall watch (dataplane/watchdog.ts), where there is one. */
  readonly liveness?: Liveness;
}
