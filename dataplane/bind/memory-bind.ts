/**
 * An in-memory Bind for tests: `MemoryNetwork` connects binds by endpoint, delivering datagrams
 * on a later turn of the event loop like a real socket would.
 */
import { Endpoint } from '../net/endpoint.ts';
import type { Bind, BindStats } from './bind.ts';

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
  private handler: (datagram: Uint8Array, source: Endpoint) => void = () => {};
  private static nextPort = 40000;

  constructor(private readonly network: MemoryNetwork, readonly host: string) {}

  get endpoint(): Endpoint {
    return new Endpoint(this.host, this.port);
  }

  onReceive(handler: (datagram: Uint8Array, source: Endpoint) => void): void {
    this.handler = handler;
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
    setImmediate(() => target.deliver(copy, from));
  }

  private deliver(datagram: Uint8Array, from: Endpoint): void {
    if (this.port === 0) return;
    this.stats.received++;
    this.handler(datagram, from);
  }

  mark = 0;

  async setMark(mark: number): Promise<void> {
    this.mark = mark;
  }

  async close(): Promise<void> {
    if (this.port !== 0) this.network.binds.delete(this.endpoint.toString());
    this.port = 0;
  }
}
