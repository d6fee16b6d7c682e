/**
 * WireGuardCore: a whole WireGuard device without I/O.
 *
 * Bytes in, bytes out: the caller feeds outbound IP packets (`sendPacket`), inbound UDP datagrams
 * with their source (`receiveDatagram`) and the passing of time (`tick`); datagrams to send and
 * packets to deliver come out through `CoreOutputs`. Time comes from an injected Clock. The core
 * never throws on input from the network: every rejected datagram is counted in `drops`.
 *
 * The daemon (device/) wraps this with a TUN device, UDP sockets and a crypto worker pool; the
 * tests drive it directly, two cores back to back in memory.
 */
import { AllowedIps } from './allowedips/allowedips.ts';
import { systemClock, type Clock } from './clock.ts';
import {
  DEFAULT_MTU, MAX_CONTENT_SIZE, OVERLOADED_COOKIE_REPLIES_PER_SECOND, OVERLOADED_COOKIE_REPLY_BURST,
  PRODUCTION_TIMINGS, REJECT_AFTER_MESSAGES_SAFE, THREAD_KEYPAIR_MARGIN_MS, UNDER_LOAD_AFTER_TIME, UNDER_LOAD_HANDSHAKES_PER_SECOND, UNDER_LOAD_QUEUE_LENGTH,
  type Timings,
} from './constants.ts';
import type { Crypto } from './crypto/primitives.ts';
import { DropCounters } from './drop-counters.ts';
import { parsePrefix } from './net/ip.ts';
import type { Endpoint } from './net/endpoint.ts';
import { CookieChecker } from './noise/cookie.ts';
import { clampPrivateKey, constantTimeEqual, isZeroKey, keyToHex } from './noise/keys.ts';
import {
  MESSAGE_COOKIE_REPLY, MESSAGE_INITIATION, MESSAGE_RESPONSE, RESPONSE, TRANSPORT, TRANSPORT_HEADER_SIZE,
  classifyMessage, innerPacketLength, readCounter, readU32,
} from './noise/messages.ts';
import { consumeInitiation, consumeResponse, type NoiseIdentity } from './noise/noise-protocol.ts';
import { RateLimiter } from './noise/ratelimiter.ts';
import { IndexTable, type IndexEntry } from './session/index-table.ts';
import type { Keypair } from './session/keypair.ts';
import { KeypairTable } from './session/keypair-table.ts';
import { PeerSendTable } from './session/send-table.ts';
import { SOURCE_REFUSED, ZERO_KEY_REFUSED as SEALER_ZERO_KEY_REFUSED } from './session/transport-sealer.ts';
import { Peer, type CoreOutputs, type PeerHost, type PeerOptions } from './session/peer.ts';
import { TRANSPORT_OVERHEAD, ZERO_KEY, openTransport } from './session/transport.ts';
import { DELIVERED, OPENED, REPLAYED, ZERO_KEY_REFUSED, type OpenedTransport } from './session/transport-opener.ts';

export { Peer, type CoreOutputs } from './session/peer.ts';

export interface CoreOptions {
  crypto: Crypto;
  outputs: CoreOutputs;
  clock?: Clock;
  /** 32 bytes; clamped on use. May be set later with setPrivateKey. */
  privateKey?: Uint8Array;
  /** The tunnel MTU: padding never goes past it. */
  mtu?: number;
  /** Shortened timers for tests; production code leaves this unset. */
  timings?: Partial<Timings>;
}

/** A transport message that passed the checks before decryption (filled in by beginTransport). */
export interface IncomingTransport {
  peer: Peer | null;
  keypair: Keypair | null;
  counter: number;
}

export interface AddPeerOptions extends PeerOptions {
  /** CIDR strings such as "10.0.0.2/32" or "fd00::/64". */
  allowedIps?: string[];
}

export class WireGuardCore implements PeerHost {
  readonly crypto: Crypto;
  readonly clock: Clock;
  readonly timings: Timings;
  readonly outputs: CoreOutputs;
  readonly drops = new DropCounters();
  readonly indexTable: IndexTable<Peer>;
  readonly keypairTable = new KeypairTable();
  /** Per peer, what a thread that sends on its own seals with and sends to (send-table.ts). */
  readonly sendTable = new PeerSendTable();
  private peerNumbers = 0;
  readonly allowedIps = new AllowedIps<Peer>();
  readonly rateLimiter = new RateLimiter();
  /**
   * Cookie replies per source while overloaded. A full table admits (answers) a new source: this
   * limiter only sheds work, it must never be the reason a new peer gets no cookie.
   */
  readonly cookieReplyLimiter = new RateLimiter({
    packetsPerSecond: OVERLOADED_COOKIE_REPLIES_PER_SECOND, burst: OVERLOADED_COOKIE_REPLY_BURST, admitWhenFull: true,
  });
  readonly sendBuffer = new Uint8Array(MAX_CONTENT_SIZE + TRANSPORT_OVERHEAD);
  private readonly receiveBuffer = new Uint8Array(65536);
  mtu: number;
  /** False while the device is down: peers do not start keepalives. */
  up = true;

  private privateKey: Uint8Array | undefined;
  private publicKey: Uint8Array | undefined;
  private cookieChecker: CookieChecker | undefined;
  private readonly peersByKey = new Map<string, Peer>();
  /** The same peers by number (Peer.number): how the books of another thread's work find theirs. */
  private readonly peersByNumber = new Map<number, Peer>();
  private underLoadUntil = -Infinity;
  private overloadedUntil = -Infinity;
  private handshakeWindowStart = -Infinity;
  private handshakesInWindow = 0;

  constructor(options: CoreOptions) {
    this.crypto = options.crypto;
    this.outputs = options.outputs;
    this.clock = options.clock ?? systemClock;
    this.timings = { ...PRODUCTION_TIMINGS, ...options.timings };
    this.mtu = options.mtu ?? DEFAULT_MTU;
    this.indexTable = new IndexTable<Peer>(() => {
      const b = this.crypto.randomBytes(4);
      return (b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24)) >>> 0;
    });
    if (options.privateKey) this.setPrivateKey(options.privateKey);
  }

  // --- Configuration ---

  get identity(): NoiseIdentity {
    return { crypto: this.crypto, staticPrivate: this.privateKey, staticPublic: this.publicKey };
  }

  get ourPublicKey(): Uint8Array | undefined {
    return this.publicKey;
  }

  get ourPrivateKey(): Uint8Array | undefined {
    return this.privateKey;
  }

  /**
   * Sets (or, with all zeros, clears) our static private key. Peers whose public key equals our
   * new public key are removed, and every existing session ends. The replaced key is wiped (here
   * and in the crypto provider, which may keep a prepared form of the current one).
   */
  setPrivateKey(key: Uint8Array): void {
    if (key.length !== 32) throw new Error(`a private key has 32 bytes, got ${key.length}`);
    const previous = this.privateKey;
    if (isZeroKey(key)) {
      this.privateKey = undefined;
      this.publicKey = undefined;
      this.cookieChecker = undefined;
    } else {
      this.privateKey = clampPrivateKey(key);
      this.crypto.replaceStaticKey?.(this.privateKey, undefined);
      this.publicKey = this.crypto.publicKey(this.privateKey);
      this.cookieChecker = new CookieChecker(this.crypto, this.publicKey, this.timings.cookieRefreshTime);
      const self = this.peersByKey.get(keyToHex(this.publicKey));
      if (self) this.removePeer(self.publicKey);
    }
    for (const peer of this.peersByKey.values()) peer.identityChanged();
    if (previous !== undefined && (this.privateKey === undefined || !constantTimeEqual(previous, this.privateKey))) {
      this.crypto.replaceStaticKey?.(undefined, previous);
    }
    previous?.fill(0);
  }

  /** Adds a peer (keyed by public key). Throws if the key is malformed or is our own. */
  addPeer(publicKey: Uint8Array, options: AddPeerOptions = {}): Peer {
    if (publicKey.length !== 32) throw new Error(`a peer public key has 32 bytes, got ${publicKey.length}`);
    if (this.publicKey && constantTimeEqual(publicKey, this.publicKey)) {
      throw new Error('a peer cannot have our own public key');
    }
    const id = keyToHex(publicKey);
    if (this.peersByKey.has(id)) throw new Error('a peer with this public key exists already');
    const prefixes = (options.allowedIps ?? []).map((cidr) => parsePrefix(cidr));
    const peer = new Peer(this, publicKey, options);
    this.peersByKey.set(id, peer);
    this.peersByNumber.set(peer.number, peer);
    for (const prefix of prefixes) this.allowedIps.insert(prefix, peer);
    return peer;
  }

  getPeer(publicKey: Uint8Array): Peer | undefined {
    return this.peersByKey.get(keyToHex(publicKey));
  }

  get peers(): IterableIterator<Peer> {
    return this.peersByKey.values();
  }

  get peerCount(): number {
    return this.peersByKey.size;
  }

  removePeer(publicKey: Uint8Array): boolean {
    const id = keyToHex(publicKey);
    const peer = this.peersByKey.get(id);
    if (!peer) return false;
    this.peersByKey.delete(id);
    this.peersByNumber.delete(peer.number);
    this.allowedIps.removeByPeer(peer);
    peer.destroy();
    return true;
  }

  // --- Outbound ---

  /** Routes an outbound IP packet to its peer by destination address and sends or stages it. */
  sendPacket(packet: Uint8Array): void {
    this.route(packet)?.sendPacket(packet);
  }

  /**
   * The books of datagrams a Tun's own thread sealed (and, unless refused, sent) for peer number
   * `number` (tun.ts SentHandler): what sending them here would have recorded. A peer removed
   * meanwhile has no books left to keep.
   */
  keepBooksOfSent(number: number, outcome: number, datagrams: number, bytes: number): void {
    if (outcome === SEALER_ZERO_KEY_REFUSED) {
      this.drops.count('zero-key', datagrams); // unreachable under a hold: defence in depth
      return;
    }
    this.peersByNumber.get(number)?.keepBooksOfSent(bytes, outcome === SOURCE_REFUSED);
  }

  /** The peer an outbound packet goes to (cryptokey routing), or undefined (counted as a drop). */
  route(packet: Uint8Array): Peer | undefined {
    const peer = this.allowedIps.lookupPacketDestination(packet);
    if (!peer) {
      this.drops.count('no-route');
      return undefined;
    }
    if (packet.length > MAX_CONTENT_SIZE) {
      this.drops.count('packet-too-large');
      return undefined;
    }
    return peer;
  }

  // --- Inbound ---

  /** Handles one UDP datagram from `source`. Never throws on bad input; drops are counted. */
  receiveDatagram(datagram: Uint8Array, source: Endpoint): void {
    const kind = classifyMessage(datagram);
    if (!kind.ok) {
      this.drops.count(kind.reason);
      return;
    }
    switch (kind.type) {
      case MESSAGE_INITIATION:
      case MESSAGE_RESPONSE:
        if (this.admitHandshakeMessage(datagram, source)) {
          if (kind.type === MESSAGE_INITIATION) this.receiveInitiation(datagram, source);
          else this.receiveResponse(datagram, source);
        }
        return;
      case MESSAGE_COOKIE_REPLY:
        this.receiveCookieReply(datagram);
        return;
      default:
        this.receiveTransport(datagram, source);
    }
  }

  /**
   * The handshake gate, in wireguard-go's order: mac1 must be right; under load, mac2 must prove
   * a fresh cookie (else we answer with a cookie reply) and the source's rate limit must allow it.
   *
   * Overloaded (more arrives than the device can answer, see reportReceiveOverflow), a source that
   * had its share of cookie replies gets none for a while (counted as cookie-reply-shed): replies
   * are most of the work of a flood, and without shedding the kernel drops at random instead. A
   * message with a valid mac2 (a peer retrying with its cookie) is never shed, and a source that
   * has not asked lately (a peer coming up) still gets its cookie.
   */
  private admitHandshakeMessage(message: Uint8Array, source: Endpoint): boolean {
    const checker = this.cookieChecker;
    if (!checker || !checker.checkMac1(message)) {
      this.drops.count('bad-mac1');
      return false;
    }
    const now = this.clock.now();
    this.noteHandshakeArrival(now);
    if (!this.underLoad) return true;
    if (!checker.checkMac2(message, source.addressBytes, source.port, now)) {
      if (now < this.overloadedUntil && !this.cookieReplyLimiter.allow(source.addressBytes, now)) {
        this.drops.count('cookie-reply-shed');
        return false;
      }
      this.outputs.sendDatagram(source, checker.createReply(message, source.addressBytes, source.port, now));
      this.drops.count('cookie-required');
      return false;
    }
    if (!this.rateLimiter.allow(source.addressBytes, now)) {
      this.drops.count('rate-limited');
      return false;
    }
    return true;
  }

  private receiveInitiation(message: Uint8Array, source: Endpoint): void {
    const now = this.clock.now();
    const result = consumeInitiation(this.identity, message, now, this.timings.handshakeInitiationRate,
      (key) => {
        const peer = this.peersByKey.get(keyToHex(key));
        return peer ? { peer, handshake: peer.handshake } : undefined;
      });
    if (typeof result === 'string') {
      this.drops.count(handshakeDropReason(result));
      return;
    }
    const { peer } = result;
    peer.rxBytes += message.length;
    peer.setEndpointFromPacket(source);
    peer.timers.anyAuthenticatedPacketTraversal(now);
    peer.timers.anyAuthenticatedPacketReceived();
    peer.sendHandshakeResponse();
  }

  private receiveResponse(message: Uint8Array, source: Endpoint): void {
    const entry = this.indexTable.lookup(readU32(message, RESPONSE.receiver));
    if (!entry || entry.keypair) {
      this.drops.count('unknown-index');
      return;
    }
    const { peer } = entry;
    const result = consumeResponse(this.identity, peer.handshake, message);
    if (result !== true) {
      this.drops.count(handshakeDropReason(result));
      return;
    }
    const now = this.clock.now();
    peer.rxBytes += message.length;
    peer.setEndpointFromPacket(source);
    peer.timers.anyAuthenticatedPacketTraversal(now);
    peer.timers.anyAuthenticatedPacketReceived();
    if (!peer.beginSession(now)) return;
    peer.handshakeCompletedAsInitiator();
  }

  private receiveCookieReply(message: Uint8Array): void {
    const entry = this.indexTable.lookup(readU32(message, 4));
    if (!entry || !entry.peer.cookieGenerator.consumeReply(message, this.clock.now())) {
      this.drops.count('bad-cookie-reply');
    }
  }

  private readonly incoming: IncomingTransport = { peer: null, keypair: null, counter: 0 };

  private receiveTransport(datagram: Uint8Array, source: Endpoint): void {
    const incoming = this.incoming;
    if (!this.beginTransport(datagram, incoming)) return;
    const keypair = incoming.keypair!;
    const plaintext = openTransport(this.crypto, keypair.receiveKey, incoming.counter, datagram, this.receiveBuffer);
    if (plaintext === null || plaintext === ZERO_KEY) {
      this.drops.count(plaintext === null ? 'decryption-failed' : 'zero-key');
      return;
    }
    this.finishTransport(incoming.peer!, keypair, incoming.counter, plaintext, datagram.length, source);
  }

  /**
   * A transport message the bind's opener already opened in place (session/transport-opener.ts),
   * or tried to: `opened` says how, and under which keypair slot. A refused one is counted after
   * the same checks as any transport message (beginTransport: index, age, counter limit). An
   * opened one counts only if its index still names the live keypair it was opened under (else
   * 'keypair-retired': retired or replaced since), then passes the same checks and
   * finishTransport, as if opened here.
   */
  receiveOpenedTransport(datagram: Uint8Array, source: Endpoint, opened: OpenedTransport): void {
    const incoming = this.incoming;
    const outcome = opened.outcome;
    if (outcome === DELIVERED) {
      this.keepBooksOfDelivered(datagram, source, opened);
      return;
    }
    if (outcome !== OPENED) {
      if (this.beginTransport(datagram, incoming)) {
        this.drops.count(outcome === REPLAYED ? 'replay' : outcome === ZERO_KEY_REFUSED ? 'zero-key' : 'decryption-failed');
      }
      return;
    }
    const keypair = this.openedUnder(datagram, opened)?.keypair;
    if (!keypair) {
      this.drops.count('keypair-retired');
      return;
    }
    if (!this.beginTransport(datagram, incoming)) return;
    const start = TRANSPORT_HEADER_SIZE;
    this.finishTransport(incoming.peer!, keypair, incoming.counter, datagram.subarray(start, start + opened.length), datagram.length, source);
  }

  /** The index entry of the datagram's receiver index, if it still names the live keypair it was opened under. */
  private openedUnder(datagram: Uint8Array, opened: OpenedTransport): IndexEntry<Peer> | undefined {
    const entry = this.indexTable.lookup(readU32(datagram, TRANSPORT.receiver));
    const keypair = entry?.keypair;
    if (!keypair || keypair.retired || keypair.at.slot !== opened.slot || keypair.at.generation !== opened.generation) return undefined;
    return entry;
  }

  /**
   * A transport message the bind's thread opened, checked and delivered itself (DELIVERED): what
   * finishTransport does besides the replay window and the delivery, off the packet's path. A
   * keypair gone since has nothing left to update.
   */
  private keepBooksOfDelivered(datagram: Uint8Array, source: Endpoint, opened: OpenedTransport): void {
    const entry = this.openedUnder(datagram, opened);
    if (entry) this.acceptAuthenticated(entry.peer, entry.keypair!, datagram.length, source, opened.length > 0);
  }

  /**
   * First half of receiving a transport message, before decryption: finds the keypair by
   * receiver index and checks its age and the counter limit. Returns null (counted) when the
   * datagram cannot be for a live session. The caller decrypts (here or in a worker) and then
   * calls `finishTransport` in per-peer order. Fills `into` rather than allocating. A caller that
   * queues the datagram holds the keypair until it is done (keypair.ts) and checks `retired`
   * before it opens the batch.
   */
  beginTransport(datagram: Uint8Array, into: IncomingTransport): boolean {
    const entry = this.indexTable.lookup(readU32(datagram, TRANSPORT.receiver));
    const keypair = entry?.keypair;
    if (!entry || !keypair) {
      this.drops.count('unknown-index');
      return false;
    }
    if (keypair.retired || this.clock.now() - keypair.created >= this.timings.rejectAfterTime) {
      this.drops.count('expired-keypair');
      return false;
    }
    const counter = readCounter(datagram, TRANSPORT.counter);
    if (counter >= REJECT_AFTER_MESSAGES_SAFE) {
      this.drops.count('counter-limit');
      return false;
    }
    into.peer = entry.peer;
    into.keypair = keypair;
    into.counter = counter;
    return true;
  }

  /**
   * Second half, after successful decryption, in the order packets arrived for this peer: the
   * replay window (only now, so forged packets cannot move it), key confirmation, timers,
   * roaming, padding removal, the inbound cryptokey-routing check, delivery. A keypair retired
   * since beginTransport (a handshake, expiry, a key change or the peer's removal in between)
   * delivers nothing: whatever was opened under it no longer counts as authenticated.
   */
  finishTransport(peer: Peer, keypair: Keypair, counter: number, plaintext: Uint8Array, datagramLength: number, source: Endpoint): void {
    if (keypair.retired) {
      this.drops.count('keypair-retired');
      return;
    }
    if (!keypair.replay.check(counter)) {
      this.drops.count('replay');
      return;
    }
    this.acceptAuthenticated(peer, keypair, datagramLength, source, plaintext.length > 0);
    if (plaintext.length === 0) return; // keepalive

    const length = innerPacketLength(plaintext, 0, plaintext.length);
    if (length < 0) {
      this.drops.count('bad-inner-packet');
      return;
    }
    const packet = plaintext.subarray(0, length);
    // Cryptokey routing, inbound: the inner source must be an address this peer may use.
    if (this.allowedIps.lookupPacketSource(packet) !== peer) {
      this.drops.count('allowed-ips-mismatch');
      return;
    }
    this.outputs.deliverPacket(packet, peer);
  }

  /**
   * An authenticated, fresh transport message of `peer`'s under `keypair`: key confirmation, key
   * freshness, the timers, the byte counter and roaming (whoever delivers its packet).
   */
  private acceptAuthenticated(peer: Peer, keypair: Keypair, datagramLength: number, source: Endpoint, hasData: boolean): void {
    const now = this.clock.now();
    peer.receivedWithKeypair(keypair);
    peer.keepKeyFreshReceiving(now);
    peer.timers.anyAuthenticatedPacketTraversal(now);
    peer.timers.anyAuthenticatedPacketReceived();
    peer.rxBytes += datagramLength;
    peer.setEndpointFromPacket(source);
    if (hasData) peer.timers.dataReceived(now);
  }

  // --- Load and time ---

  /**
   * Load detection without a queue to measure: more than UNDER_LOAD_HANDSHAKES_PER_SECOND
   * handshake messages with a valid mac1 within one second (far above what even a large mesh
   * sends, far below what one core can process) switches cookies on for UNDER_LOAD_AFTER_TIME.
   */
  private noteHandshakeArrival(now: number): void {
    if (now - this.handshakeWindowStart >= 1000) {
      this.handshakeWindowStart = now;
      this.handshakesInWindow = 0;
    }
    if (++this.handshakesInWindow > UNDER_LOAD_HANDSHAKES_PER_SECOND) {
      this.underLoadUntil = now + UNDER_LOAD_AFTER_TIME;
    }
  }

  /**
   * A device with a handshake queue reports its length; at 128 or more it is "under load"
   * (cookies required) and stays so for one more second.
   */
  reportHandshakeBacklog(queued: number): void {
    if (queued >= UNDER_LOAD_QUEUE_LENGTH) this.underLoadUntil = this.clock.now() + UNDER_LOAD_AFTER_TIME;
  }

  /**
   * A device reports `dropped` more datagrams lost before the core could see them, because its
   * receive queue was full (the kernel's socket queue: SO_RXQ_OVFL). They are counted
   * (receive-queue-overflow), and the device is overloaded for UNDER_LOAD_AFTER_TIME: more arrives
   * than it answers, and a full queue drops at random, a legitimate peer's initiation as likely
   * as the flood's, so cookie replies are shed per source instead (see admitHandshakeMessage).
   */
  reportReceiveOverflow(dropped: number): void {
    if (!(dropped > 0)) return;
    this.drops.count('receive-queue-overflow', dropped);
    this.overloadedUntil = this.clock.now() + UNDER_LOAD_AFTER_TIME;
  }

  /**
   * A device reports how many received datagrams were waiting (`pending`, of the `capacity` it
   * holds) when it began to deliver them. While overloaded, a full backlog keeps it so: the flood
   * goes on, and ending the shedding would only let the kernel's queue overflow again (a full
   * backlog alone is no overload: it follows any pause of the main thread).
   */
  reportReceiveBacklog(pending: number, capacity: number): void {
    if (pending < capacity) return;
    const now = this.clock.now();
    if (now < this.overloadedUntil) this.overloadedUntil = now + UNDER_LOAD_AFTER_TIME;
  }

  get overloaded(): boolean {
    return this.clock.now() < this.overloadedUntil;
  }

  /** Forces the under-load state for `ms` from now (tests, and a device that measures load itself). */
  setUnderLoadFor(ms: number): void {
    this.underLoadUntil = this.clock.now() + ms;
  }

  get underLoad(): boolean {
    return this.clock.now() < this.underLoadUntil;
  }

  newPeerNumber(): number {
    return this.peerNumbers++;
  }

  /** Runs every peer's due timers and collects idle rate-limiter entries. */
  tick(): void {
    const now = this.clock.now();
    for (const peer of this.peersByKey.values()) {
      peer.timers.poll(now);
      this.stopReaderDeliveryNearExpiry(peer, now);
      peer.refreshSendState(now);
    }
    this.rateLimiter.collectGarbage(now);
    this.cookieReplyLimiter.collectGarbage(now);
  }

  /**
   * The receiving thread has no clock of ours: it stops delivering a keypair's packets itself
   * THREAD_KEYPAIR_MARGIN_MS before the keypair's reject-after time, and from then on the main
   * thread (beginTransport) decides, as for every packet before.
   */
  private stopReaderDeliveryNearExpiry(peer: Peer, now: number): void {
    // Runs for every peer on every tick: three comparisons, no allocation.
    const createdBefore = now - (this.timings.rejectAfterTime - THREAD_KEYPAIR_MARGIN_MS);
    const { previous, current, next } = peer.keypairs;
    if (previous?.readerDelivers && previous.created <= createdBefore) previous.stopReaderDelivery();
    if (current?.readerDelivers && current.created <= createdBefore) current.stopReaderDelivery();
    if (next?.readerDelivers && next.created <= createdBefore) next.stopReaderDelivery();
  }

  /**
   * The earliest time (monotonic ms) after `now` at which `tick` has work to do: a peer's timer,
   * or a keypair reaching THREAD_KEYPAIR_MARGIN_MS before its reject-after time (the tick then
   * takes it back from the threads: stopReaderDeliveryNearExpiry, refreshSendState). What was due
   * at `now` or before, the tick at `now` has done.
   */
  nextDeadline(now: number = this.clock.now()): number {
    let next = Infinity;
    const threadsUntil = this.timings.rejectAfterTime - THREAD_KEYPAIR_MARGIN_MS;
    const after = (keypair: Keypair | null) => {
      const at = keypair === null ? Infinity : keypair.created + threadsUntil;
      if (at > now && at < next) next = at;
    };
    for (const peer of this.peersByKey.values()) {
      next = Math.min(next, peer.timers.nextDeadline());
      const { previous, current, next: upcoming } = peer.keypairs;
      after(previous);
      after(current);
      after(upcoming);
    }
    return next;
  }

  /**
   * How long the device's timer may sleep without missing a deadline armed while it sleeps: less
   * than the shortest deadline an event can arm (timers.ts: a keepalive after a receive, a handshake
   * retransmit, a persistent keepalive of one second; a new keypair's thread margin), and at most
   * a second, which is also how often idle rate-limiter entries go.
   */
  longestTickMs(): number {
    const t = this.timings;
    return Math.max(1, Math.min(1000, t.keepaliveTimeout, t.rekeyTimeout, t.rejectAfterTime - THREAD_KEYPAIR_MARGIN_MS));
  }

  /** Bytes of headroom before and room after a packet that in-place sealing needs. */
  static readonly headroom = TRANSPORT_HEADER_SIZE;
}

function handshakeDropReason(error: string): 'handshake-replay' | 'handshake-flood' | 'unknown-peer' | 'handshake-failed' {
  switch (error) {
    case 'replayed-timestamp': return 'handshake-replay';
    case 'initiation-flood': return 'handshake-flood';
    case 'unknown-peer': return 'unknown-peer';
    default: return 'handshake-failed';
  }
}
