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
 * (a batch waiting for the crypto pool, being opened or sealed in a worker, or waiting to be
 * delivered or sent) holds it, and a keypair's key bytes are zeroed only once it is retired and
 * no hold is left. So a key is never zeroed while anything may still read it, and whoever uses a
 * keypair after queueing work checks `retired` at the point of use and drops the work instead
 * (counted as 'keypair-retired' inbound, 'sending-keypair-retired' outbound): no datagram is
 * opened or sealed with a wiped key, and no packet of a retired keypair is delivered or sent
 * (the kernel's `is_valid` check).
 */
import { ReplayWindow } from './replay.ts';
import type { SessionKeys } from '../noise/noise-protocol.ts';

export class Keypair {
  readonly sendKey: Uint8Array;
  readonly receiveKey: Uint8Array;
  readonly isInitiator: boolean;
  /** Our index: transport messages to us carry it as the receiver. */
  readonly localIndex: number;
  /** The peer's index: we put it into the messages we send. */
  readonly remoteIndex: number;
  /** Monotonic ms at which the handshake that made this keypair finished. */
  readonly created: number;
  /** The counter the next packet sent under this keypair gets. */
  sendNonce = 0;
  readonly replay = new ReplayWindow();
  private isRetired = false;
  private zeroed = false;
  /** Queued batches that still use this keypair's keys. */
  private holds = 0;

  constructor(keys: SessionKeys, created: number) {
    this.sendKey = keys.sendKey;
    this.receiveKey = keys.receiveKey;
    this.isInitiator = keys.isInitiator;
    this.localIndex = keys.localIndex;
    this.remoteIndex = keys.remoteIndex;
    this.created = created;
  }

  /** True from the moment the peer retires it: nothing may be opened, delivered, sealed or sent under it after that. */
  get retired(): boolean {
    return this.isRetired;
  }

  /** True once the key bytes are zeros (retired, and the last hold released). */
  get keysZeroed(): boolean {
    return this.zeroed;
  }

  /** Queued work holds the keypair until it is done with its keys: one hold per batch. */
  hold(): void {
    this.holds++;
  }

  release(): void {
    if (this.holds <= 0) throw new Error('Keypair.release() without a hold');
    if (--this.holds === 0 && this.isRetired) this.zeroKeys();
  }

  /** No longer valid (the caller unregisters its index); the keys are zeroed once no hold is left. */
  retire(): void {
    this.isRetired = true;
    if (this.holds === 0) this.zeroKeys();
  }

  private zeroKeys(): void {
    this.sendKey.fill(0);
    this.receiveKey.fill(0);
    this.zeroed = true;
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
