/** Transport messages sealed under keys made of one repeated byte, for tests of the receive path. */
import { writeCounterNonce, type Aead } from '../../dataplane/crypto/primitives.ts';
import { writeTransportHeader } from '../../dataplane/noise/messages.ts';

/** A 32-byte key of `fill` repeated (0: the all-zero key). */
export const filledKey = (fill: number): Uint8Array => new Uint8Array(32).fill(fill);

/** `n` bytes that differ per `seed`. */
export const payload = (n: number, seed: number): Uint8Array => Uint8Array.from({ length: n }, (_, i) => (i * 7 + seed) & 0xff);

/** A transport message to receiver `index`, sealed under filledKey(`fill`) at `counter`, carrying `plaintext` as it is (no padding). */
export function transportMessage(aead: Aead, index: number, fill: number, counter: number, plaintext: Uint8Array): Uint8Array {
  const buf = new Uint8Array(16 + plaintext.length + 16);
  writeTransportHeader(buf, 0, index, counter);
  buf.set(plaintext, 16);
  aead.seal(filledKey(fill), writeCounterNonce(counter), buf.subarray(16, 16 + plaintext.length), undefined, buf.subarray(16));
  return buf;
}
