/**
 * One WireGuard peer: its handshake, keypairs, timers, staged packets and endpoint.
 *
 * The peer implements the protocol's send-side rules (when to handshake, when to send a
 * keepalive, when keys are too old) and the ordered receive-side steps (key confirmation, timer
 * hooks, roaming). It does no I/O: datagrams leave through `host.outputs`.
 */
import {
  MAX_STAGED_PACKETS, REJECT_AFTER_MESSAGES_SAFE, REKEY_AFTER_MESSAGES_SAFE, THREAD_KEYPAIR_MARGIN_MS, type Timings,
} from '../constants.ts';
import type { Clock } from '../clock.ts';
import type { Crypto } from '../crypto/primitives.ts';
import type { DropCounters } from '../drop-counters.ts';
import type { Endpoint } from '../net/endpoint.ts';
import { CookieGenerator } from '../noise/cookie.ts';
import { shortKey } from '../noise/keys.ts';
import {
  Handshake, HandshakeState, createInitiation, createResponse, deriveSessionKeys, precomputeStaticStatic,
  type NoiseIdentity,
} from '../noise/noise-protocol.ts';
import type { IndexTable } from './index-table.ts';
import { Keypair, Keypairs } from './keypair.ts';
import type { KeypairTable } from './keypair-table.ts';
import type { PeerSendTable } from './send-table.ts';
import { PeerTimers, type TimerActions } from './timers.ts';
import { TRANSPORT_OVERHEAD, ZERO_KEY, sealTransportInPlace } from './transport.ts';
import { TRANSPORT_HEADER_SIZE } from '../noise/messages.ts';

/** Where the device's datagrams and packets go. Buffers passed in are valid only during the call. */
export interface CoreOutputs {
  sendDatagram(to: Endpoint, datagram: Uint8Array): void;
  deliverPacket(packet: Uint8Array, peer: Peer): void;
  /** The peer's endpoint changed because an authenticated packet came from a new address. */
  endpointChanged?(peer: Peer, endpoint: Endpoint): void;
  /** A handshake with the peer completed (keys are ready to use). */
  handshakeCompleted?(peer: Peer): void;
}

/** What a peer needs from its device. */
export interface PeerHost {
  readonly identity: NoiseIdentity;
  readonly crypto: Crypto;
  readonly clock: Clock;
  readonly timings: Timings;
  readonly indexTable: IndexTable<Peer>;
  /** Where every keypair's keys live (shared memory). */
  readonly keypairTable: KeypairTable;
  /** Where threads that send on their own learn each peer's keypair and endpoint. */
  readonly sendTable: PeerSendTable;
  /** A number no other peer of this device has had or will have (the receiving thread's name for a peer). */
  newPeerNumber(): number;
  readonly outputs: CoreOutputs;
  readonly drops: DropCounters;
  readonly mtu: number;
  readonly sendBuffer: Uint8Array;
  readonly up: boolean;
}

export interface PeerOptions {
  endpoint?: Endpoint;
  presharedKey?: Uint8Array;
  /** Seconds; 0 disables. */
  persistentKeepalive?: number;
}

export class Peer implements TimerActions {
  readonly publicKey: Uint8Array;
  /** This peer's number in the shared tables (allowed IPs, keypair slots), never reused. */
  readonly number: number;
  readonly handshake: Handshake;
  readonly cookieGenerator: CookieGenerator;
  readonly keypairs = new Keypairs();
  readonly timers: PeerTimers;
  private currentEndpoint: Endpoint | undefined;
  /** Packets waiting for a session, oldest first. */
  private staged: Uint8Array[] = [];
  /** Removed from its device: nothing is published for it any more. */
  private destroyed = false;

  txBytes = 0;
  rxBytes = 0;
  /** Wall-clock ms of the last completed handshake (0 = never), reported by the control socket. */
  lastHandshakeWallMs = 0;
  /** How often the endpoint changed because the peer roamed. */
  roamCount = 0;
  handshakeAttemptsTotal = 0;

  constructor(private readonly host: PeerHost, publicKey: Uint8Array, options: PeerOptions = {}) {
    if (publicKey.length !== 32) throw new Error(`a peer public key has 32 bytes, got ${publicKey.length}`);
    this.publicKey = Uint8Array.from(publicKey);
    this.number = host.newPeerNumber();
    this.handshake = new Handshake(this.publicKey);
    this.cookieGenerator = new CookieGenerator(host.crypto, this.publicKey, host.timings.cookieRefreshTime);
    this.timers = new PeerTimers(host.timings, this);
    host.sendTable.add(this.number);
    this.endpoint = options.endpoint;
    if (options.presharedKey) this.setPresharedKey(options.presharedKey);
    this.timers.persistentKeepaliveInterval = options.persistentKeepalive ?? 0;
    precomputeStaticStatic(host.identity, this.handshake);
  }

  /** Where this peer's datagrams go (configured, or learnt from its authenticated datagrams). */
  get endpoint(): Endpoint | undefined {
    return this.currentEndpoint;
  }

  set endpoint(endpoint: Endpoint | undefined) {
    this.currentEndpoint = endpoint;
    this.refreshSendState();
  }

  /** A short form of the public key for logs (never the private key). */
  get name(): string {
    return shortKey(this.publicKey);
  }

  get hasSession(): boolean {
    const current = this.keypairs.current;
    return current !== null && !current.retired && this.host.clock.now() - current.created < this.host.timings.rejectAfterTime;
  }

  get stagedCount(): number {
    return this.staged.length;
  }

  setPresharedKey(key: Uint8Array): void {
    if (key.length !== 32) throw new Error(`a preshared key has 32 bytes, got ${key.length}`);
    const old = this.handshake.presharedKey;
    this.handshake.presharedKey = Uint8Array.from(key);
    old.fill(0); // after the copy: `key` may be the old array itself
  }

  get presharedKey(): Uint8Array {
    return this.handshake.presharedKey;
  }

  get persistentKeepalive(): number {
    return this.timers.persistentKeepaliveInterval;
  }

  /** Sets the persistent keepalive interval (seconds); turning it on sends a keepalive at once. */
  setPersistentKeepalive(seconds: number): void {
    if (!Number.isInteger(seconds) || seconds < 0 || seconds > 65535) {
      throw new Error(`persistent keepalive must be 0..65535 seconds, got ${seconds}`);
    }
    const was = this.timers.persistentKeepaliveInterval;
    this.timers.persistentKeepaliveInterval = seconds;
    if (seconds === 0) this.timers.persistentKeepaliveAt = Infinity;
    else if (was === 0 && this.host.up) this.sendKeepalive();
  }

  /** Our private key changed: redo the static-static DH and stop using the old sessions. */
  identityChanged(): void {
    precomputeStaticStatic(this.host.identity, this.handshake);
    this.expireCurrentKeypairs();
  }

  // --- Sending ---

  /** Queues a copy of an outbound IP packet; the oldest packet is dropped when the queue is full. */
  stagePacket(packet: Uint8Array): void {
    if (this.staged.length >= MAX_STAGED_PACKETS) {
      this.staged.shift();
      this.host.drops.count('staged-overflow');
    }
    this.staged.push(Uint8Array.from(packet));
  }

  /** The keypair to send with now, or null when a (new) handshake is needed first. */
  private sendingKeypair(now: number): Keypair | null {
    const keypair = this.keypairs.current;
    if (!keypair || keypair.retired || keypair.sendNonce >= REJECT_AFTER_MESSAGES_SAFE
      || now - keypair.created >= this.host.timings.rejectAfterTime) return null;
    return keypair;
  }

  /**
   * For a pipelined device: the keypair to seal a batch with right now, or null when packets must
   * take the staging path (something is staged already, no usable session, or no endpoint).
   * The caller reserves nonces by advancing `keypair.sendNonce` and calls `packetsSent` after the
   * datagrams left, in order.
   */
  sendableKeypair(now: number): Keypair | null {
    if (this.staged.length !== 0 || !this.endpoint) return null;
    return this.sendingKeypair(now);
  }

  /**
   * Publishes what a thread that sends on its own (send-table.ts) seals this peer's packets with
   * and sends them to, or that the main thread sends them: sendableKeypair's rule, less the last
   * THREAD_KEYPAIR_MARGIN_MS of a keypair's life. Called wherever an input of that rule changes:
   * the endpoint; the current keypair (confirmed, retired; a new session as initiator sends its
   * staged packets or a keepalive at once, which refreshes); the staged packets sent or flushed
   * (packets are staged only while the entry names nothing already); and by the core's tick, for
   * the time. The nonce limit the sending thread checks itself, per packet.
   * keypair-lifetime-model.test.ts checks the entry against the rule after every random step.
   */
  refreshSendState(now = this.host.clock.now()): void {
    if (this.destroyed) return;
    let keypair = this.sendableKeypair(now);
    if (keypair !== null && now - keypair.created >= this.host.timings.rejectAfterTime - THREAD_KEYPAIR_MARGIN_MS) keypair = null;
    this.host.sendTable.publish(this.number, keypair, this.currentEndpoint);
  }

  /**
   * Sends one outbound packet: at once when a session is usable and nothing is waiting before it
   * (the common case: no copy into the staging queue), otherwise through the staging queue.
   */
  sendPacket(packet: Uint8Array): void {
    const now = this.host.clock.now();
    const keypair = this.staged.length === 0 ? this.sendingKeypair(now) : null;
    if (!keypair || !this.endpoint) {
      this.stagePacket(packet);
      this.sendStagedPackets();
      return;
    }
    this.sealAndSend(keypair, this.endpoint, packet);
    this.afterSending(now, packet.length > 0);
  }

  /**
   * Sends the staged packets if a usable session exists; otherwise starts a handshake and leaves
   * them staged.
   */
  sendStagedPackets(): void {
    if (this.staged.length === 0) return;
    const now = this.host.clock.now();
    const keypair = this.sendingKeypair(now);
    if (!keypair) {
      this.sendHandshakeInitiation(false);
      return;
    }
    const endpoint = this.endpoint;
    const packets = this.staged;
    this.staged = [];
    if (!endpoint) {
      this.host.drops.count('no-endpoint', packets.length);
      this.refreshSendState(now);
      return;
    }
    let sentData = false;
    for (const packet of packets) {
      this.sealAndSend(keypair, endpoint, packet);
      if (packet.length > 0) sentData = true;
    }
    this.refreshSendState(now); // before afterSending: a rekey it starts changes nothing here
    this.afterSending(now, sentData);
  }

  private sealAndSend(keypair: Keypair, endpoint: Endpoint, packet: Uint8Array): void {
    const buf = this.host.sendBuffer;
    if (packet.length + TRANSPORT_OVERHEAD > buf.length) {
      this.host.drops.count('packet-too-large');
      return;
    }
    buf.set(packet, TRANSPORT_HEADER_SIZE);
    const length = sealTransportInPlace(this.host.crypto, keypair.sendKey, keypair.remoteIndex,
      keypair.reserveNonces(1), buf, packet.length, this.host.mtu);
    if (length === ZERO_KEY) {
      this.host.drops.count('zero-key'); // unreachable: sendingKeypair() returns valid keypairs only
      return;
    }
    this.host.outputs.sendDatagram(endpoint, buf.subarray(0, length));
    this.txBytes += length;
  }

  /**
   * The books of datagrams another thread sealed and sent under this peer's send-table entry
   * (core.keepBooksOfSent): the bytes, the timers and the rekey checks, as after sending here.
   * `sourceRefused`: the kernel would not send from the endpoint's sticky source any more (the
   * address is gone), so it is forgotten, as the bind does for what it sends.
   */
  keepBooksOfSent(bytes: number, sourceRefused: boolean): void {
    const now = this.host.clock.now();
    this.txBytes += bytes;
    const endpoint = this.currentEndpoint;
    if (sourceRefused && endpoint?.local !== undefined) {
      endpoint.local = undefined;
      this.refreshSendState(now);
    }
    this.afterSending(now, true);
  }

  /** Timer hooks and rekey check after a batch left (wireguard-go's sequential sender). */
  packetsSent(now: number, sentData: boolean): void {
    this.afterSending(now, sentData);
  }

  private afterSending(now: number, sentData: boolean): void {
    this.timers.anyAuthenticatedPacketTraversal(now);
    this.timers.anyAuthenticatedPacketSent();
    if (sentData) this.timers.dataSent(now);
    this.keepKeyFreshSending(now);
  }

  /** Sends an empty transport message unless real packets are about to go anyway. */
  sendKeepalive(): void {
    if (this.staged.length === 0) this.staged.push(new Uint8Array(0));
    this.sendStagedPackets();
  }

  /** Rekey on the sending side: too many messages, or (as initiator) a key older than RekeyAfterTime. */
  private keepKeyFreshSending(now: number): void {
    const keypair = this.keypairs.current;
    if (!keypair) return;
    if (keypair.sendNonce > REKEY_AFTER_MESSAGES_SAFE
      || (keypair.isInitiator && now - keypair.created > this.host.timings.rekeyAfterTime)) {
      this.sendHandshakeInitiation(false);
    }
  }

  /**
   * Rekey on the receiving side: an initiator whose key nears RejectAfterTime starts one
   * "last-minute" handshake, so a peer that only receives still gets new keys in time.
   */
  keepKeyFreshReceiving(now: number): void {
    if (this.timers.sentLastMinuteHandshake) return;
    const keypair = this.keypairs.current;
    const t = this.host.timings;
    if (keypair && keypair.isInitiator && now - keypair.created > t.rejectAfterTime - t.keepaliveTimeout - t.rekeyTimeout) {
      this.timers.sentLastMinuteHandshake = true;
      this.sendHandshakeInitiation(false);
    }
  }

  /** Forces a handshake initiation now (still at most one per RekeyTimeout). */
  initiateHandshake(): void {
    this.sendHandshakeInitiation(false);
  }

  sendHandshakeInitiation(isRetry: boolean): void {
    if (!isRetry) this.timers.handshakeAttempts = 0;
    const now = this.host.clock.now();
    if (now - this.handshake.lastSentHandshake < this.host.timings.rekeyTimeout) return;
    this.handshake.lastSentHandshake = now;

    const localIndex = this.newHandshakeIndex();
    const message = createInitiation(this.host.identity, this.handshake, localIndex, this.host.clock.wallNow());
    if (typeof message === 'string') {
      this.host.indexTable.delete(localIndex);
      this.host.drops.count('handshake-failed');
      return;
    }
    this.cookieGenerator.addMacs(message, now);
    this.handshakeAttemptsTotal++;
    this.timers.anyAuthenticatedPacketTraversal(now);
    this.timers.anyAuthenticatedPacketSent();
    this.sendHandshakeMessage(message);
    this.timers.handshakeInitiated(now);
  }

  /**
   * Answers an initiation this peer's handshake has just consumed, then takes back our own
   * initiation if one was waiting for its answer (Handshake.setAsideOwnInitiation).
   */
  sendHandshakeResponse(): void {
    try {
      this.answerInitiation();
    } finally {
      this.handshake.resumeOwnInitiation();
    }
  }

  private answerInitiation(): void {
    const now = this.host.clock.now();
    this.handshake.lastSentHandshake = now;
    const localIndex = this.newHandshakeIndex();
    const message = createResponse(this.host.identity, this.handshake, localIndex);
    if (typeof message === 'string') {
      this.host.indexTable.delete(localIndex);
      this.host.drops.count('handshake-failed');
      return;
    }
    this.cookieGenerator.addMacs(message, now);
    if (!this.beginSession(now)) return;
    this.timers.anyAuthenticatedPacketTraversal(now);
    this.timers.anyAuthenticatedPacketSent();
    this.sendHandshakeMessage(message);
  }

  private sendHandshakeMessage(message: Uint8Array): void {
    if (!this.endpoint) {
      this.host.drops.count('no-endpoint');
      return;
    }
    this.host.outputs.sendDatagram(this.endpoint, message);
    this.txBytes += message.length;
  }

  /** A fresh index for a new handshake; the previous handshake's index (if still pending) is freed. */
  private newHandshakeIndex(): number {
    const table = this.host.indexTable;
    const old = this.handshake.localIndex;
    if (old !== 0) {
      const entry = table.lookup(old);
      if (entry && entry.peer === this && !entry.keypair) table.delete(old);
    }
    return table.newIndex(this);
  }

  /**
   * Turns the finished handshake into a keypair and installs it (initiator: current at once;
   * responder: next, until confirmed). Returns false if the handshake was not in a final state.
   */
  beginSession(now: number): boolean {
    const keys = deriveSessionKeys(this.host.crypto, this.handshake);
    if (typeof keys === 'string') {
      this.host.drops.count('handshake-failed');
      return false;
    }
    const keypair = new Keypair(keys, now, this.host.keypairTable);
    this.host.indexTable.attachKeypair(keypair.localIndex, keypair);
    for (const dropped of this.keypairs.install(keypair)) this.retireKeypair(dropped);
    // As initiator it is current at once: confirmed (the responder's waits for its first packet).
    if (this.keypairs.current === keypair) keypair.allowReaderDelivery(this.number);
    this.timers.sessionDerived(now);
    return true;
  }

  /** The initiator's side of a completed handshake: tell the responder, send what waited. */
  handshakeCompletedAsInitiator(): void {
    this.markHandshakeComplete();
    this.sendKeepalive(); // sends staged packets, or a keepalive that confirms the keys
  }

  /** Key confirmation on the responder: the first packet under `next` arrived. */
  receivedWithKeypair(keypair: Keypair): void {
    const confirmed = this.keypairs.confirm(keypair);
    if (!confirmed) return;
    keypair.allowReaderDelivery(this.number);
    if (confirmed.dropped) this.retireKeypair(confirmed.dropped);
    this.refreshSendState();
    // An initiation of ours that crossed theirs is no longer needed: forget its index and wipe
    // its ephemeral key now rather than at the next handshake.
    if (this.handshake.state === HandshakeState.InitiationCreated) this.abandonPendingHandshake();
    this.markHandshakeComplete();
    this.sendStagedPackets();
  }

  private markHandshakeComplete(): void {
    this.timers.handshakeComplete();
    this.lastHandshakeWallMs = this.host.clock.wallNow();
    this.host.outputs.handshakeCompleted?.(this);
  }

  /**
   * Roaming: an authenticated packet from a new address moves the endpoint there. One from the
   * same address that arrived on another of our local addresses (its sticky source, endpoint.ts)
   * takes the endpoint's place too, so replies leave from that address; that is no roam.
   */
  setEndpointFromPacket(source: Endpoint): void {
    const current = this.endpoint;
    if (source === current) return;
    if (source.equals(current)) {
      if (source.local !== current!.local) this.endpoint = source;
      return;
    }
    this.endpoint = source;
    this.roamCount++;
    this.host.outputs.endpointChanged?.(this, source);
  }

  /**
   * A keypair fell out of use: its index stops leading to it and it is no longer valid; its keys
   * are zeroed as soon as no queued batch holds it (keypair.ts).
   */
  private retireKeypair(keypair: Keypair): void {
    this.host.indexTable.delete(keypair.localIndex);
    keypair.retire();
    this.refreshSendState();
  }

  /**
   * Drops a handshake in progress: its index (one that has no keypair yet) stops leading to this
   * peer, then its secrets are wiped (in this order: clear() forgets which index it was).
   */
  private abandonPendingHandshake(): void {
    const pending = this.handshake.localIndex;
    if (pending !== 0) {
      const entry = this.host.indexTable.lookup(pending);
      if (entry && entry.peer === this && !entry.keypair) this.host.indexTable.delete(pending);
    }
    this.handshake.clear();
  }

  /** Makes the current sessions unusable for sending (a new handshake happens on next send). */
  expireCurrentKeypairs(): void {
    this.abandonPendingHandshake();
    this.handshake.lastSentHandshake = -Infinity;
    for (const keypair of this.keypairs.clear()) this.retireKeypair(keypair);
  }

  // --- TimerActions ---

  flushStagedPackets(): void {
    if (this.staged.length > 0) this.host.drops.count('handshake-gave-up', this.staged.length);
    this.staged = [];
    this.refreshSendState();
  }

  zeroKeyMaterial(): void {
    this.abandonPendingHandshake();
    for (const keypair of this.keypairs.clear()) this.retireKeypair(keypair);
    this.flushStagedPackets();
  }

  clearSourceAddress(): void {
    // The sans-I/O core keeps no local source address; the UDP layer may hook this later.
  }

  /** The peer is being removed: free its indices, retire its keypairs, zero its preshared key. */
  destroy(): void {
    this.timers.stopAll();
    this.zeroKeyMaterial();
    this.handshake.presharedKey.fill(0);
    this.destroyed = true;
    this.host.sendTable.remove(this.number);
  }
}
