/** An inner IPv4 packet for the outbound tests: only what routing reads is real (version, length, addresses). */
import { parseIp } from '../../dataplane/net/ip.ts';

/** `size` bytes (at least 20) from 10.0.0.1 to `dst`, IP protocol 253, the payload a function of `seed`. */
export function ipv4PacketTo(dst: string, size: number, seed: number): Uint8Array {
  const p = new Uint8Array(size);
  p[0] = 0x45;
  p[2] = size >> 8;
  p[3] = size & 0xff;
  p[9] = 253; // "for experimentation"
  p.set([10, 0, 0, 1], 12);
  p.set(parseIp(dst), 16);
  for (let i = 20; i < size; i++) p[i] = (i * 13 + seed) & 0xff;
  return p;
}
