/**
 * A UDP endpoint (address and port) as WireGuard writes it: `ip:port` or `[ipv6]:port`.
 * Only numeric addresses: `wg` resolves names itself before it talks to the control socket.
 */
import { formatIp, parseIp, type IpFamily } from './ip.ts';

export class Endpoint {
  /** The address in canonical text form (IPv6 compressed, lowercase). */
  readonly host: string;
  readonly port: number;
  /** The address as 4 or 16 bytes (used for cookies and rate limiting). */
  readonly addressBytes: Uint8Array;
  readonly family: IpFamily;

  constructor(host: string, port: number) {
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`bad UDP port: ${port}`);
    this.addressBytes = parseIp(host);
    this.host = formatIp(this.addressBytes);
    this.family = this.addressBytes.length === 4 ? 4 : 6;
    this.port = port;
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

  /** A key for maps: equal endpoints give equal keys. */
  get key(): string { return this.toString(); }

  equals(other: Endpoint | undefined): boolean {
    return other !== undefined && other.port === this.port && other.host === this.host;
  }

  toString(): string {
    return this.family === 4 ? `${this.host}:${this.port}` : `[${this.host}]:${this.port}`;
  }
}
