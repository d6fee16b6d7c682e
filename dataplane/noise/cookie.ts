/**
 * mac1, mac2 and cookie replies: WireGuard's defence against handshake floods (whitepaper §5.4.4,
 * §5.4.7).
 *
 * - Every handshake message carries mac1 = MAC(HASH("mac1----" ‖ receiver's public key), msg):
 *   anyone who does not know the receiver's public key cannot make it do any work.
 * - Under load, a responder answers a handshake message with a cookie reply instead of
 *   processing it, unless the message carries mac2 = MAC(cookie, msg), where the cookie is a MAC
 *   of the sender's IP address and port under a secret that rotates every two minutes. That proves
 *   the sender can receive at its source address, so the per-address rate limiter is meaningful.
 *
 * CookieChecker is the responder side (one per device, keyed by our public key);
 * CookieGenerator is the initiator side (one per peer, keyed by the peer's public key).
 */
import type { Crypto } from '../crypto/primitives.ts';
import { KeyedMac } from './keyed-mac.ts';
import { COOKIE_REPLY, COOKIE_REPLY_SIZE, MESSAGE_COOKIE_REPLY, readU32, writeU32 } from './messages.ts';

const encoder = new TextEncoder();
export const LABEL_MAC1 = encoder.encode('mac1----');
export const LABEL_COOKIE = encoder.encode('cookie--');
const MAC_SIZE = 16;
const ZERO_MAC = new Uint8Array(MAC_SIZE);

/** mac1 sits 32 bytes before the end of a handshake message, mac2 16 bytes before. */
function mac1Offset(message: Uint8Array): number { return message.length - 2 * MAC_SIZE; }
function mac2Offset(message: Uint8Array): number { return message.length - MAC_SIZE; }

/** Source address bytes followed by the port (big-endian): what a cookie vouches for. */
function sourceBytes(address: Uint8Array, port: number): Uint8Array {
  const out = new Uint8Array(address.length + 2);
  out.set(address, 0);
  out[address.length] = port >>> 8;
  out[address.length + 1] = port & 0xff;
  return out;
}

function isZeroMac(bytes: Uint8Array, offset: number): boolean {
  let acc = 0;
  for (let i = 0; i < MAC_SIZE; i++) acc |= bytes[offset + i];
  return acc === 0;
}

/** Cookie nonces are drawn from the CSPRNG this many at a time (one provider call per 256 replies). */
const NONCES_PER_REFILL = 256;
const NONCE_SIZE = 24;

/** A source's cookie under the current secret (the MAC of its address and port), and the MAC keyed with it (mac2). */
interface CachedCookie {
  port: number;
  generation: number;
  cookie: Uint8Array;
  mac2: KeyedMac;
}

export class CookieChecker {
  /** mac1's MAC, keyed with HASH("mac1----" ‖ our public key) (keyed-mac.ts: checked for every handshake message). */
  private readonly mac1: KeyedMac;
  private cookieEncryptionKey: Uint8Array;
  private secret: Uint8Array;
  /** The MAC keyed with the current secret (makes cookies). */
  private secretMac: KeyedMac | undefined;
  private secretSetAt = -Infinity;
  /** Bumped when the secret changes: cached cookies of an older generation are stale. */
  private generation = 0;
  /**
   * Cookies by the source's address bytes (an Endpoint's `addressBytes`, which the binds reuse
   * per source): under a flood each source's cookie is computed once per secret, not per message.
   * Weak, so it holds nothing the binds have let go of.
   */
  private readonly cookies = new WeakMap<Uint8Array, CachedCookie>();
  private nonces: Uint8Array = new Uint8Array(0);
  private nonceAt = 0;

  constructor(private readonly crypto: Crypto, ourPublicKey: Uint8Array, private readonly refreshTime: number) {
    this.mac1 = new KeyedMac(crypto.hash(LABEL_MAC1, ourPublicKey));
    this.cookieEncryptionKey = crypto.hash(LABEL_COOKIE, ourPublicKey);
    this.secret = new Uint8Array(32);
  }

  /** True when the message's mac1 is right for our public key. Constant time. */
  checkMac1(message: Uint8Array): boolean {
    const offset = mac1Offset(message);
    return this.mac1.verify(message.subarray(0, offset), message, offset);
  }

  /** True when the message's mac2 proves a fresh cookie for this source address and port. */
  checkMac2(message: Uint8Array, address: Uint8Array, port: number, nowMs: number): boolean {
    if (nowMs - this.secretSetAt > this.refreshTime) return false;
    const offset = mac2Offset(message);
    // An all-zero mac2 is what a sender without a cookie writes (and a 2^-128 chance otherwise):
    // refusing it without a MAC is the flood's common case, and reveals nothing secret.
    if (isZeroMac(message, offset)) return false;
    return this.cached(address, port).mac2.verify(message.subarray(0, offset), message, offset);
  }

  /** A cookie reply to `message` (an initiation or response whose mac1 was valid). */
  createReply(message: Uint8Array, address: Uint8Array, port: number, nowMs: number): Uint8Array {
    if (nowMs - this.secretSetAt > this.refreshTime) {
      this.secret.fill(0);
      this.secretMac?.destroy();
      this.secret = this.crypto.randomBytes(32);
      this.secretMac = new KeyedMac(this.secret);
      this.secretSetAt = nowMs;
      this.generation++;
    }
    const { cookie } = this.cached(address, port);
    const reply = new Uint8Array(COOKIE_REPLY_SIZE);
    reply[0] = MESSAGE_COOKIE_REPLY;
    writeU32(reply, COOKIE_REPLY.receiver, readU32(message, 4)); // the triggering message's sender index
    const nonce = this.nextNonce();
    reply.set(nonce, COOKIE_REPLY.nonce);
    const offset = mac1Offset(message);
    const sealed = this.crypto.xseal(this.cookieEncryptionKey, nonce, cookie, message.subarray(offset, offset + MAC_SIZE));
    reply.set(sealed, COOKIE_REPLY.encryptedCookie);
    return reply;
  }

  /**
   * The cookie for a source under the current secret and its mac2 MAC, from the cache when they
   * were made already. Only called with a current secret (createReply makes one; checkMac2 returns
   * before when there is none).
   */
  private cached(address: Uint8Array, port: number): CachedCookie {
    const cached = this.cookies.get(address);
    if (cached !== undefined && cached.port === port && cached.generation === this.generation) return cached;
    const cookie = this.secretMac!.mac(sourceBytes(address, port));
    const entry: CachedCookie = { port, generation: this.generation, cookie, mac2: new KeyedMac(cookie) };
    cached?.mac2.destroy();
    this.cookies.set(address, entry);
    return entry;
  }

  /** A fresh random 24-byte nonce (a view; valid until the next call refills). */
  private nextNonce(): Uint8Array {
    if (this.nonceAt + NONCE_SIZE > this.nonces.length) {
      this.nonces = this.crypto.randomBytes(NONCE_SIZE * NONCES_PER_REFILL);
      this.nonceAt = 0;
    }
    const nonce = this.nonces.subarray(this.nonceAt, this.nonceAt + NONCE_SIZE);
    this.nonceAt += NONCE_SIZE;
    return nonce;
  }
}

export class CookieGenerator {
  private mac1Key: Uint8Array;
  private cookieDecryptionKey: Uint8Array;
  private cookie: Uint8Array = new Uint8Array(MAC_SIZE);
  private cookieSetAt = -Infinity;
  /** The mac1 of the last handshake message we sent: a cookie reply must be bound to it. */
  private lastMac1: Uint8Array | null = null;

  constructor(private readonly crypto: Crypto, peerPublicKey: Uint8Array, private readonly refreshTime: number) {
    this.mac1Key = crypto.hash(LABEL_MAC1, peerPublicKey);
    this.cookieDecryptionKey = crypto.hash(LABEL_COOKIE, peerPublicKey);
  }

  /** Writes mac1 and (with a fresh cookie) mac2 into the last 32 bytes of a handshake message. */
  addMacs(message: Uint8Array, nowMs: number): void {
    const offset1 = mac1Offset(message);
    const mac1 = this.crypto.mac(this.mac1Key, message.subarray(0, offset1));
    message.set(mac1, offset1);
    this.lastMac1 = mac1;
    const offset2 = mac2Offset(message);
    if (nowMs - this.cookieSetAt > this.refreshTime) {
      message.set(ZERO_MAC, offset2);
      return;
    }
    message.set(this.crypto.mac(this.cookie, message.subarray(0, offset2)), offset2);
  }

  /** Takes the cookie from a reply to our last message; false if it does not authenticate. */
  consumeReply(reply: Uint8Array, nowMs: number): boolean {
    if (!this.lastMac1) return false;
    const nonce = reply.subarray(COOKIE_REPLY.nonce, COOKIE_REPLY.nonce + 24);
    const sealed = reply.subarray(COOKIE_REPLY.encryptedCookie, COOKIE_REPLY.encryptedCookie + 32);
    const cookie = this.crypto.xopen(this.cookieDecryptionKey, nonce, sealed, this.lastMac1);
    if (!cookie) return false;
    this.cookie = Uint8Array.from(cookie);
    this.cookieSetAt = nowMs;
    this.lastMac1 = null; // one reply per message we sent
    return true;
  }

  get hasFreshCookie(): boolean {
    return this.cookieSetAt > -Infinity;
  }
}
