/**
 * Sealing and opening a whole PacketBatch in place. The same code runs in the worker threads
 * and, for the inline pool, on the main thread.
 */
import type { Aead } from '../crypto/primitives.ts';
import { openTransport, sealTransportInPlace } from '../session/transport.ts';

export interface BatchView {
  data: Uint8Array;
  lengths: Int32Array;
  counters: Float64Array;
  slotSize: number;
  count: number;
}

/** Seals slot i's plaintext (lengths[i] bytes at offset 16) with counters[i]; lengths[i] becomes the datagram length. */
export function sealBatch(aead: Aead, key: Uint8Array, receiverIndex: number, mtu: number, batch: BatchView): void {
  const { data, lengths, counters, slotSize, count } = batch;
  for (let i = 0; i < count; i++) {
    const slot = data.subarray(i * slotSize, (i + 1) * slotSize);
    lengths[i] = sealTransportInPlace(aead, key, receiverIndex, counters[i], slot, lengths[i], mtu);
  }
}

/** Opens slot i's datagram (lengths[i] bytes) in place; lengths[i] becomes the padded plaintext length, or -1. */
export function openBatch(aead: Aead, key: Uint8Array, batch: BatchView): void {
  const { data, lengths, counters, slotSize, count } = batch;
  for (let i = 0; i < count; i++) {
    const start = i * slotSize;
    const plaintext = openTransport(aead, key, counters[i], data.subarray(start, start + lengths[i]));
    lengths[i] = plaintext ? plaintext.length : -1;
  }
}
