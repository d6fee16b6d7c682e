/**
 * How a thread other than the main thread learns where the sessions' shared state is: the
 * keypair table's chunks (keypair-table.ts), the receiver-index map (shared-index-map.ts), the
 * flattened allowed-IPs table (allowedips/published-routes.ts) and, for a thread that sends, the
 * send table's chunks (send-table.ts). All change on the main thread
 * while the other thread runs: a new chunk, the map moved to a bigger buffer, a new routes table
 * (whose arrival a shared counter announces, so the thread looks only when there is one). The main thread posts each change as a message (through a MessagePort to a
 * worker, or a plain queue in-process: MemoryBind), always before anything refers to it; the
 * other thread reads its messages only when it meets a chunk it lacks or a map marked MOVED, so
 * it never waits for its event loop (a reader thread has none).
 */
import { chunkViews, type KeyChunk, type KeypairTable } from './keypair-table.ts';
import { IndexMapReader, type SharedIndexMap } from './shared-index-map.ts';
import type { RoutesFeed } from '../allowedips/published-routes.ts';
import { sendChunkViews, type PeerSendTable } from './send-table.ts';

/** What a thread starts with (posted in its workerData). */
export interface SharedSessionsInit {
  chunks: SharedArrayBuffer[];
  indexMap: SharedArrayBuffer;
  /** The routes table as published when the thread started, and the counter of publications since (Int32Array[1]). */
  routes: SharedArrayBuffer | undefined;
  routesVersion: SharedArrayBuffer;
  /** The send table's chunks by chunk number (when it is shared). */
  sendChunks: [number, SharedArrayBuffer][];
}

/** A change, posted by the main thread. */
export type SharedSessionsMessage =
  | { kind: 'chunk'; number: number; buffer: SharedArrayBuffer }
  | { kind: 'index-map'; buffer: SharedArrayBuffer }
  | { kind: 'routes'; buffer: SharedArrayBuffer }
  /** A send-table chunk made (buffer) or dropped with its last peer (undefined). */
  | { kind: 'send-chunk'; number: number; buffer: SharedArrayBuffer | undefined };

/** Where the state is now, and from here on every change through `post`. Returns the init and the unsubscribe. */
export function shareSessions(
  keypairs: KeypairTable, indices: SharedIndexMap, routes: RoutesFeed | undefined, post: (message: SharedSessionsMessage) => void,
  sendTable?: PeerSendTable,
): { init: SharedSessionsInit; stop: () => void } {
  const stopChunks = keypairs.onChunk((number, buffer) => post({ kind: 'chunk', number, buffer }));
  const stopSendChunks = sendTable?.onChange((change) => post({ kind: 'send-chunk', number: change.chunk, buffer: change.buffer }));
  const stopMoves = indices.onMove((buffer) => post({ kind: 'index-map', buffer }));
  const routesVersion = new SharedArrayBuffer(4);
  const stopRoutes = routes?.onPublish((flat) => {
    post({ kind: 'routes', buffer: flat.buffer as SharedArrayBuffer });
    Atomics.add(new Int32Array(routesVersion), 0, 1); // after the post: whoever sees the count finds the message
  });
  return {
    init: {
      chunks: [...keypairs.chunkBuffers], indexMap: indices.buffer, routes: routes?.current.buffer as SharedArrayBuffer | undefined, routesVersion,
      sendChunks: (sendTable?.currentChunks ?? []).map((c) => [c.chunk, c.buffer!]),
    },
    stop: () => {
      stopChunks();
      stopSendChunks?.();
      stopMoves();
      stopRoutes?.();
    },
  };
}

/** The other thread's view: `next` returns the next posted message, or undefined when none is waiting. */
export class SharedSessionsView {
  private readonly chunks: (KeyChunk | undefined)[];
  private movedTo: SharedArrayBuffer | undefined;
  readonly indices: IndexMapReader;
  private flatRoutes: Int32Array | undefined;
  private readonly routesVersion: Int32Array;
  private routesSeen = 0;
  private readonly sendChunks = new Map<number, Int32Array>();

  constructor(init: SharedSessionsInit, private readonly next: () => SharedSessionsMessage | undefined) {
    this.chunks = init.chunks.map((buffer) => chunkViews(buffer));
    this.flatRoutes = init.routes && new Int32Array(init.routes);
    this.routesVersion = new Int32Array(init.routesVersion);
    for (const [number, buffer] of init.sendChunks) this.sendChunks.set(number, sendChunkViews(buffer));
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

  /**
   * Send-table chunk `number`, or undefined when it was never posted or has been dropped (a
   * routes table that still names a removed peer: its packets go to the main thread).
   */
  readonly sendChunkAt = (number: number): Int32Array | undefined => {
    const known = this.sendChunks.get(number);
    if (known !== undefined) return known;
    this.drain();
    return this.sendChunks.get(number);
  };

  /** The latest routes table published (undefined: none is shared with this thread). */
  routes(): Int32Array | undefined {
    const version = Atomics.load(this.routesVersion, 0);
    if (version !== this.routesSeen) {
      this.drain();
      this.routesSeen = version;
    }
    return this.flatRoutes;
  }

  private drain(): void {
    for (let message = this.next(); message !== undefined; message = this.next()) {
      if (message.kind === 'chunk') this.chunks[message.number] = chunkViews(message.buffer);
      else if (message.kind === 'routes') this.flatRoutes = new Int32Array(message.buffer); // the latest counts
      else if (message.kind === 'send-chunk') {
        if (message.buffer === undefined) this.sendChunks.delete(message.number);
        else this.sendChunks.set(message.number, sendChunkViews(message.buffer));
      }
      else this.movedTo = message.buffer; // only the latest counts: each move supersedes the last
    }
  }
}
