/**
 * Receiver indices: the 32-bit numbers each side picks for itself and the other side echoes in
 * every message, so an incoming message finds its peer and keypair with one map lookup.
 * Indices are random (not counters) so they reveal nothing about how many sessions exist.
 */
import type { Keypair } from './keypair.ts';

export interface IndexEntry<P> {
  readonly peer: P;
  /** Set once the handshake for this index has produced a keypair. */
  keypair: Keypair | null;
}

export class IndexTable<P> {
  private readonly entries = new Map<number, IndexEntry<P>>();

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
    if (entry) entry.keypair = keypair;
  }

  lookup(index: number): IndexEntry<P> | undefined {
    return this.entries.get(index);
  }

  delete(index: number): void {
    this.entries.delete(index);
  }

  get size(): number {
    return this.entries.size;
  }
}
