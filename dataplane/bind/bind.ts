/**
 * The UDP side of the device, behind a narrow interface (wireguard-go calls it a "bind"):
 * one IPv4 and one IPv6 socket on the same port, datagrams in and out with their endpoints.
 * `UdpBind` uses node:dgram (Node and Bun); `MemoryBind` (memory-bind.ts) is the test double.
 */
import type { Endpoint } from '../net/endpoint.ts';

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
  /** The handler gets each datagram (valid only during the call) with its source. */
  onReceive(handler: (datagram: Uint8Array, source: Endpoint) => void): void;
  /** Sets the firewall mark (SO_MARK) on outgoing datagrams; 0 clears it. Rejects when the kernel refuses. */
  setMark(mark: number): Promise<void>;
  close(): Promise<void>;
  readonly stats: BindStats;
}
