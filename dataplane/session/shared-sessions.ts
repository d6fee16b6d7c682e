/**
 * How a thread other than the main thread learns where the sessions' shared state is: the
 * keypair table's chunks (keypair-table.ts) and the receiver-index map (shared-index-map.ts).
 * Both grow on the main thread while the other thread runs: a new chunk, or the map moved to a
 * bigger buffer. The main thread posts each change as a message (through a MessagePort to a
 * worker, or a plain queue in-process: MemoryBind), always before anything refers to it; the
 * other thread reads its messages only when it meets a chunk it lacks or a map marked MOVED, so
 * it never waits for its event loop (a reader thread has none).
 */
import { chunkViews, type KeyChunk, type KeypairTable } from './keypair-table.ts';
import { IndexMapReader, type SharedIndexMap } from './shared-index-map.ts';

/** What a thread starts with (posted in its workerData). */
export interface SharedSessionsInit {
  chunks: SharedArrayBuffer[];
  indexMap: SharedArrayBuffer;
}

/** A change, posted by the main thread. */
export type SharedSessionsMessage =
  | { kind: 'chunk'; number: number; buffer: SharedArrayBuffer }
  | { kind: 'index-map'; buffer: SharedArrayBuffer };

/** Where the state is now, and from here on every change through `post`. Returns the init and the unsubscribe. */
export function shareSessions(
  keypairs: KeypairTable, indices: SharedIndexMap, post: (message: SharedSessionsMessage) => void,
): { init: SharedSessionsInit; stop: () => void } {
  const stopChunks = keypairs.onChunk((number, buffer) => post({ kind: 'chunk', number, buffer }));
  const stopMoves = indices.onMove((buffer) => post({ kind: 'index-map', buffer }));
  return {
    init: { chunks: [...keypairs.chunkBuffers], indexMap: indices.buffer },
    stop: () => {
      stopChunks();
      stopMoves();
    },
  };
}

/** The other thread's view: `next` returns the next posted message, or undefined when none is waiting. */
export class SharedSessionsView {
  private readonly chunks: (KeyChunk | undefined)[];
  private movedTo: SharedArrayBuffer | undefined;
  readonly indices: IndexMapReader;

  constructor(init: SharedSessionsInit, private readonly next: () => SharedSessionsMessage | undefined) {
    this.chunks = init.chunks.map((buffer) => chunkViews(buffer));
    this.indices = new IndexMapReader(init.indexMap, () => {
      this.drain();
      const moved = this.movedTo;
      this.movedTo = undefined;
      return moved;
    });
  }

  /** Chunk `number`, or undefined when it has not been posted (yet). */
  readonly chunkAt = (number: number): KeyChunk | undefined => {
    const known = this.chunks[number];
    if (known !== undefined) return known;
    this.drain();
    return this.chunks[number];
  };

  private drain(): void {
    for (let message = this.next(); message !== undefined; message = this.next()) {
      if (message.kind === 'chunk') this.chunks[message.number] = chunkViews(message.buffer);
      else this.movedTo = message.buffer; // only the latest counts: each move supersedes the last
    }
  }
}
