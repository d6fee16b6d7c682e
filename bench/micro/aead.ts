/**
 * ChaCha20-Poly1305 throughput of one crypto provider at WireGuard packet sizes: seals and opens
 * per second into preallocated buffers (as the data path does), single-threaded; and seals per
 * second when BATCH_SLOTS packets go in one call (Aead.sealSlots, what a crypto worker does).
 */
import type { CryptoProvider } from '../../dataplane/crypto/primitives.ts';
import { writeCounterNonce } from '../../dataplane/crypto/primitives.ts';
import { withSlots } from '../../dataplane/crypto/aead-slots.ts';
import { opsPerSecond, type TimingOptions } from './measure.ts';

/** The payload sizes the issue asks for: a small packet, a medium one, a full 1420-byte MTU packet. */
export const AEAD_SIZES: readonly number[] = [64, 512, 1420];

export interface AeadFigure {
  size: number;
  sealsPerSecond: number;
  opensPerSecond: number;
  /** Packets sealed per second, BATCH_SLOTS per sealSlots call. */
  batchSealsPerSecond: number;
}

/** Packets per sealSlots call (a full run of the TUN reader's sealer: transport-sealer.ts MAX_RUN). */
export const BATCH_SLOTS = 64;

/** MB/s (10^6 bytes of plaintext per second) of `opsPerSecond` operations on `size` bytes. */
export const megabytesPerSecond = (opsPerSec: number, size: number): number => (opsPerSec * size) / 1e6;

/** Seal and open rates of `provider`'s AEAD at each size (throws when it has none). */
export function measureAead(provider: CryptoProvider, sizes: readonly number[], timing: TimingOptions): AeadFigure[] {
  const aead = provider.aead;
  if (!aead) throw new Error(`${provider.name} has no AEAD`);
  const key = new Uint8Array(32).fill(7);
  const nonce = writeCounterNonce(0);
  const out: AeadFigure[] = [];
  for (const size of sizes) {
    const plaintext = new Uint8Array(size).fill(1);
    const sealedOut = new Uint8Array(size + 16);
    let counter = 0;
    const sealsPerSecond = opsPerSecond(() => { writeCounterNonce(counter++, nonce); aead.seal(key, nonce, plaintext, undefined, sealedOut); }, 200, timing);
    writeCounterNonce(0, nonce);
    const sealed = aead.seal(key, nonce, plaintext, undefined);
    const plain = new Uint8Array(size);
    const opensPerSecond = opsPerSecond(() => {
      if (aead.open(key, nonce, sealed, undefined, plain) === null) throw new Error(`${provider.name}: open failed`);
    }, 200, timing);
    const slots = withSlots(aead);
    const stride = size + 16 + 16;
    const run = new Uint8Array(BATCH_SLOTS * stride);
    const lengths = new Int32Array(BATCH_SLOTS).fill(size);
    const counters = new Float64Array(BATCH_SLOTS);
    const batchesPerSecond = opsPerSecond(() => {
      for (let i = 0; i < BATCH_SLOTS; i++) counters[i] = counter++;
      slots.sealSlots(key, run, stride, 16, BATCH_SLOTS, lengths, counters);
    }, 10, timing);
    out.push({ size, sealsPerSecond, opensPerSecond, batchSealsPerSecond: batchesPerSecond * BATCH_SLOTS });
  }
  return out;
}
