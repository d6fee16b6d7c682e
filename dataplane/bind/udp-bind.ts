/**
 * Bind over node:dgram: a udp4 socket and an IPv6-only udp6 socket on one port, as wireguard-go
 * does, so both families work whatever the host's dual-stack settings.
 */
import dgram from 'node:dgram';
import { Endpoint } from '../net/endpoint.ts';
import { setSocketMark } from '../sys/libc.ts';
import type { Bind, BindStats } from './bind.ts';

/** Socket buffers large enough to absorb bursts between event-loop turns (wireguard-go uses 7 MiB). */
const SOCKET_BUFFER_BYTES = 7 * 1024 * 1024;
/** Port 0: the v4 socket picks a port; if v6 cannot take the same one, try again this often. */
const PORT_PICK_ATTEMPTS = 100;
/** Received endpoints are parsed once and reused; the cache is dropped when it grows past this. */
const ENDPOINT_CACHE_LIMIT = 4096;

function bindSocket(socket: dgram.Socket, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (err: Error) => reject(err);
    socket.once('error', onError);
    socket.bind({ port, exclusive: true }, () => {
      socket.off('error', onError);
      resolve();
    });
  });
}

export class UdpBind implements Bind {
  port = 0;
  readonly stats: BindStats = { received: 0, sent: 0, sendErrors: 0 };
  private v4: dgram.Socket | undefined;
  private v6: dgram.Socket | undefined;
  private handler: (datagram: Uint8Array, source: Endpoint) => void = () => {};
  private readonly endpoints = new Map<string, Endpoint>();
  private mark = 0;

  onReceive(handler: (datagram: Uint8Array, source: Endpoint) => void): void {
    this.handler = handler;
  }

  async open(port: number): Promise<number> {
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`listen port must be 0..65535, got ${port}`);
    await this.close();
    for (let attempt = 0; ; attempt++) {
      const v4 = dgram.createSocket({ type: 'udp4', recvBufferSize: SOCKET_BUFFER_BYTES, sendBufferSize: SOCKET_BUFFER_BYTES });
      const v6 = dgram.createSocket({ type: 'udp6', ipv6Only: true, recvBufferSize: SOCKET_BUFFER_BYTES, sendBufferSize: SOCKET_BUFFER_BYTES });
      try {
        await bindSocket(v4, port);
        const chosen = v4.address().port;
        try {
          await bindSocket(v6, chosen);
        } catch (err) {
          // No IPv6 on this host is fine; a taken v6 port with port 0 means: pick again.
          if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE' && port === 0 && attempt < PORT_PICK_ATTEMPTS) {
            v4.close();
            continue;
          }
          if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE') throw err;
          v6.close();
          this.attach(v4, undefined, chosen);
          return chosen;
        }
        this.attach(v4, v6, chosen);
        return chosen;
      } catch (err) {
        try { v4.close(); } catch { /* not bound */ }
        try { v6.close(); } catch { /* not bound */ }
        throw err;
      }
    }
  }

  private attach(v4: dgram.Socket, v6: dgram.Socket | undefined, port: number): void {
    this.v4 = v4;
    this.v6 = v6;
    this.port = port;
    if (this.mark !== 0) void this.setMark(this.mark).catch(() => { this.stats.sendErrors++; });
    for (const socket of [v4, v6]) {
      if (!socket) continue;
      socket.on('message', (msg, rinfo) => {
        this.stats.received++;
        this.handler(msg, this.endpointFor(rinfo.address, rinfo.port));
      });
      // A send error on UDP (e.g. ICMP unreachable reported later) must not kill the daemon.
      socket.on('error', () => { this.stats.sendErrors++; });
    }
  }

  private endpointFor(address: string, port: number): Endpoint {
    const key = `${address}|${port}`;
    let endpoint = this.endpoints.get(key);
    if (!endpoint) {
      if (this.endpoints.size >= ENDPOINT_CACHE_LIMIT) this.endpoints.clear();
      endpoint = new Endpoint(address, port);
      this.endpoints.set(key, endpoint);
    }
    return endpoint;
  }

  send(to: Endpoint, datagram: Uint8Array): void {
    const socket = to.family === 4 ? this.v4 : this.v6;
    if (!socket) {
      this.stats.sendErrors++;
      return;
    }
    // dgram sends asynchronously and keeps a reference: hand it a copy, the caller reuses its buffer.
    socket.send(Buffer.from(datagram), to.port, to.host, (err) => {
      if (err) this.stats.sendErrors++;
    });
    this.stats.sent++;
  }

  /**
   * SO_MARK through libc (Node's dgram has no option for it). The socket's file descriptor is
   * read from its handle, which Node 20 and Bun both expose.
   */
  async setMark(mark: number): Promise<void> {
    this.mark = mark;
    for (const socket of [this.v4, this.v6]) {
      if (!socket) continue;
      const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
      if (typeof fd !== 'number' || fd < 0) throw new Error('cannot set fwmark: the socket has no file descriptor');
      await setSocketMark(fd, mark);
    }
  }

  async close(): Promise<void> {
    const sockets = [this.v4, this.v6].filter((s): s is dgram.Socket => s !== undefined);
    this.v4 = this.v6 = undefined;
    this.port = 0;
    await Promise.all(sockets.map((s) => new Promise<void>((resolve) => {
      try { s.close(() => resolve()); } catch { resolve(); }
    })));
  }
}
