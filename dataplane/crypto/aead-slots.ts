/**
 * ChaCha20-Poly1305 over a run of slots: many transport messages sealed or opened in one call
 * (what session/batch-seal.ts does to a run of packets). A provider may do it natively (openssl-ffi:
 * one foreign call per run instead of one per packet); for the others `withSlots` adds the
 * reference form here, one seal or open per slot. The two forms must agree byte for byte
 * (test/unit/aead-slots.test.ts checks every provider against this one).
 *
 * Slot i is data[i * stride, (i + 1) * stride); its message starts at `offset`. The nonce of
 * message i is WireGuard's transport nonce of counters[i] (4 zero bytes, le64 counter).
 */
import { TAG_SIZE, writeCounterNonce, type Aead, type SlotAead } from './primitives.ts';

/** Throws unless `count` slots of `stride` bytes fit `data` and `offset` lies in a slot. */
export function checkSlotRun(data: Uint8Array, stride: number, offset: number, count: number, lengths: Int32Array, counters: Float64Array): void {
  if (!Number.isInteger(stride) || stride <= 0) throw new RangeError(`aead slots: stride must be a positive integer, got ${stride}`);
  if (!Number.isInteger(count) || count < 0 || count * stride > data.length) throw new RangeError(`aead slots: ${count} slots of ${stride} bytes do not fit ${data.length} bytes`);
  if (!Number.isInteger(offset) || offset < 0 || offset > stride) throw new RangeError(`aead slots: offset ${offset} outside a slot of ${stride} bytes`);
  if (lengths.length < count || counters.length < count) throw new RangeError(`aead slots: ${count} slots need ${count} lengths and counters`);
}

/** The reference forms' nonce, rewritten per message (one module instance per thread, and the loops never re-enter). */
const nonce = new Uint8Array(12);

/** The reference sealSlots: lengths[i] plaintext bytes at slot i's offset, sealed in place, the tag after them. */
function sealEachSlot(aead: Aead, key: Uint8Array, data: Uint8Array, stride: number, offset: number, count: number, lengths: Int32Array, counters: Float64Array): void {
  checkSlotRun(data, stride, offset, count, lengths, counters);
  for (let i = 0; i < count; i++) {
    const start = i * stride + offset;
    const length = lengths[i];
    if (length < 0 || offset + length + TAG_SIZE > stride) throw new RangeError(`aead slots: slot ${i}: ${length} bytes and the tag do not fit after offset ${offset}`);
    aead.seal(key, writeCounterNonce(counters[i], nonce), data.subarray(start, start + length), undefined, data.subarray(start, start + length + TAG_SIZE));
  }
}

/** The reference openSlots: lengths[i] (ciphertext ‖ tag) becomes the plaintext length, or -1. */
function openEachSlot(aead: Aead, key: Uint8Array, data: Uint8Array, stride: number, offset: number, count: number, lengths: Int32Array, counters: Float64Array): void {
  checkSlotRun(data, stride, offset, count, lengths, counters);
  for (let i = 0; i < count; i++) {
    const start = i * stride + offset;
    const length = lengths[i];
    if (length < TAG_SIZE || offset + length > stride) {
      lengths[i] = -1;
      continue;
    }
    const sealed = data.subarray(start, start + length);
    const plaintext = aead.open(key, writeCounterNonce(counters[i], nonce), sealed, undefined, sealed);
    lengths[i] = plaintext === null ? -1 : plaintext.length;
  }
}

/** `aead` with both slot forms: its own where it has them, else the reference ones. */
export function withSlots(aead: Aead): SlotAead {
  return {
    seal: aead.seal.bind(aead),
    open: aead.open.bind(aead),
    sealSlots: aead.sealSlots ? aead.sealSlots.bind(aead) : (...args) => sealEachSlot(aead, ...args),
    openSlots: aead.openSlots ? aead.openSlots.bind(aead) : (...args) => openEachSlot(aead, ...args),
  };
}

/** The reference forms, for tests that compare a provider's own against them. */
export const referenceSlots = { sealEachSlot, openEachSlot };
