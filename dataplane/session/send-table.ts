/**
 * Per peer, what a thread other than the main thread needs to send the peer's packets itself
 * (docs/data-workers.md, step 3): the keypair to seal with (its slot in the keypair table, that
 * slot's generation, and the peer's receiver index for it) and where the datagrams go (the
 * endpoint, and the local address replies leave from: its sticky source, endpoint.ts).
 *
 * The main thread is the only writer (Peer.refreshSendState). It clears an entry's keypair (the
 * other thread then hands that peer's packets to the main thread, as before) whenever it must
 * decide for itself: no usable session yet, packets staged ahead of new ones (their order holds),
 * no endpoint, or a keypair less than a second from its reject-after time (the other thread has
 * no clock of ours; the core's tick clears it, as it ends the receiving thread's delivery). What
 * the main thread does after a packet left (the timers, rekey after time or messages) it still
 * does, from the sending thread's records. The sending thread checks the one limit that moves
 * with every packet, the nonce counter against REJECT_AFTER_MESSAGES, itself.
 *
 * Peers are found by their number (Peer.number, which the flat allowed-IPs table names them by):
 * entry `n & (CHUNK_ENTRIES - 1)` of chunk `n >> CHUNK_SHIFT`. Numbers are never reused, so an
 * entry only ever belongs to one peer, and a stale routing table can never lead to another
 * peer's entry. A chunk is created with its first peer and dropped with its last; a chunk of
 * 64 entries is 4 KiB, so however peers come and go this is at most 4 KiB per live peer.
 *
 * Readers never lock: the writer makes SEQ odd before it changes an entry and even after (a
 * seqlock); a reader that saw SEQ odd, or changed, reads again. An unchanged SEQ also tells a
 * reader that what it derived from the entry last time (a sockaddr, a control message) holds.
 */
import type { Endpoint } from '../net/endpoint.ts';

export const CHUNK_SHIFT = 6;
export const CHUNK_ENTRIES = 1 << CHUNK_SHIFT;
const ENTRY_INTS = 16;
export const SEND_CHUNK_BYTES = CHUNK_ENTRIES * ENTRY_INTS * 4;

const SEQ = 0;
/** The keypair's slot in the keypair table; NO_KEYPAIR: the main thread sends this peer's packets. */
const KEY_SLOT = 1;
const KEY_GENERATION = 2;
/** The peer's index for the keypair (the receiver index of our transport messages). */
const REMOTE_INDEX = 3;
const PORT = 4;
/** 4 or 6. */
const FAMILY = 5;
/** Four words: the address's 16 bytes (an IPv4 address in the first 4). */
const ADDRESS = 6;
/** 0: no sticky source (the kernel picks); else 4 or 6. */
const SOURCE_FAMILY = 10;
const SOURCE_IFINDEX = 11;
/** Four words, as ADDRESS. */
const SOURCE_ADDRESS = 12;

export const NO_KEYPAIR = -1;

/** What the writer is given of a keypair (a Keypair is one): where it lives in the keypair table, and the peer's index for it. */
export interface SendKeypair {
  readonly at: { readonly slot: number; readonly generation: number };
  readonly remoteIndex: number;
}

/** What a reader gets: reuse one object (readSendTarget fills it). */
export interface SendTarget {
  /** The entry's SEQ when read: unchanged SEQ, unchanged entry. */
  seq: number;
  keySlot: number;
  keyGeneration: number;
  remoteIndex: number;
  port: number;
  family: number;
  readonly address: Uint8Array;
  sourceFamily: number;
  sourceIfindex: number;
  readonly sourceAddress: Uint8Array;
}

export function newSendTarget(): SendTarget {
  return {
    seq: 0, keySlot: NO_KEYPAIR, keyGeneration: 0, remoteIndex: 0, port: 0, family: 0,
    address: new Uint8Array(16), sourceFamily: 0, sourceIfindex: 0, sourceAddress: new Uint8Array(16),
  };
}

export function sendChunkViews(buffer: SharedArrayBuffer): Int32Array {
  if (!(buffer instanceof SharedArrayBuffer) || buffer.byteLength !== SEND_CHUNK_BYTES) {
    throw new RangeError(`send table: a chunk is a SharedArrayBuffer of ${SEND_CHUNK_BYTES} bytes`);
  }
  return new Int32Array(buffer);
}

/** Writes 4 or 16 address bytes into four words (unused bytes zero). */
function storeAddress(words: Int32Array, at: number, bytes: Uint8Array | undefined): void {
  for (let w = 0; w < 4; w++) {
    const i = w * 4;
    words[at + w] = bytes === undefined || i >= bytes.length ? 0
      : (bytes[i] | (bytes[i + 1] << 8) | (bytes[i + 2] << 16) | (bytes[i + 3] << 24));
  }
}

function loadAddress(words: Int32Array, at: number, out: Uint8Array): void {
  for (let w = 0; w < 4; w++) {
    const v = words[at + w];
    const i = w * 4;
    out[i] = v;
    out[i + 1] = v >>> 8;
    out[i + 2] = v >>> 16;
    out[i + 3] = v >>> 24;
  }
}

/**
 * A reader's look at entry `index` of a chunk (under the seqlock): fills `out` and returns
 * whether the entry names a keypair (the reader may send), or false (the main thread sends).
 */
export function readSendTarget(words: Int32Array, index: number, out: SendTarget): boolean {
  const base = index * ENTRY_INTS;
  for (;;) {
    const seq = Atomics.load(words, base + SEQ);
    if ((seq & 1) !== 0) continue; // the main thread is writing it: a few stores
    out.keySlot = words[base + KEY_SLOT];
    out.keyGeneration = words[base + KEY_GENERATION];
    out.remoteIndex = words[base + REMOTE_INDEX];
    out.port = words[base + PORT];
    out.family = words[base + FAMILY];
    loadAddress(words, base + ADDRESS, out.address);
    out.sourceFamily = words[base + SOURCE_FAMILY];
    out.sourceIfindex = words[base + SOURCE_IFINDEX];
    loadAddress(words, base + SOURCE_ADDRESS, out.sourceAddress);
    if (Atomics.load(words, base + SEQ) !== seq) continue;
    out.seq = seq;
    return out.keySlot !== NO_KEYPAIR;
  }
}

/**
 * Whether a datagram from the sockaddr at `name[at]` (struct sockaddr_in / sockaddr_in6), that
 * arrived on our local address at `local[localAt]` (4 or 16 bytes; `localFamily` 0 when unknown),
 * comes from where `target` sends to, from where it sends: false means the peer moved (it roamed,
 * or its datagrams now reach another of our addresses), which the main thread must learn soon.
 */
export function fromTarget(target: SendTarget, name: Uint8Array, at: number, localFamily: number, local: Uint8Array, localAt: number): boolean {
  const v4 = target.family === 4;
  const family = name[at] | (name[at + 1] << 8);
  if (family !== (v4 ? 2 : 10) || ((name[at + 2] << 8) | name[at + 3]) !== target.port) return false;
  const start = at + (v4 ? 4 : 8);
  for (let i = 0, n = v4 ? 4 : 16; i < n; i++) if (name[start + i] !== target.address[i]) return false;
  if (target.sourceFamily !== localFamily) return false;
  for (let i = 0, n = localFamily === 4 ? 4 : localFamily === 6 ? 16 : 0; i < n; i++) if (local[localAt + i] !== target.sourceAddress[i]) return false;
  return true;
}

/** A reader's cheap question: the entry's SEQ (even), to compare with what it last read. */
export function sendEntrySeq(words: Int32Array, index: number): number {
  return Atomics.load(words, index * ENTRY_INTS + SEQ);
}

/** Main thread only: the table, and the chunks other threads are handed (session/shared-sessions.ts). */
export class PeerSendTable {
  private readonly chunks = new Map<number, { words: Int32Array; live: number }>();
  private readonly listeners = new Set<(change: SendChunkChange) => void>();

  /** Makes an entry for peer `number` (no keypair yet: the main thread sends). */
  add(number: number): void {
    const chunkNumber = number >> CHUNK_SHIFT;
    let chunk = this.chunks.get(chunkNumber);
    if (chunk === undefined) {
      const words = sendChunkViews(new SharedArrayBuffer(SEND_CHUNK_BYTES));
      for (let i = 0; i < CHUNK_ENTRIES; i++) words[i * ENTRY_INTS + KEY_SLOT] = NO_KEYPAIR;
      chunk = { words, live: 0 };
      this.chunks.set(chunkNumber, chunk);
      for (const listener of this.listeners) listener({ chunk: chunkNumber, buffer: words.buffer as SharedArrayBuffer });
    }
    chunk.live++;
  }

  /** Peer `number` is gone: its entry stops naming a keypair, and its chunk goes with its last peer. */
  remove(number: number): void {
    const chunkNumber = number >> CHUNK_SHIFT;
    const chunk = this.chunks.get(chunkNumber);
    if (chunk === undefined) return;
    this.publish(number, null, undefined);
    if (--chunk.live > 0) return;
    this.chunks.delete(chunkNumber);
    for (const listener of this.listeners) listener({ chunk: chunkNumber, buffer: undefined });
  }

  /**
   * Sets what peer `number`'s packets are sealed with and sent to; `keypair` null (or no
   * endpoint) hands them to the main thread. Writes only what changed, so an unchanged entry
   * keeps its SEQ.
   */
  publish(number: number, keypair: SendKeypair | null, endpoint: Endpoint | undefined): void {
    const words = this.chunks.get(number >> CHUNK_SHIFT)?.words;
    if (words === undefined) throw new Error(`send table: no entry for peer ${number}`);
    const base = (number & (CHUNK_ENTRIES - 1)) * ENTRY_INTS;
    const usable = keypair !== null && endpoint !== undefined;
    const source = usable ? endpoint.local : undefined;
    const next = this.scratch;
    next[KEY_SLOT] = usable ? keypair.at.slot : NO_KEYPAIR;
    next[KEY_GENERATION] = usable ? keypair.at.generation : 0;
    next[REMOTE_INDEX] = usable ? keypair.remoteIndex | 0 : 0;
    next[PORT] = usable ? endpoint.port : 0;
    next[FAMILY] = usable ? endpoint.family : 0;
    storeAddress(next, ADDRESS, usable ? endpoint.addressBytes : undefined);
    next[SOURCE_FAMILY] = source === undefined ? 0 : source.address.length === 4 ? 4 : 6;
    next[SOURCE_IFINDEX] = source === undefined ? 0 : source.ifindex;
    storeAddress(next, SOURCE_ADDRESS, source?.address);
    let same = true;
    for (let i = 1; i < ENTRY_INTS; i++) if (words[base + i] !== next[i]) { same = false; break; }
    if (same) return;
    Atomics.add(words, base + SEQ, 1); // odd: readers read again
    for (let i = 1; i < ENTRY_INTS; i++) words[base + i] = next[i];
    Atomics.add(words, base + SEQ, 1);
  }

  private readonly scratch = new Int32Array(ENTRY_INTS);

  /** Chunk `chunk`'s words, for a reader on this thread (MemoryTun), or undefined. */
  chunkWords(chunk: number): Int32Array | undefined {
    return this.chunks.get(chunk)?.words;
  }

  /** Every chunk now, for a thread that starts reading the table. */
  get currentChunks(): SendChunkChange[] {
    return [...this.chunks].map(([chunk, { words }]) => ({ chunk, buffer: words.buffer as SharedArrayBuffer }));
  }

  /** Calls `listener` for each chunk added or dropped from now on; returns the unsubscribe. */
  onChange(listener: (change: SendChunkChange) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Test and diagnostics: what a reader would read for peer `number` (undefined: no entry). */
  read(number: number, out: SendTarget = newSendTarget()): SendTarget | undefined {
    const words = this.chunks.get(number >> CHUNK_SHIFT)?.words;
    if (words === undefined) return undefined;
    readSendTarget(words, number & (CHUNK_ENTRIES - 1), out);
    return out;
  }

  /** How many chunks exist (tests: chunks go with their last peer). */
  get chunkCount(): number {
    return this.chunks.size;
  }
}

/** A chunk added (with its buffer) or dropped (buffer undefined). */
export interface SendChunkChange {
  chunk: number;
  buffer: SharedArrayBuffer | undefined;
}
