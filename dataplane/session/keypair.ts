/**
 * Transport keypairs and the previous/current/next slots a peer keeps (whitepaper §5.4.5, §6.1).
 *
 * - The initiator uses a new keypair at once: it becomes `current`, the old current `previous`.
 * - The responder may not send with a new keypair until the initiator has used it ("key
 *   confirmation"), so the keypair waits in `next` and is promoted when the first transport
 *   packet under it arrives.
 * - `previous` lets packets that were in flight during a rekey still be received.
 *
 * Lifetime. A keypair is valid from its handshake until the peer retires it (it fell out of the
 * slots, the peer was removed, the private key changed, the keys expired); retiring also
 * unregisters its index (the peer does both, see Peer.retireKeypair). Work queued for a keypair
 * (a batch waiting for the crypto pool, being sealed in a worker or waiting to be sent; a
 * datagram being opened by the UDP reader thread) holds it, and a keypair's key bytes are zeroed only once it is retired and
 * no hold is left. So a key is never zeroed while anything may still read it, and whoever uses a
 * keypair after queueing work checks `retired` at the point of use and drops the work instead
 * (counted as 'keypair-retired'): no datagram is
 * opened or sealed with a wiped key, and no packet of a retired keypair is delivered or sent
 * (the kernel's `is_valid` check).
 *
 * The keys and the hold count live in a shared-memory slot (keypair-table.ts), where the same
 * rule holds for other threads: a Keypair is the main thread's handle on its slot.
 */
import type { ReplayWindow } from './replay.ts';
import type { SessionKeys } from '../noise/noise-protocol.ts';
import {
  FREE, HOLDS_MASK, RETIRED, ZEROED, holdUnlessZeroed, release, reserveSendNonces, sendNoncesReserved, setSlotDeliveryPeer, slotDeliveryPeer, slotGeneration, slotKey, slotReplayWindow,
  slotState,
  type KeySlot, type KeypairTable,
} from './keypair-table.ts';

/** What a keypair's key reads as once it is zeroed (a fresh array each time: nobody can fill it). */
const zeros = () => new Uint8Array(32);

export class Keypair {
  readonly isInitiator: boolean;
  /** Our index: transport messages to us carry it as the receiver. */
  readonly localIndex: number;
  /** The peer's index: we put it into the messages we send. */
  readonly remoteIndex: number;
  /** Monotonic ms at which the handshake that made this keypair finished. */
  readonly created: number;
  /** In the keypair's slot: shared with a thread that receives under this keypair. */
  readonly replay: ReplayWindow;
  /** Where the keys and the hold count live (keypair-table.ts). */
  readonly at: KeySlot;
  /** Views of the slot's send and receive keys (valid while the slot is this keypair's). */
  private readonly views: readonly [Uint8Array, Uint8Array];

  /** Copies the session's keys into a slot of `table` and zeroes the session's copies. */
  constructor(keys: SessionKeys, created: number, private readonly table: KeypairTable) {
    this.at = table.allocate(keys.sendKey, keys.receiveKey);
    this.views = [slotKey(this.at.chunk, this.at.index, 0), slotKey(this.at.chunk, this.at.index, 1)];
    this.replay = slotReplayWindow(this.at.chunk, this.at.index);
    keys.sendKey.fill(0);
    keys.receiveKey.fill(0);
    this.isInitiator = keys.isInitiator;
    this.localIndex = keys.localIndex;
    this.remoteIndex = keys.remoteIndex;
    this.created = created;
  }

  /**
   * The slot's state word while the slot is still this keypair's; FREE once it was zeroed and
   * reused. (Only the main thread reuses slots, and it is the one calling, so the two loads
   * cannot straddle a reuse.)
   */
  private state(): number {
    const { chunk, index, generation } = this.at;
    const state = slotState(chunk, index);
    return slotGeneration(chunk, index) === generation ? state : FREE;
  }

  /** The counter the next packet sent under this keypair gets (the slot's, shared by every sealing thread). */
  get sendNonce(): number {
    return sendNoncesReserved(this.at.chunk, this.at.index);
  }

  /** Reserves `count` consecutive nonces for packets about to be sealed; returns the first. */
  reserveNonces(count: number): number {
    return reserveSendNonces(this.at.chunk, this.at.index, count);
  }

  /** The key we seal with: a view into the table, or zeros once the keys are zeroed. */
  get sendKey(): Uint8Array {
    return this.key(0);
  }

  /** The key we open with: a view into the table, or zeros once the keys are zeroed. */
  get receiveKey(): Uint8Array {
    return this.key(1);
  }

  private key(which: 0 | 1): Uint8Array {
    // Once zeroed, the slot may hold a newer keypair's keys: never hand out the view then.
    return (this.state() & ZEROED) === 0 ? this.views[which] : zeros();
  }

  /** True from the moment the peer retires it: nothing may be opened, delivered, sealed or sent under it after that. */
  get retired(): boolean {
    return (this.state() & RETIRED) !== 0;
  }

  /** True once the key bytes are zeros (retired, and the last hold released). */
  get keysZeroed(): boolean {
    return (this.state() & ZEROED) !== 0;
  }

  /**
   * Queued work holds the keypair until it is done with its keys: one hold per batch. Unlike a
   * worker's tryHold this also holds a retired keypair (the work then drops itself when it checks
   * `retired`), but never one whose keys are already gone.
   */
  hold(): void {
    const { chunk, index, generation } = this.at;
    if (!holdUnlessZeroed(chunk, index, generation)) throw new Error('Keypair.hold() after its keys were zeroed');
  }

  release(): void {
    if ((this.state() & HOLDS_MASK) === 0) throw new Error('Keypair.release() without a hold');
    release(this.at.chunk, this.at.index);
  }

  /** No longer valid (the caller unregisters its index); the keys are zeroed once no hold is left. */
  retire(): void {
    this.stopReaderDelivery();
    this.table.retire(this.at);
  }

  /**
   * The receiving thread may now deliver what it opens under this keypair itself, as packets of
   * peer number `peer` (the peer confirmed it; session/transport-opener.ts).
   */
  allowReaderDelivery(peer: number): void {
    if (slotGeneration(this.at.chunk, this.at.index) === this.at.generation && !this.retired) setSlotDeliveryPeer(this.at.chunk, this.at.index, peer);
  }

  /** From now on the receiving thread leaves this keypair's packets to the main thread (it nears expiry, or is retired). */
  stopReaderDelivery(): void {
    if (slotGeneration(this.at.chunk, this.at.index) === this.at.generation) setSlotDeliveryPeer(this.at.chunk, this.at.index, -1);
  }

  /** Whether the receiving thread may deliver this keypair's packets itself. */
  get readerDelivers(): boolean {
    return slotGeneration(this.at.chunk, this.at.index) === this.at.generation && slotDeliveryPeer(this.at.chunk, this.at.index) >= 0;
  }
}

export class Keypairs {
  previous: Keypair | null = null;
  current: Keypair | null = null;
  next: Keypair | null = null;

  /**
   * Installs a keypair from a finished handshake. Returns the keypairs that fell out of use so the
   * caller can unregister their indices and retire them.
   */
  install(keypair: Keypair): Keypair[] {
    const dropped: Keypair[] = [];
    if (keypair.isInitiator) {
      if (this.next) {
        // The responder side never confirmed `next`; it is newer than `current`, so keep it as the
        // fallback for in-flight packets and drop `current`.
        if (this.current) dropped.push(this.current);
        if (this.previous) dropped.push(this.previous);
        this.previous = this.next;
        this.next = null;
      } else {
        if (this.previous) dropped.push(this.previous);
        this.previous = this.current;
      }
      this.current = keypair;
    } else {
      if (this.next) dropped.push(this.next);
      if (this.previous) dropped.push(this.previous);
      this.next = keypair;
      this.previous = null;
    }
    return dropped;
  }

  /**
   * Key confirmation: the first packet under `next` makes it current. Returns the dropped keypair
   * (the old previous) if the received keypair was `next`, `undefined` if nothing changed.
   */
  confirm(received: Keypair): { dropped: Keypair | null } | undefined {
    if (this.next !== received) return undefined;
    const dropped = this.previous;
    this.previous = this.current;
    this.current = received;
    this.next = null;
    return { dropped };
  }

  /** Removes and returns all keypairs (the caller unregisters and retires them). */
  clear(): Keypair[] {
    const all = [this.previous, this.current, this.next].filter((k): k is Keypair => k !== null);
    this.previous = this.current = this.next = null;
    return all;
  }
}
