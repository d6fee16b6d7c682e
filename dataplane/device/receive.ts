/**
 * The inbound pipeline (wireguard-go's receive.go, in stages):
 *
 *   UDP datagrams of one event-loop turn -> handshake messages: straight to the core (main thread)
 *                                        -> transport data: receiver index -> keypair, copied into
 *                                           a shared-memory batch per keypair (main thread)
 *   -> open the batch in a crypto worker, in place
 *   -> per peer, in arrival order: replay window, key confirmation, timers, roaming, padding,
 *      allowed-IPs source check, TUN write (core.finishTransport, main thread)
 *
 * A small transport message whose peer has nothing in the pipeline is opened and delivered at
 * once on the main thread (DIRECT_MAX_BYTES, send.ts); the datagrams behind it queue as usual.
 *
 * The bind hands over one datagram per call (FfiUdpBind: each datagram of a receive ring slot,
 * a UDP GRO run split into its datagrams); everything that arrives before the next "check" phase
 * of the event loop (setImmediate) forms one batch.
 *
 * A handshake message handled in the same turn may retire the keypair a batch is being filled
 * for. Each batch therefore holds its keypair from its first datagram until it is delivered or
 * dropped (so the keys it is opened with are never zeroed under it), and a retired keypair's
 * batch is dropped, counted as 'keypair-retired', when it is dispatched to the pool and again
 * before each packet is delivered (core.finishTransport).
 */
import type { WireGuardCore, IncomingTransport, Peer } from '../core.ts';
import type { Endpoint } from '../net/endpoint.ts';
import { dropReasonOf, type CryptoPool } from '../pool/crypto-pool.ts';
import type { Keypair } from '../session/keypair.ts';
import { BatchPool, BATCH_CAPACITY, type PacketBatch } from '../pool/packet-batch.ts';
import { MESSAGE_TRANSPORT, TRANSPORT_MIN_SIZE } from '../noise/messages.ts';
import { openTransport, TRANSPORT_OVERHEAD, ZERO_KEY } from '../session/transport.ts';
import { SLOT_ZERO_KEY } from '../pool/batch-crypto.ts';
import { DIRECT_MAX_BYTES, MAX_IN_FLIGHT_BATCHES } from './send.ts';

interface InboundBatch {
  peer: Peer;
  /** Held (Keypair.hold) from newBatch until recycle. */
  keypair: Keypair;
  batch: PacketBatch;
  /** Datagram length and source of each slot (kept for counters and roaming). */
  sizes: number[];
  sources: Endpoint[];
}

export class InboundPipeline {
  private readonly filling = new Map<Keypair, InboundBatch>();
  private readonly inOrder = new WeakMap<Peer, Promise<void>>();
  private readonly scratch: IncomingTransport = { peer: null, keypair: null, counter: 0 };
  private flushScheduled = false;
  private readonly spare: InboundBatch[] = [];
  /** Per peer, batches dispatched and not yet delivered. */
  private readonly inFlight = new Map<Peer, number>();
  /** Plaintext of a datagram opened at once (the direct path). */
  private readonly plaintextBuffer: Uint8Array;

  constructor(
    private readonly core: WireGuardCore,
    private readonly pool: CryptoPool,
    private readonly batches: BatchPool,
    /** Brackets each batch's delivery (the device then writes the batch's packets to the TUN at once). */
    private readonly delivery?: { begin(): void; end(): void },
  ) {
    this.plaintextBuffer = new Uint8Array(batches.slotSize);
  }

  /** Handles one datagram from the bind. */
  receive(datagram: Uint8Array, source: Endpoint): void {
    if (datagram.length < TRANSPORT_MIN_SIZE || datagram[0] !== MESSAGE_TRANSPORT
      || datagram[1] !== 0 || datagram[2] !== 0 || datagram[3] !== 0 || datagram.length > this.batches.slotSize) {
      // Handshakes, cookie replies, malformed and oversized messages: the core handles them at once.
      this.core.receiveDatagram(datagram, source);
      return;
    }
    const incoming = this.scratch;
    if (!this.core.beginTransport(datagram, incoming)) return;
    const keypair = incoming.keypair!;
    let pending = this.filling.get(keypair);
    if (!pending && datagram.length <= DIRECT_MAX_BYTES + TRANSPORT_OVERHEAD
      && !this.inFlight.has(incoming.peer!) && !this.fillingFor(incoming.peer!)) {
      // Nothing of this peer's in the pipeline: open and deliver this one now (the core's direct
      // path), so a lone packet waits for no batch; what follows in this turn is batched behind it.
      const plaintext = openTransport(this.core.crypto, keypair.receiveKey, incoming.counter, datagram, this.plaintextBuffer);
      if (plaintext === null || plaintext === ZERO_KEY) {
        this.core.drops.count(plaintext === null ? 'decryption-failed' : 'zero-key');
        return;
      }
      this.core.finishTransport(incoming.peer!, keypair, incoming.counter, plaintext, datagram.length, source);
      return;
    }
    if (!pending) {
      pending = this.newBatch(incoming.peer!, keypair);
      this.filling.set(keypair, pending);
    }
    const { batch } = pending;
    const i = batch.count++;
    batch.slot(i).set(datagram);
    batch.lengths[i] = datagram.length;
    batch.counters[i] = incoming.counter;
    pending.sizes[i] = datagram.length;
    pending.sources[i] = source;
    if (batch.full) {
      this.filling.delete(keypair);
      this.dispatch(pending);
    } else if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(this.flush);
    }
  }

  private newBatch(peer: Peer, keypair: Keypair): InboundBatch {
    keypair.hold();
    const reused = this.spare.pop();
    if (reused) {
      reused.peer = peer;
      reused.keypair = keypair;
      reused.batch = this.batches.acquire();
      return reused;
    }
    return {
      peer, keypair, batch: this.batches.acquire(),
      sizes: new Array<number>(BATCH_CAPACITY).fill(0),
      sources: new Array<Endpoint>(BATCH_CAPACITY),
    };
  }

  private readonly flush = (): void => {
    this.flushScheduled = false;
    for (const pending of this.filling.values()) this.dispatch(pending);
    this.filling.clear();
  };

  private dispatch(pending: InboundBatch): void {
    if (pending.keypair.retired) {
      // Retired while the batch filled (a handshake, a key change or the peer's removal in this turn).
      this.core.drops.count('keypair-retired', pending.batch.count);
      this.recycle(pending);
      return;
    }
    const peer = pending.peer;
    const inFlight = this.inFlight.get(peer) ?? 0;
    if (inFlight >= MAX_IN_FLIGHT_BATCHES) {
      // The peer's batches do not come back fast enough (or at all): bounded, see send.ts.
      this.core.drops.count('queue-full', pending.batch.count);
      this.recycle(pending);
      return;
    }
    // The outcome as a value; a failed batch still waits for the ones before it (see send.ts).
    const opened = this.pool.open(pending.batch, pending.keypair.receiveKey).then(() => undefined, (err: unknown) => err ?? new Error('open failed'));
    const previous = this.inOrder.get(peer);
    this.inFlight.set(peer, inFlight + 1);
    const step = (failure: unknown) => {
      this.landed(peer);
      if (failure === undefined) return this.deliver(pending);
      this.core.drops.count(dropReasonOf(failure), pending.batch.count);
      this.recycle(pending);
    };
    const after = () => opened;
    const done = (previous ? previous.then(after, after) : opened).then(step);
    this.inOrder.set(peer, done);
  }

  /** Whether a batch of `peer`'s (under any of its keypairs) is being filled in this turn. */
  private fillingFor(peer: Peer): boolean {
    for (const pending of this.filling.values()) if (pending.peer === peer) return true;
    return false;
  }

  private landed(peer: Peer): void {
    const left = (this.inFlight.get(peer) ?? 1) - 1;
    if (left > 0) this.inFlight.set(peer, left);
    else this.inFlight.delete(peer);
  }

  /** The ordered step: everything that must see packets in the order they arrived. */
  private deliver(pending: InboundBatch): void {
    const { peer, keypair, batch, sizes, sources } = pending;
    const delivery = this.delivery;
    delivery?.begin();
    try {
      for (let i = 0; i < batch.count; i++) {
        const length = batch.lengths[i];
        if (length < 0) {
          this.core.drops.count(length === SLOT_ZERO_KEY ? 'zero-key' : 'decryption-failed');
          continue;
        }
        const slot = batch.slot(i);
        this.core.finishTransport(peer, keypair, batch.counters[i], slot.subarray(16, 16 + length), sizes[i], sources[i]);
      }
    } finally {
      delivery?.end(); // before the batch's memory is reused
    }
    this.recycle(pending);
  }

  private recycle(pending: InboundBatch): void {
    pending.keypair.release(); // the keys may be zeroed now, the batch is done with them
    this.batches.release(pending.batch);
    pending.sources.fill(undefined as unknown as Endpoint, 0, pending.batch.count);
    if (this.spare.length < 64) this.spare.push(pending);
  }
}
