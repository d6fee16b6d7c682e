/**
 * An in-memory Bind for tests: `MemoryNetwork` connects binds by endpoint, delivering datagrams
 * on a later turn of the event loop like a real socket would.
 *
 * With openTransport, a bind opens transport messages as they arrive, the moment they are put on
 * the network, and hands them to its handler on a later turn, as FfiUdpBind's reader thread opens
 * them on receipt and the main thread handles them later: the same opener
 * (session/transport-opener.ts), and the same window in which the session may change between
 * the two.
 */
import { Endpoint } from '../net/endpoint.ts';
import type { Bind, BindStats, DeliveryBracket, ReceiveHandler, TransportOpening } from './bind.ts';
import { NOT_OPENED, RECORD_INTS, TransportOpener, readRecord, type OpenedTransport } from '../session/transport-opener.ts';
import { SharedSessionsView, shareSessions, type SharedSessionsMessage } from '../session/shared-sessions.ts';

export class MemoryNetwork {
  readonly binds = new Map<string, MemoryBind>();
  /** Return false to drop a datagram in flight (loss, partitions). */
  filter: (from: Endpoint, to: Endpoint, datagram: Uint8Array) => boolean = () => true;

  bind(host: string): MemoryBind {
    return new MemoryBind(this, host);
  }
}

export class MemoryBind implements Bind {
  port = 0;
  readonly stats: BindStats = { received: 0, sent: 0, sendErrors: 0 };
  private handler: ReceiveHandler = () => {};
  private delivery: DeliveryBracket | undefined;
  private opener: TransportOpener | undefined;
  private stopSharing: (() => void) | undefined;
  private readonly record: OpenedTransport = { outcome: NOT_OPENED, length: 0, slot: 0, generation: 0 };
  private static nextPort = 40000;

  constructor(private readonly network: MemoryNetwork, readonly host: string) {}

  get endpoint(): Endpoint {
    return new Endpoint(this.host, this.port);
  }

  onReceive(handler: ReceiveHandler, delivery?: DeliveryBracket): void {
    this.handler = handler;
    this.delivery = delivery;
  }

  openTransport(opening: TransportOpening): void {
    this.stopSharing?.();
    const posted: SharedSessionsMessage[] = [];
    const shared = shareSessions(opening.keypairs, opening.indices, opening.routes, (message) => posted.push(message));
    const sessions = new SharedSessionsView(shared.init, () => posted.shift());
    const deliver = opening.deliver;
    const delivery = deliver && opening.routes ? { routes: () => sessions.routes(), write: deliver } : undefined;
    this.opener = new TransportOpener(opening.aead, sessions.chunkAt, sessions.indices, delivery);
    this.stopSharing = shared.stop;
  }

  /** The opener's counts (datagrams opened, failed, left to the handler; of the opened, delivered by the bind), for tests. */
  get openerCounts(): { opened: number; failed: number; left: number; delivered: number } | undefined {
    const o = this.opener;
    return o && { opened: o.opened, failed: o.failed, left: o.left, delivered: o.delivered };
  }

  async open(port: number): Promise<number> {
    const chosen = port === 0 ? MemoryBind.nextPort++ : port;
    const key = new Endpoint(this.host, chosen).toString();
    const holder = this.network.binds.get(key);
    if (holder && holder !== this) throw Object.assign(new Error(`address in use: ${key}`), { code: 'EADDRINUSE' });
    await this.close();
    this.port = chosen;
    this.network.binds.set(key, this);
    return chosen;
  }

  send(to: Endpoint, datagram: Uint8Array): void {
    const from = this.endpoint;
    const target = this.network.binds.get(to.toString());
    const copy = Uint8Array.from(datagram);
    this.stats.sent++;
    if (!target || !this.network.filter(from, to, copy)) return;
    target.arrive(copy, from);
  }

  /**
   * A datagram arriving from `from` (a copy is taken), as if it came over the network: opened now
   * when this bind opens, handed to the handler on a later turn. For tests that play the wire.
   */
  receiveFrom(datagram: Uint8Array, from: Endpoint): void {
    this.arrive(datagram, from);
  }

  /** The receiver's own copy: opening in place must not change what the sender or the wire (filter) kept. */
  private arrive(datagram: Uint8Array, from: Endpoint): void {
    const own = Uint8Array.from(datagram);
    const opened = this.openOnArrival(own);
    setImmediate(() => this.deliver(own, from, opened));
  }

  /** The opener's records for `datagram` (opened in place), or undefined when this bind does not open. */
  private openOnArrival(datagram: Uint8Array): { records: Int32Array; written: number } | undefined {
    if (this.opener === undefined || this.port === 0) return undefined;
    const records = new Int32Array(RECORD_INTS);
    const written = this.opener.openMessage(datagram, 0, datagram.length, datagram.length, records, 0);
    this.opener.flush(); // what it delivered reaches the TUN now, as the reader thread writes it before the main thread hears of it
    return { records, written };
  }

  private deliver(datagram: Uint8Array, from: Endpoint, opened: { records: Int32Array; written: number } | undefined): void {
    if (this.port === 0) return;
    this.stats.received++;
    const record = opened ? readRecord(opened.records, 0, 0, opened.written, this.record) : Object.assign(this.record, { outcome: NOT_OPENED });
    this.delivery?.begin();
    try {
      this.handler(datagram, from, record);
    } finally {
      this.delivery?.end();
    }
  }

  mark = 0;

  async setMark(mark: number): Promise<void> {
    this.mark = mark;
  }

  async close(): Promise<void> {
    if (this.port !== 0) this.network.binds.delete(this.endpoint.toString());
    this.port = 0;
    // The opener stays: a reopened bind (a new listen port) opens as before.
  }
}
