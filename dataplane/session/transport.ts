/**
 * Sealing and opening transport-data messages (type 4), in place.
 *
 * A packet buffer is laid out as the datagram will be: 16 bytes of headroom for the header, the
 * plaintext, room for padding, then 16 bytes for the tag. Sealing pads with zeros, encrypts in
 * place and writes the header into the headroom, so the same bytes go straight to the socket.
 * These functions are used by the core and by the crypto worker threads alike.
 *
 * Both refuse an all-zero key and return ZERO_KEY instead: zeros are what a retired keypair's
 * keys become, and what anyone can seal with, so a packet opened under them proves nothing and a
 * packet sealed under them is public. Keypair holds (keypair.ts) keep this from being reached;
 * this is the floor under that rule, counted as 'zero-key' by the callers.
 */
import { writeCounterNonce, type Aead } from '../crypto/primitives.ts';
import { TAG_SIZE, TRANSPORT_HEADER_SIZE, paddedLength, writeTransportHeader } from '../noise/messages.ts';

/** Returned by sealTransportInPlace and openTransport when the key is all zeros: nothing was done. */
export const ZERO_KEY = 'zero-key';

/**
 * Whether a 32-byte key is all zeros, without branching on its bytes. Unrolled: it runs once
 * per packet, and a loop costs as much as a tenth of sealing a small packet on Node's JIT.
 */
export function isZeroKey32(k: Uint8Array): boolean {
  return (k[0] | k[1] | k[2] | k[3] | k[4] | k[5] | k[6] | k[7] | k[8] | k[9] | k[10] | k[11] | k[12] | k[13] | k[14] | k[15]
    | k[16] | k[17] | k[18] | k[19] | k[20] | k[21] | k[22] | k[23] | k[24] | k[25] | k[26] | k[27] | k[28] | k[29] | k[30] | k[31]) === 0;
}

/** Bytes a packet buffer needs beyond the packet: header headroom, padding, tag. */
export const TRANSPORT_OVERHEAD = TRANSPORT_HEADER_SIZE + 15 + TAG_SIZE;

const nonce = new Uint8Array(12); // scratch: each thread has its own module instance

/**
 * Seals the `length` plaintext bytes at buf[16 ..] in place and writes the header at buf[0 .. 16].
 * `buf` must have room for padding and the tag (length + TRANSPORT_OVERHEAD). Returns the
 * datagram length, or ZERO_KEY (buf untouched) when the key is all zeros.
 */
export function sealTransportInPlace(
  aead: Aead, key: Uint8Array, receiverIndex: number, counter: number,
  buf: Uint8Array, length: number, mtu: number,
): number | typeof ZERO_KEY {
  if (isZeroKey32(key)) return ZERO_KEY;
  const padded = paddedLength(length, mtu);
  const end = TRANSPORT_HEADER_SIZE + padded;
  if (buf.length < end + TAG_SIZE) throw new RangeError(`packet buffer too small: need ${end + TAG_SIZE} bytes, have ${buf.length}`);
  buf.fill(0, TRANSPORT_HEADER_SIZE + length, end);
  const plaintext = buf.subarray(TRANSPORT_HEADER_SIZE, end);
  aead.seal(key, writeCounterNonce(counter, nonce), plaintext, undefined, buf.subarray(TRANSPORT_HEADER_SIZE, end + TAG_SIZE));
  writeTransportHeader(buf, 0, receiverIndex, counter);
  return end + TAG_SIZE;
}

/**
 * Opens a transport message's ciphertext (everything after the 16-byte header) into `out` (or in
 * place when `out` is omitted). Returns the padded plaintext, null when it does not
 * authenticate, or ZERO_KEY (nothing decrypted) when the key is all zeros.
 */
export function openTransport(
  aead: Aead, key: Uint8Array, counter: number, datagram: Uint8Array, out?: Uint8Array,
): Uint8Array | null | typeof ZERO_KEY {
  if (isZeroKey32(key)) return ZERO_KEY;
  const sealed = datagram.subarray(TRANSPORT_HEADER_SIZE);
  const target = out ?? sealed;
  return aead.open(key, writeCounterNonce(counter, nonce), sealed, undefined, target);
}
