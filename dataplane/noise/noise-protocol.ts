/**
 * The Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s handshake as WireGuard uses it (whitepaper §5.4).
 *
 * Sans-I/O: these functions turn handshake state plus bytes into messages and back. They never
 * send anything, never read the clock (times come in as arguments) and never throw on input from
 * the network: a message that fails a check returns a reason string.
 *
 * mac1/mac2 are not handled here (see cookie.ts): callers check mac1 before consuming and add the
 * MACs after creating.
 */
import type { Crypto } from '../crypto/primitives.ts';
import { isZeroKey, wipe } from './keys.ts';
import {
  INITIATION, INITIATION_SIZE, MESSAGE_INITIATION, MESSAGE_RESPONSE, RESPONSE, RESPONSE_SIZE,
  readU32, writeU32,
} from './messages.ts';
import { TAI64N_SIZE, tai64n, tai64nAfter } from './tai64n.ts';

export const CONSTRUCTION = 'Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s';
export const IDENTIFIER = 'WireGuard v1 zx2c4 Jason@zx2c4.com';

const encoder = new TextEncoder();
const EMPTY = new Uint8Array(0);
const ZERO_NONCE = new Uint8Array(12);

/**
 * The secrets one handshake step computes on the way (chaining keys, temporary AEAD keys `k`, DH
 * results, hashes, an ephemeral private key): each is registered as it is made, and all are
 * wiped when the step ends, whether it succeeded or failed. What the step keeps is copied into
 * the Handshake's own buffers first, so no secret outlives the step in a buffer nobody wipes.
 */
class Intermediates {
  private readonly secrets: Uint8Array[] = [];

  keep<T extends Uint8Array | null>(secret: T): T {
    if (secret !== null) this.secrets.push(secret);
    return secret;
  }

  keepAll<T extends Uint8Array[]>(secrets: T): T {
    for (const secret of secrets) this.secrets.push(secret);
    return secrets;
  }

  wipe(): void {
    for (const secret of this.secrets) secret.fill(0);
    this.secrets.length = 0;
  }
}

export enum HandshakeState {
  Zeroed,
  InitiationCreated,
  InitiationConsumed,
  ResponseCreated,
  ResponseConsumed,
}

/** The handshake state one peer keeps (wireguard-go's `Handshake`). */
export class Handshake {
  state = HandshakeState.Zeroed;
  hash: Uint8Array = new Uint8Array(32);
  chainKey: Uint8Array = new Uint8Array(32);
  presharedKey: Uint8Array = new Uint8Array(32);
  localEphemeralPrivate: Uint8Array = new Uint8Array(32);
  localIndex = 0;
  remoteIndex = 0;
  remoteEphemeral: Uint8Array = new Uint8Array(32);
  /** DH(our static, their static); null when the peer's key is invalid (low-order) or we have no key. */
  precomputedStaticStatic: Uint8Array | null = null;
  /** The newest TAI64N timestamp accepted from this peer: older or equal ones are replays. */
  lastTimestamp: Uint8Array = new Uint8Array(TAI64N_SIZE);
  /** Monotonic ms of the last initiation we consumed from this peer (flood limit). */
  lastInitiationConsumption = -Infinity;
  /** Monotonic ms of the last initiation we sent (at most one per RekeyTimeout). */
  lastSentHandshake = -Infinity;

  /** Our initiation while we answer the peer's (see setAsideOwnInitiation); localIndex 0 = none. */
  private readonly aside = { hash: new Uint8Array(32), chainKey: new Uint8Array(32), localEphemeralPrivate: new Uint8Array(32), localIndex: 0 };

  constructor(readonly remoteStatic: Uint8Array) {}

  /**
   * The peer's initiation is about to be consumed while ours waits for its answer: both sides
   * initiated at once (a key rotation's kick against the peer's new-peer handshake, a relay's
   * direct trial kicking both members). wireguard-go and the kernel let theirs overwrite ours;
   * each side then drops the other's response (its state no longer expects one), holds a
   * responder session it may not send on until the other confirms it, and both wait
   * REKEY_TIMEOUT (5 s) to retry. We keep ours aside instead, answer theirs, and take ours back
   * (resumeOwnInitiation), so the peer's response to it completes a session at once. Its index
   * moves aside with it, so the answer's new index does not free it.
   */
  setAsideOwnInitiation(): void {
    if (this.state !== HandshakeState.InitiationCreated) return;
    this.aside.hash.set(this.hash);
    this.aside.chainKey.set(this.chainKey);
    this.aside.localEphemeralPrivate.set(this.localEphemeralPrivate);
    this.aside.localIndex = this.localIndex;
    this.localIndex = 0;
  }

  /** Takes back the initiation set aside, once the peer's has been answered (or failed to be). */
  resumeOwnInitiation(): void {
    const aside = this.aside;
    if (aside.localIndex === 0) return;
    this.hash.set(aside.hash);
    this.chainKey.set(aside.chainKey);
    this.localEphemeralPrivate.set(aside.localEphemeralPrivate);
    this.localIndex = aside.localIndex;
    this.state = HandshakeState.InitiationCreated;
    aside.hash.fill(0);
    aside.chainKey.fill(0);
    aside.localEphemeralPrivate.fill(0);
    aside.localIndex = 0;
  }

  /**
   * Forgets the ephemeral secrets and chaining state (not the replay/flood history, nor the
   * preshared key and static-static DH, which are configuration). The buffers are zeroed in place:
   * the handshake functions only ever copy into them.
   */
  clear(): void {
    this.hash.fill(0);
    this.chainKey.fill(0);
    this.localEphemeralPrivate.fill(0);
    this.remoteEphemeral.fill(0);
    this.localIndex = 0;
    this.remoteIndex = 0;
    this.state = HandshakeState.Zeroed;
  }
}

/** Our side of the handshake: the crypto primitives and our static key pair. */
export interface NoiseIdentity {
  readonly crypto: Crypto;
  /** Our clamped static private key, or undefined when the device has no key yet. */
  readonly staticPrivate: Uint8Array | undefined;
  readonly staticPublic: Uint8Array | undefined;
}

/** HASH(CONSTRUCTION) and HASH(that ‖ IDENTIFIER), computed once per Crypto. */
export interface NoiseInitialValues {
  readonly chainKey: Uint8Array;
  readonly hash: Uint8Array;
}

const initialValuesCache = new WeakMap<Crypto, NoiseInitialValues>();

export function noiseInitialValues(crypto: Crypto): NoiseInitialValues {
  let values = initialValuesCache.get(crypto);
  if (!values) {
    const chainKey = crypto.hash(encoder.encode(CONSTRUCTION));
    values = { chainKey, hash: crypto.hash(chainKey, encoder.encode(IDENTIFIER)) };
    initialValuesCache.set(crypto, values);
  }
  return values;
}

// --- The key schedule (whitepaper §5.4: KDF1/2/3 over HMAC-BLAKE2s) ---

const ONE = Uint8Array.of(1);

export function kdf1(crypto: Crypto, key: Uint8Array, input: Uint8Array): Uint8Array {
  const prk = crypto.hmac(key, input);
  const t0 = crypto.hmac(prk, ONE);
  prk.fill(0);
  return t0;
}

export function kdf2(crypto: Crypto, key: Uint8Array, input: Uint8Array): [Uint8Array, Uint8Array] {
  const prk = crypto.hmac(key, input);
  const t0 = crypto.hmac(prk, ONE);
  const t1 = crypto.hmac(prk, t0, Uint8Array.of(2));
  prk.fill(0);
  return [t0, t1];
}

export function kdf3(crypto: Crypto, key: Uint8Array, input: Uint8Array): [Uint8Array, Uint8Array, Uint8Array] {
  const prk = crypto.hmac(key, input);
  const t0 = crypto.hmac(prk, ONE);
  const t1 = crypto.hmac(prk, t0, Uint8Array.of(2));
  const t2 = crypto.hmac(prk, t1, Uint8Array.of(3));
  prk.fill(0);
  return [t0, t1, t2];
}

/** Recomputes DH(our static, their static) after our key or the peer changed; the old one is wiped. */
export function precomputeStaticStatic(identity: NoiseIdentity, handshake: Handshake): void {
  const { staticPrivate } = identity;
  wipe(handshake.precomputedStaticStatic);
  handshake.precomputedStaticStatic = staticPrivate && !isZeroKey(staticPrivate)
    ? identity.crypto.sharedSecret(staticPrivate, handshake.remoteStatic)
    : null;
}

export type HandshakeError =
  | 'no-private-key'
  | 'invalid-peer-key'
  | 'low-order-point'
  | 'decryption-failed'
  | 'unknown-peer'
  | 'replayed-timestamp'
  | 'initiation-flood'
  | 'wrong-state';

// --- Message 1: initiation ---

/**
 * Creates a handshake initiation for `handshake`'s peer into `out` (148 bytes; MACs left zero).
 * `localIndex` is the sender index the caller registered for this handshake.
 */
export function createInitiation(
  identity: NoiseIdentity, handshake: Handshake, localIndex: number, wallNowMs: number,
  out: Uint8Array = new Uint8Array(INITIATION_SIZE),
): Uint8Array | HandshakeError {
  const { crypto, staticPublic } = identity;
  if (!staticPublic) return 'no-private-key';
  if (!handshake.precomputedStaticStatic) return 'invalid-peer-key';
  const initial = noiseInitialValues(crypto);
  const t = new Intermediates();
  try {
    const ephemeralPrivate = t.keep(crypto.randomBytes(32));
    const ephemeralPublic = crypto.publicKey(ephemeralPrivate);
    let hash = t.keep(crypto.hash(initial.hash, handshake.remoteStatic));
    let chainKey = t.keep(kdf1(crypto, initial.chainKey, ephemeralPublic));
    hash = t.keep(crypto.hash(hash, ephemeralPublic));

    const es = t.keep(crypto.sharedSecret(ephemeralPrivate, handshake.remoteStatic));
    if (!es) return 'low-order-point';
    let key: Uint8Array;
    [chainKey, key] = t.keepAll(kdf2(crypto, chainKey, es));
    out.fill(0, 0, INITIATION_SIZE);
    out[0] = MESSAGE_INITIATION;
    writeU32(out, INITIATION.sender, localIndex);
    out.set(ephemeralPublic, INITIATION.ephemeral);
    const encryptedStatic = crypto.seal(key, ZERO_NONCE, staticPublic, hash,
      out.subarray(INITIATION.encryptedStatic, INITIATION.encryptedStatic + 48));
    hash = t.keep(crypto.hash(hash, encryptedStatic));

    [chainKey, key] = t.keepAll(kdf2(crypto, chainKey, handshake.precomputedStaticStatic));
    const encryptedTimestamp = crypto.seal(key, ZERO_NONCE, tai64n(wallNowMs), hash,
      out.subarray(INITIATION.encryptedTimestamp, INITIATION.encryptedTimestamp + 28));
    hash = t.keep(crypto.hash(hash, encryptedTimestamp));

    handshake.hash.set(hash);
    handshake.chainKey.set(chainKey);
    handshake.localEphemeralPrivate.set(ephemeralPrivate); // replaces (overwrites) an earlier attempt's
    handshake.localIndex = localIndex;
    handshake.state = HandshakeState.InitiationCreated;
    return out.subarray(0, INITIATION_SIZE);
  } finally {
    t.wipe();
  }
}

/** What consuming an initiation found out, before the peer's handshake state is touched. */
export interface ConsumedInitiation<P> {
  readonly peer: P;
  readonly handshake: Handshake;
}

/**
 * Consumes a handshake initiation (mac1 already checked). `findPeer` maps the decrypted static
 * key to the peer and its handshake state. On success the peer's handshake holds the responder
 * state, ready for createResponse; an initiation of ours still waiting for its answer is set
 * aside (Handshake.setAsideOwnInitiation), and the caller takes it back after answering.
 */
export function consumeInitiation<P>(
  identity: NoiseIdentity, message: Uint8Array, nowMs: number, rateLimitMs: number,
  findPeer: (staticPublic: Uint8Array) => { peer: P; handshake: Handshake } | undefined,
): ConsumedInitiation<P> | HandshakeError {
  const { crypto, staticPrivate, staticPublic } = identity;
  if (!staticPrivate || !staticPublic) return 'no-private-key';
  const initial = noiseInitialValues(crypto);
  const t = new Intermediates();
  try {
    const ephemeral = message.subarray(INITIATION.ephemeral, INITIATION.ephemeral + 32);
    let hash = t.keep(crypto.hash(initial.hash, staticPublic));
    hash = t.keep(crypto.hash(hash, ephemeral));
    let chainKey = t.keep(kdf1(crypto, initial.chainKey, ephemeral));

    const es = t.keep(crypto.sharedSecret(staticPrivate, ephemeral));
    if (!es) return 'low-order-point';
    let key: Uint8Array;
    [chainKey, key] = t.keepAll(kdf2(crypto, chainKey, es));
    const encryptedStatic = message.subarray(INITIATION.encryptedStatic, INITIATION.encryptedStatic + 48);
    const peerStatic = crypto.open(key, ZERO_NONCE, encryptedStatic, hash);
    if (!peerStatic) return 'decryption-failed';
    hash = t.keep(crypto.hash(hash, encryptedStatic));

    const found = findPeer(peerStatic);
    if (!found) return 'unknown-peer';
    const { handshake } = found;
    if (!handshake.precomputedStaticStatic) return 'invalid-peer-key';

    [chainKey, key] = t.keepAll(kdf2(crypto, chainKey, handshake.precomputedStaticStatic));
    const encryptedTimestamp = message.subarray(INITIATION.encryptedTimestamp, INITIATION.encryptedTimestamp + 28);
    const timestamp = crypto.open(key, ZERO_NONCE, encryptedTimestamp, hash);
    if (!timestamp) return 'decryption-failed';
    hash = t.keep(crypto.hash(hash, encryptedTimestamp));

    // Only now, with the initiator authenticated, do replay and flood checks touch peer state.
    if (!tai64nAfter(timestamp, handshake.lastTimestamp)) return 'replayed-timestamp';
    if (nowMs - handshake.lastInitiationConsumption <= rateLimitMs) return 'initiation-flood';
    handshake.setAsideOwnInitiation();

    handshake.hash.set(hash);
    handshake.chainKey.set(chainKey);
    handshake.localEphemeralPrivate.fill(0);
    handshake.remoteIndex = readU32(message, INITIATION.sender);
    handshake.remoteEphemeral.set(ephemeral);
    handshake.lastTimestamp = Uint8Array.from(timestamp);
    handshake.lastInitiationConsumption = nowMs;
    handshake.state = HandshakeState.InitiationConsumed;
    return found;
  } finally {
    t.wipe();
  }
}

// --- Message 2: response ---

/**
 * Creates the response to a consumed initiation into `out` (92 bytes; MACs left zero). The
 * responder's ephemeral key is not needed afterwards and is not kept.
 */
export function createResponse(
  identity: NoiseIdentity, handshake: Handshake, localIndex: number,
  out: Uint8Array = new Uint8Array(RESPONSE_SIZE),
): Uint8Array | HandshakeError {
  const { crypto } = identity;
  if (handshake.state !== HandshakeState.InitiationConsumed) return 'wrong-state';
  const t = new Intermediates();
  try {
    const ephemeralPrivate = t.keep(crypto.randomBytes(32));
    const ephemeralPublic = crypto.publicKey(ephemeralPrivate);
    let hash = t.keep(crypto.hash(handshake.hash, ephemeralPublic));
    let chainKey = t.keep(kdf1(crypto, handshake.chainKey, ephemeralPublic));

    const ee = t.keep(crypto.sharedSecret(ephemeralPrivate, handshake.remoteEphemeral));
    if (!ee) return 'low-order-point';
    chainKey = t.keep(kdf1(crypto, chainKey, ee));
    const se = t.keep(crypto.sharedSecret(ephemeralPrivate, handshake.remoteStatic));
    if (!se) return 'low-order-point';
    chainKey = t.keep(kdf1(crypto, chainKey, se));

    const [nextChainKey, tau, key] = t.keepAll(kdf3(crypto, chainKey, handshake.presharedKey));
    chainKey = nextChainKey;
    hash = t.keep(crypto.hash(hash, tau));

    out.fill(0, 0, RESPONSE_SIZE);
    out[0] = MESSAGE_RESPONSE;
    writeU32(out, RESPONSE.sender, localIndex);
    writeU32(out, RESPONSE.receiver, handshake.remoteIndex);
    out.set(ephemeralPublic, RESPONSE.ephemeral);
    const encryptedNothing = crypto.seal(key, ZERO_NONCE, EMPTY, hash,
      out.subarray(RESPONSE.encryptedNothing, RESPONSE.encryptedNothing + 16));
    hash = t.keep(crypto.hash(hash, encryptedNothing));

    handshake.hash.set(hash);
    handshake.chainKey.set(chainKey);
    handshake.localIndex = localIndex;
    handshake.state = HandshakeState.ResponseCreated;
    return out.subarray(0, RESPONSE_SIZE);
  } finally {
    t.wipe();
  }
}

/**
 * Consumes a handshake response (mac1 already checked) for the handshake the caller found by the
 * message's receiver index. Nothing in `handshake` changes unless the response authenticates;
 * then our ephemeral key, no longer needed, is wiped.
 */
export function consumeResponse(
  identity: NoiseIdentity, handshake: Handshake, message: Uint8Array,
): true | HandshakeError {
  const { crypto, staticPrivate } = identity;
  if (!staticPrivate) return 'no-private-key';
  if (handshake.state !== HandshakeState.InitiationCreated) return 'wrong-state';
  const t = new Intermediates();
  try {
    const ephemeral = message.subarray(RESPONSE.ephemeral, RESPONSE.ephemeral + 32);
    let hash = t.keep(crypto.hash(handshake.hash, ephemeral));
    let chainKey = t.keep(kdf1(crypto, handshake.chainKey, ephemeral));

    const ee = t.keep(crypto.sharedSecret(handshake.localEphemeralPrivate, ephemeral));
    if (!ee) return 'low-order-point';
    chainKey = t.keep(kdf1(crypto, chainKey, ee));
    const se = t.keep(crypto.sharedSecret(staticPrivate, ephemeral));
    if (!se) return 'low-order-point';
    chainKey = t.keep(kdf1(crypto, chainKey, se));

    const [nextChainKey, tau, key] = t.keepAll(kdf3(crypto, chainKey, handshake.presharedKey));
    chainKey = nextChainKey;
    hash = t.keep(crypto.hash(hash, tau));
    const encryptedNothing = message.subarray(RESPONSE.encryptedNothing, RESPONSE.encryptedNothing + 16);
    if (!crypto.open(key, ZERO_NONCE, encryptedNothing, hash)) return 'decryption-failed';
    hash = t.keep(crypto.hash(hash, encryptedNothing));

    handshake.hash.set(hash);
    handshake.chainKey.set(chainKey);
    handshake.localEphemeralPrivate.fill(0);
    handshake.remoteIndex = readU32(message, RESPONSE.sender);
    handshake.state = HandshakeState.ResponseConsumed;
    return true;
  } finally {
    t.wipe();
  }
}

/** The two transport keys a finished handshake yields, from this side's point of view. */
export interface SessionKeys {
  readonly sendKey: Uint8Array;
  readonly receiveKey: Uint8Array;
  readonly isInitiator: boolean;
  readonly localIndex: number;
  readonly remoteIndex: number;
}

/**
 * Derives the transport keys once the handshake is done (initiator: after consuming the
 * response; responder: after creating it) and wipes the handshake's secrets.
 */
export function deriveSessionKeys(crypto: Crypto, handshake: Handshake): SessionKeys | HandshakeError {
  let isInitiator: boolean;
  if (handshake.state === HandshakeState.ResponseConsumed) isInitiator = true;
  else if (handshake.state === HandshakeState.ResponseCreated) isInitiator = false;
  else return 'wrong-state';
  const [initiatorToResponder, responderToInitiator] = kdf2(crypto, handshake.chainKey, EMPTY);
  const keys: SessionKeys = {
    sendKey: isInitiator ? initiatorToResponder : responderToInitiator,
    receiveKey: isInitiator ? responderToInitiator : initiatorToResponder,
    isInitiator,
    localIndex: handshake.localIndex,
    remoteIndex: handshake.remoteIndex,
  };
  handshake.clear();
  return keys;
}
