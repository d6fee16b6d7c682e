/**
 * The main thread's outbound pipeline, for the packets the TUN did not seal and send where it read
 * them (tun/reader-sender.ts: a peer whose send-table entry names nothing, such as one without a
 * session, or in the last second of a keypair's life). In stages, as wireguard-go's send.go:
 *
 *   TUN batch -> route each packet by allowed IPs (main thread)
 *             -> group per peer into a shared-memory batch, assign nonces in order (main thread)
 *             -> seal the batch in a crypto worker, in place
 *             -> per peer, in order: send the datagrams (the whole batch in one bind.sendBatch
 *                when the bind has it), run the timer hooks (main thread)
 *
 * Packets for a peer without a usable session take the core's staging path instead (a handshake
 * starts; they leave once it completes). A lone small packet (see DIRECT_MAX_BYTES) whose peer has
 * nothing in the pipeline takes the core's direct path: an idle ping then costs no batch, no
 * worker round trip and no promise turn.
 *
 * Each batch holds its keypair (keypair.ts) from the moment it is filled until its datagrams left
 * or were dropped, so the key a worker seals with is never zeroed under it; a keypair retired in
 * between (expiry, a key change, the peer's removal) has its batch dropped, counted as
 * 'sending-keypair-retired', before sealing and again before sending.
 */
import type { WireGuardCore, Peer } from '../core.ts';
import type { Bind } from '../bind/bind.ts';
import { dropReasonOf, type CryptoPool } from '../pool/crypto-pool.ts';
import type { Keypair } from '../session/keypair.ts';
import { BatchPool, type PacketBatch } from '../pool/packet-batch.ts';
import { SLOT_ZERO_KEY } from '../pool/batch-crypto.ts';

/**
 * Packets up to this size, alone in their TUN read or UDP delivery and with nothing of their
 * peer's in the pipeline, are sealed or opened at once on the main thread (a few microseconds)
 * instead of taking the batch pipeline: see the bench's idle ping.
 */
export const DIRECT_MAX_BYTES = 256;

/**
 * Batches of one peer in flight (dispatched, not yet sent or delivered), per direction. Past it
 * a batch is dropped ('queue-full'): a peer whose batches do not come back (a stalled worker)
 * must not hold more memory without limit. 128 batches are up to 16384 packets, far more than
 * the workers need to stay busy.
 */
export const MAX_IN_FLIGHT_BATCHES = 128;

interface PendingBatch {
  peer: Peer;
  /** Held (Keypair.hold) from the batch's first packet until it is sent or dropped. */
  keypair: Keypair;
  batch: PacketBatch;
}

export class OutboundPipeline {
  /** Batches being filled during this TUN read, one per peer. */
  private readonly filling = new Map<Peer, PendingBatch>();
  /** Per peer, the promise of its last batch's sending: the next batch sends after it. */
  private readonly inOrder = new WeakMap<Peer, Promise<void>>();
  /** Per peer, batches dispatched and not yet sent. */
  private readonly inFlight = new Map<Peer, number>();

  constructor(
    private readonly core: WireGuardCore,
    private readonly bind: Bind,
    private readonly pool: CryptoPool,
    private readonly batches: BatchPool,
  ) {}

  /** Handles one batch of packets read from the TUN device. */
  handle(packets: Uint8Array[], count: number): void {
    if (count === 1 && packets[0].length <= DIRECT_MAX_BYTES) {
      // A lone small packet (a ping, an ACK, a DNS query) with nothing of its peer's still in the
      // pipeline takes the core's direct path: sealed and sent now, without a batch or a promise
      // turn. Bulk data stays in the pipeline, where the workers seal it in parallel.
      const peer = this.core.route(packets[0]);
      if (!peer) return;
      if (!this.inFlight.has(peer)) {
        peer.sendPacket(packets[0]);
        return;
      }
    }
    const now = this.core.clock.now();
    const room = this.batches.slotSize - 32 - 15;
    for (let i = 0; i < count; i++) {
      const packet = packets[i];
      const peer = this.core.route(packet);
      if (!peer) continue;
      let pending = this.filling.get(peer);
      if (!pending) {
        const keypair = packet.length <= room ? peer.sendableKeypair(now) : null;
        if (!keypair) {
          peer.sendPacket(packet); // staging path: handshake first, or oversized
          continue;
        }
        keypair.hold();
        pending = { peer, keypair, batch: this.batches.acquire() };
        this.filling.set(peer, pending);
      } else if (packet.length > room) {
        peer.sendPacket(packet);
        continue;
      }
      const batch = pending.batch;
      batch.slot(batch.count).set(packet, 16);
      batch.lengths[batch.count] = packet.length;
      batch.count++;
      if (batch.full) {
        this.dispatch(pending);
        this.filling.delete(peer);
      }
    }
    for (const pending of this.filling.values()) this.dispatch(pending);
    this.filling.clear();
  }

  /** Reserves nonces in order, hands the batch to a worker and queues its sending behind the peer's previous batch. */
  private dispatch({ peer, keypair, batch }: PendingBatch): void {
    if (keypair.retired) {
      this.core.drops.count('sending-keypair-retired', batch.count);
      this.finished(keypair, batch);
      return;
    }
    const inFlight = this.inFlight.get(peer) ?? 0;
    if (inFlight >= MAX_IN_FLIGHT_BATCHES) {
      this.core.drops.count('queue-full', batch.count);
      this.finished(keypair, batch);
      return;
    }
    const first = keypair.reserveNonces(batch.count);
    for (let i = 0; i < batch.count; i++) batch.counters[i] = first + i;
    let sentData = false;
    for (let i = 0; i < batch.count; i++) if (batch.lengths[i] > 0) { sentData = true; break; }
    // The outcome, as a value: a failed batch still waits for the batches before it, so that it
    // neither lets the next batch overtake them nor returns its memory while they are pending.
    const sealed = this.pool.seal(batch, keypair.sendKey, keypair.remoteIndex, this.core.mtu).then(() => undefined, (err: unknown) => err ?? new Error('seal failed'));
    const previous = this.inOrder.get(peer);
    this.inFlight.set(peer, inFlight + 1);
    const step = (failure: unknown) => {
      this.landed(peer);
      if (failure === undefined) return this.transmit(peer, keypair, batch, sentData);
      this.core.drops.count(dropReasonOf(failure), batch.count);
      this.finished(keypair, batch);
    };
    // Runs after the previous step even when that one threw, so one bug cannot stop the chain.
    const after = () => sealed;
    const done = (previous ? previous.then(after, after) : sealed).then(step);
    this.inOrder.set(peer, done);
  }

  private landed(peer: Peer): void {
    const left = (this.inFlight.get(peer) ?? 1) - 1;
    if (left > 0) this.inFlight.set(peer, left);
    else this.inFlight.delete(peer);
  }

  /** The batch is done with its keypair's keys and its memory. */
  private finished(keypair: Keypair, batch: PacketBatch): void {
    keypair.release();
    this.batches.release(batch);
  }

  private transmit(peer: Peer, keypair: Keypair, batch: PacketBatch, sentData: boolean): void {
    const endpoint = peer.endpoint;
    if (keypair.retired) {
      // Retired while it was sealed (expiry, a key change, the peer's removal): that session is over.
      this.core.drops.count('sending-keypair-retired', batch.count);
    } else if (batch.count > 0 && batch.lengths[0] === SLOT_ZERO_KEY) {
      this.core.drops.count('zero-key', batch.count); // the whole batch was refused (batch-crypto.ts)
    } else if (endpoint) {
      const { lengths, count } = batch;
      if (this.bind.sendBatch) {
        // The whole batch in one call (FfiUdpBind: one sendmmsg reading the shared slots in place).
        this.bind.sendBatch(endpoint, batch.data, batch.slotSize, lengths, count);
        for (let i = 0; i < count; i++) peer.txBytes += lengths[i];
      } else {
        for (let i = 0; i < count; i++) {
          const length = lengths[i];
          this.bind.send(endpoint, batch.slot(i).subarray(0, length));
          peer.txBytes += length;
        }
      }
      peer.packetsSent(this.core.clock.now(), sentData);
    } else {
      this.core.drops.count('no-endpoint', batch.count);
    }
    this.finished(keypair, batch);
  }
}
