/**
 * Copying bytes between shared byte arrays: `dst.set(src.subarray(start, end), at)`, except where
 * Node.js makes that slow.
 *
 * V8 copies into or out of a SharedArrayBuffer with relaxed atomic loads and stores (other threads
 * may be reading): word by word when the source and the destination lie at the same address
 * modulo 8, byte by byte otherwise. Measured on the project's VM for 1368 bytes (one TCP segment):
 * 338 ns misaligned, 60 ns aligned, 21-23 ns for Bun's copy or for V8's between ordinary buffers.
 * The data path copies every TCP segment once on each side, between buffers that are shared:
 * the TSO split (the read buffer into a ring slot, offload.ts writeSegment) and the GRO merge (a
 * ring slot into the write buffer, coalesceAndWrite), at offsets the headers set. In a CPU
 * profile of one TCP stream under Node, V8's relaxed copy was 12 % of the TUN reader's time and
 * 11 % of the UDP reader's.
 *
 * So under Node (koffi) a misaligned copy of at least MEMMOVE_MIN_BYTES between two
 * SharedArrayBuffers goes through libc's memmove by raw address instead: 51 ns, about 80 with
 * the address lookup. Both ranges are checked first (on every path), and only SharedArrayBuffers
 * qualify: their memory never moves and is never detached, so an address taken once stays good
 * for as long as the buffer is reachable (this thread holds it while it copies). Everything else
 * (Bun, aligned or short copies, ordinary buffers) takes `set`.
 */
import type { Libc } from './libc.ts';
import { SharedAddresses } from './shared-addresses.ts';

/**
 * Copies src[start, end) to dst[at, at + end - start) (overlapping ranges too). Offsets are whole
 * numbers, none negative (no counting from the end as subarray does); a range that does not fit
 * throws a RangeError and nothing is copied.
 */
export type CopyBytes = (dst: Uint8Array, at: number, src: Uint8Array, start: number, end: number) => void;

/** Below this a misaligned relaxed copy costs about what the FFI call does. */
export const MEMMOVE_MIN_BYTES = 256;

function checkRanges(dst: Uint8Array, at: number, src: Uint8Array, start: number, end: number): void {
  if (!Number.isInteger(start) || !Number.isInteger(end) || !Number.isInteger(at)
    || start < 0 || start > end || end > src.length || at < 0 || at + end - start > dst.length) {
    throw new RangeError(`copyBytes: bytes [${start}, ${end}) of ${src.length} do not fit at ${at} of ${dst.length}`);
  }
}

/** The plain copy: right everywhere, and the fast one but for misaligned shared memory under Node. */
export const copyBySet: CopyBytes = (dst, at, src, start, end) => {
  checkRanges(dst, at, src, start, end);
  dst.set(src.subarray(start, end), at);
};

/** The copy for the threads of this runtime: memmove for misaligned shared memory under koffi, else {@link copyBySet}. */
export function copierFor(libc: Libc): CopyBytes {
  if (libc.backend !== 'koffi') return copyBySet;
  const addresses = new SharedAddresses(libc);
  return (dst, at, src, start, end) => {
    checkRanges(dst, at, src, start, end);
    const length = end - start;
    const from = src.byteOffset + start;
    const to = dst.byteOffset + at;
    if (length < MEMMOVE_MIN_BYTES || ((to - from) & 7) === 0
      || !(src.buffer instanceof SharedArrayBuffer) || !(dst.buffer instanceof SharedArrayBuffer)) {
      dst.set(src.subarray(start, end), at);
    } else {
      libc.memmove(addresses.of(dst) + at, addresses.of(src) + start, length);
    }
  };
}
