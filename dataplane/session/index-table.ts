/**
 * Receiver indices: the 32-bit numbers each side picks for itself and the other side echoes in
 * every message, so an incoming message finds its peer and keypair with one map lookup.
 * Indices are random (not counters) so they reveal nothing about how many sessions exist.
 */
import type { Keypair } from './keypair.ts';
import { SharedIndexMap } from './shared-index-map.ts';

export interface IndexEntry<P> {
  readonly peer: P;
  /** Set once the handshake for this index has produced a keypair. */
  keypair: Keypair | null;
}

export class IndexTable<P> {
  private readonly entries = new Map<number, IndexEntry<P>>();
  /** The keypair entries, mirrored into shared memory for other threads (shared-index-map.ts). */
  readonly shared = new SharedIndexMap();

  constructor(private readonly randomU32: () => number) {}

  /** Registers a new random, unused index for a handshake of `peer`. */
  newIndex(peer: P): number {
    for (;;) {
      const index = this.randomU32() >>> 0;
      if (!this.entries.has(index)) {
        this.entries.set(index, { peer, keypair: null });
        return index;
      }
    }
  }

  /** The handshake's index now stands for the keypair it produced. */
  attachKeypair(index: number, keypair: Keypair): void {
    const entry = this.entries.get(index);
    if (!entry) return;
    entry.keypair = keypair;
    this.shared.set(index, keypair.at.slot, keypair.at.generation);
  }

  lookup(index: number): IndexEntry<P> | undefined {
    return this.entries.get(index);
  }

  delete(index: number): void {
    if (this.entries.get(index)?.keypair) this.shared.delete(index);
    this.entries.delete(index);
  }

  get size(): number {
    return this.entries.size;
  }
}
