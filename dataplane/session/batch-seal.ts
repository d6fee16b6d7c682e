/**
 * Sealing a run of packets in place, each in its own fixed-size slot: the transport format
 * (headers, padding) is written here, then the AEAD runs over all the slots in one call
 * (crypto/aead-slots.ts), which for openssl-ffi is one foreign call per run instead of one per
 * packet. The TUN readers' sealer (transport-sealer.ts) seals each run of packets to one peer
 * with it. (Opening runs where datagrams are received: transport-opener.ts.)
 *
 * An all-zero key is refused for the whole run (see transport.ts): every slot's length becomes
 * SLOT_ZERO_KEY, which the sealer records as ZERO_KEY_REFUSED.
 */
import type { SlotAead } from '../crypto/primitives.ts';
import { TAG_SIZE, TRANSPORT_HEADER_SIZE, paddedLength, writeTransportHeader } from '../noise/messages.ts';
import { isZeroKey32 } from './transport.ts';

/** Every slot's length after sealing with an all-zero key: refused, nothing done. */
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
 * the datagram length (SLOT_ZERO_KEY for every slot when the key is all zeros). The padding and
 * headers are written here, the AEAD runs over the whole batch in one call (aead-slots.ts).
 */
export function sealBatch(aead: SlotAead, key: Uint8Array, receiverIndex: number, mtu: number, batch: BatchView): void {
  const { data, lengths, counters, slotSize, count } = batch;
  if (isZeroKey32(key)) {
    lengths.fill(SLOT_ZERO_KEY, 0, count);
    return;
  }
  for (let i = 0; i < count; i++) {
    const start = i * slotSize;
    const padded = paddedLength(lengths[i], mtu);
    const end = TRANSPORT_HEADER_SIZE + padded;
    if (end + TAG_SIZE > slotSize) throw new RangeError(`packet buffer too small: need ${end + TAG_SIZE} bytes, have ${slotSize}`);
    data.fill(0, start + TRANSPORT_HEADER_SIZE + lengths[i], start + end);
    writeTransportHeader(data, start, receiverIndex, counters[i]);
    lengths[i] = padded;
  }
  aead.sealSlots(key, data, slotSize, TRANSPORT_HEADER_SIZE, count, lengths, counters);
  for (let i = 0; i < count; i++) lengths[i] += TRANSPORT_HEADER_SIZE + TAG_SIZE;
}
