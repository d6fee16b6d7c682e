/**
 * The relay's sockets: one UDP socket per allocated port, each datagram handed to the
 * RelayForwardCore and sent on as it says. Userspace only (nftables stays for masquerade and
 * filter); bounded: a socket whose send queue is full drops (counted), never buffers without end.
 *
 * The relay reads only the first four bytes of a datagram (its WireGuard message type); the
 * payload is end-to-end encrypted between the pair and passes through as it came. Nothing here
 * touches the relay node's own tunnel: relayed traffic never appears on its TUN.
 */
import dgram from 'node:dgram';
import { RelayForwardCore, type PairConfig, type PairCounters } from './forward-core.ts';

/** Datagrams waiting in one socket's send queue before further ones are dropped. */
export const SEND_QUEUE_LIMIT = 4096;

export interface RelayForwarderOptions {
  /** Address to bind the relay ports on ('::' for both families). */
  bindAddress?: string;
  /** Bytes per second per pair; 0 = unlimited. */
  bytesPerSecond: number;
  onError?: (port: number, err: Error) => void;
}

export class RelayForwarder {
  private readonly core: RelayForwardCore;
  private readonly sockets = new Map<number, dgram.Socket>();
  /** Ports that could not be bound (in use by something else): the allocation avoids them. */
  readonly unusable = new Set<number>();
  /** A dual-stack socket (bound to an IPv6 address, '::' by default) or an IPv4 one. */
  private readonly v6: boolean;

  constructor(private readonly options: RelayForwarderOptions) {
    this.core = new RelayForwardCore({ bytesPerSecond: options.bytesPerSecond, nowMs: () => performance.now() });
    this.v6 = (options.bindAddress ?? '::').includes(':');
  }

  /** Opens the sockets of new pairs, closes those of pairs that went, and hands the set to the core. */
  async setPairs(configs: readonly PairConfig[]): Promise<PairConfig[]> {
    const wanted = new Set(configs.flatMap((c) => [...c.ports]));
    for (const [port, socket] of this.sockets) {
      if (!wanted.has(port)) {
        socket.close();
        this.sockets.delete(port);
      }
    }
    const ready: PairConfig[] = [];
    for (const config of configs) {
      let ok = true;
      for (const port of config.ports) if (!this.sockets.has(port)) ok = (await this.open(port)) && ok;
      if (ok) ready.push(config);
    }
    this.core.setPairs(ready);
    return ready;
  }

  counters(): Map<string, PairCounters> {
    return this.core.counters();
  }

  learned(id: string) {
    return this.core.learned(id);
  }

  close(): void {
    for (const socket of this.sockets.values()) socket.close();
    this.sockets.clear();
    this.core.setPairs([]);
  }

  private open(port: number): Promise<boolean> {
    return new Promise((resolve) => {
      const socket = this.v6 ? dgram.createSocket({ type: 'udp6', ipv6Only: false }) : dgram.createSocket({ type: 'udp4' });
      const failed = (err: Error) => {
        socket.close();
        this.unusable.add(port);
        this.options.onError?.(port, err);
        resolve(false);
      };
      socket.once('error', failed);
      socket.bind(port, this.options.bindAddress ?? '::', () => {
        socket.off('error', failed);
        socket.on('error', (err) => this.options.onError?.(port, err));
        socket.on('message', (msg, rinfo) => this.onMessage(port, msg, rinfo));
        this.sockets.set(port, socket);
        resolve(true);
      });
    });
  }

  private onMessage(port: number, msg: Buffer, rinfo: dgram.RemoteInfo): void {
    // An IPv4 peer on a dual-stack socket shows as ::ffff:a.b.c.d.
    const host = rinfo.address.startsWith('::ffff:') ? rinfo.address.slice(7) : rinfo.address;
    const decision = this.core.onDatagram(port, host, rinfo.port, msg.subarray(0, 4), msg.length);
    if (decision.action !== 'forward') return;
    const out = this.sockets.get(decision.fromPort);
    if (!out || out.getSendQueueCount() >= SEND_QUEUE_LIMIT) {
      this.core.sendFailed(port);
      return;
    }
    const to = this.v6 && !decision.toHost.includes(':') ? `::ffff:${decision.toHost}` : decision.toHost;
    out.send(msg, decision.toPort, to, (err) => { if (err) this.core.sendFailed(port); });
  }
}
