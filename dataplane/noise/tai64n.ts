/**
 * TAI64N timestamps carried (encrypted) in handshake initiations; the responder accepts an
 * initiation only when its timestamp is strictly newer than the last one from that peer.
 *
 * Layout: big-endian u64 seconds + 2^62 + 10, then big-endian u32 nanoseconds. Like the kernel
 * and wireguard-go we clear the low 24 bits of the nanoseconds ("whitening", ~16.8 ms steps) so
 * the timestamp does not leak precise timing. Use the same base as the kernel: a peer that
 * switched from an implementation with a larger base would otherwise be rejected for a while.
 */
export const TAI64N_SIZE = 12;
const TAI64_BASE_HI = 0x40000000; // upper 32 bits of 2^62 + 10
const TAI64_BASE_LO = 10;
const WHITENER_MASK = 0x1000000 - 1;

export function tai64n(wallMs: number, out: Uint8Array = new Uint8Array(TAI64N_SIZE)): Uint8Array {
  const seconds = Math.floor(wallMs / 1000);
  const nanos = Math.floor((wallMs - seconds * 1000) * 1e6);
  const lo = seconds + TAI64_BASE_LO; // fits: seconds < 2^32 until 2106
  const view = new DataView(out.buffer, out.byteOffset, TAI64N_SIZE);
  view.setUint32(0, TAI64_BASE_HI + Math.floor(lo / 0x1_0000_0000));
  view.setUint32(4, lo >>> 0);
  view.setUint32(8, (nanos & ~WHITENER_MASK) >>> 0);
  return out;
}

/** True when timestamp `a` is strictly after `b` (both 12 bytes; big-endian so bytewise order). */
export function tai64nAfter(a: Uint8Array, b: Uint8Array): boolean {
  for (let i = 0; i < TAI64N_SIZE; i++) {
    if (a[i] !== b[i]) return a[i] > b[i];
  }
  return false;
}
