/**
 * Sealing and opening a whole PacketBatch in place. The same code runs in the worker threads
 * and, for the inline pool, on the main thread.
 *
 * An all-zero key is refused for the whole batch (see transport.ts): every slot's length becomes
 * SLOT_ZERO_KEY, which the pipelines count as 'zero-key'. The result travels in the batch's own
 * shared lengths, so every pool (inline, ring) reports it without a change of protocol.
 */
import type { Aead } from '../crypto/primitives.ts';
import { ZERO_KEY, isZeroKey32, openTransport, sealTransportInPlace } from '../session/transport.ts';

/** A slot's length after opening when it did not authenticate. */
export const SLOT_FAILED = -1;
/** Every slot's length after sealing or opening with an all-zero key: refused, nothing done. */
export const SLOT_ZERO_KEY = -2;

export interface BatchView {
  data: Uint8Array;
  lengths: Int32Array;
  counters: Float64Array;
  slotSize: number;
  count: number;
}

/**
 * Seals slot i's plaintext (lengths[i] bytes at offset 16) with counters[i]; lengths[i] becomes
 * the datagram length (SLOT_ZERO_KEY for every slot when the key is all zeros).
 */
export function sealBatch(aead: Aead, key: Uint8Array, receiverIndex: number, mtu: number, batch: BatchView): void {
  const { data, lengths, counters, slotSize, count } = batch;
  if (isZeroKey32(key)) {
    lengths.fill(SLOT_ZERO_KEY, 0, count);
    return;
  }
  for (let i = 0; i < count; i++) {
    const slot = data.subarray(i * slotSize, (i + 1) * slotSize);
    const length = sealTransportInPlace(aead, key, receiverIndex, counters[i], slot, lengths[i], mtu);
    lengths[i] = length === ZERO_KEY ? SLOT_ZERO_KEY : length;
  }
}

/**
 * Opens slot i's datagram (lengths[i] bytes) in place; lengths[i] becomes the padded plaintext
 * length, SLOT_FAILED, or (every slot, when the key is all zeros) SLOT_ZERO_KEY.
 */
export function openBatch(aead: Aead, key: Uint8Array, batch: BatchView): void {
  const { data, lengths, counters, slotSize, count } = batch;
  if (isZeroKey32(key)) {
    lengths.fill(SLOT_ZERO_KEY, 0, count);
    return;
  }
  for (let i = 0; i < count; i++) {
    const start = i * slotSize;
    const plaintext = openTransport(aead, key, counters[i], data.subarray(start, start + lengths[i]));
    lengths[i] = plaintext === null ? SLOT_FAILED : plaintext === ZERO_KEY ? SLOT_ZERO_KEY : plaintext.length;
  }
}
