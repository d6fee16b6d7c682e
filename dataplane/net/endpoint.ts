/**
 * A UDP endpoint (address and port) as WireGuard writes it: `ip:port` or `[ipv6]:port`.
 * Only numeric addresses: `wg` resolves names itself before it talks to the control socket.
 *
 * An endpoint learnt from a received datagram may also carry the local address that datagram
 * arrived on (its LocalSource, from IP_PKTINFO / IPV6_PKTINFO): the bind sends to this endpoint
 * from that address ("sticky" source, as WireGuard does), so a node with several addresses
 * answers from the one its peer talks to. It is not part of the endpoint's identity or text form.
 */
import { formatIp, parseIp, type IpFamily } from './ip.ts';

/** One of our own addresses, as the kernel reported it for a received datagram. */
export class LocalSource {
  /** 4 or 16 bytes. */
  readonly address: Uint8Array;

  constructor(address: Uint8Array, readonly ifindex: number) {
    if (address.length !== 4 && address.length !== 16) throw new Error(`bad local address: ${address.length} bytes`);
    this.address = Uint8Array.from(address);
  }

  toString(): string {
    return `${formatIp(this.address)}%${this.ifindex}`;
  }
}

export class Endpoint {
  /** The address in canonical text form (IPv6 compressed, lowercase). */
  readonly host: string;
  readonly port: number;
  /** The address as 4 or 16 bytes (used for cookies and rate limiting). */
  readonly addressBytes: Uint8Array;
  readonly family: IpFamily;
  /**
   * The local address to send from (see the file comment); undefined: the kernel picks one (a
   * configured endpoint, a bind without that information, or a source that went away: the bind
   * clears it when the kernel refuses to send from it, as when the address has been removed).
   */
  local: LocalSource | undefined;

  constructor(host: string, port: number, local?: LocalSource) {
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`bad UDP port: ${port}`);
    this.addressBytes = parseIp(host);
    this.host = formatIp(this.addressBytes);
    this.family = this.addressBytes.length === 4 ? 4 : 6;
    this.port = port;
    if (local !== undefined && local.address.length !== this.addressBytes.length) {
      throw new Error(`local address ${local} is not of the family of ${host}`);
    }
    this.local = local;
  }

  /** Parses `1.2.3.4:51820` or `[fd00::1]:51820`; throws a descriptive error otherwise. */
  static parse(text: string): Endpoint {
    let host: string, port: string;
    if (text.startsWith('[')) {
      const close = text.indexOf(']:');
      if (close < 0) throw new Error(`bad endpoint ${JSON.stringify(text)}: expected [ipv6]:port`);
      host = text.slice(1, close);
      port = text.slice(close + 2);
    } else {
      const colon = text.lastIndexOf(':');
      if (colon < 0 || text.indexOf(':') !== colon) throw new Error(`bad endpoint ${JSON.stringify(text)}: expected ip:port`);
      host = text.slice(0, colon);
      port = text.slice(colon + 1);
    }
    if (!/^\d{1,5}$/.test(port)) throw new Error(`bad endpoint ${JSON.stringify(text)}: port is not a number`);
    try {
      return new Endpoint(host, Number(port));
    } catch (err) {
      throw new Error(`bad endpoint ${JSON.stringify(text)}: ${(err as Error).message}`);
    }
  }

  /** A key for maps: equal endpoints give equal keys (the local source does not count). */
  get key(): string { return this.toString(); }

  equals(other: Endpoint | undefined): boolean {
    return other !== undefined && other.port === this.port && other.host === this.host;
  }

  toString(): string {
    return this.family === 4 ? `${this.host}:${this.port}` : `[${this.host}]:${this.port}`;
  }
}
