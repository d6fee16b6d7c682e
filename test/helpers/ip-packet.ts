/** Inner IPv4 packets for the tests: only what routing reads is real (version, length, addresses). */
import { parseIp } from '../../dataplane/net/ip.ts';

/** `size` bytes (at least 20) from `src` to `dst`, IP protocol 253, the payload a function of `seed`. */
export function ipv4Packet(src: string, dst: string, size = 28, seed = 0): Uint8Array {
  const p = new Uint8Array(size);
  p[0] = 0x45;
  p[2] = size >> 8;
  p[3] = size & 0xff;
  p[9] = 253; // "for experimentation"
  p.set(parseIp(src), 12);
  p.set(parseIp(dst), 16);
  for (let i = 20; i < size; i++) p[i] = (i * 13 + seed) & 0xff;
  return p;
}

/** `size` bytes from 10.0.0.1 (the outbound tests' own address) to `dst`. */
export function ipv4PacketTo(dst: string, size: number, seed: number): Uint8Array {
  return ipv4Packet('10.0.0.1', dst, size, seed);
}
