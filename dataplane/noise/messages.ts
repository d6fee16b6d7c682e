/**
 * Wire formats of the four WireGuard messages (all integers little-endian).
 *
 *   type 1  handshake initiation  148 bytes
 *   type 2  handshake response     92 bytes
 *   type 3  cookie reply           64 bytes
 *   type 4  transport data         16-byte header + ciphertext + 16-byte tag (>= 32 bytes)
 *
 * `classifyMessage` is the single entry point for untrusted datagrams: it never throws, and it
 * names the reason when a datagram is not a well-formed message, so the device can count drops.
 */

export const MESSAGE_INITIATION = 1;
export const MESSAGE_RESPONSE = 2;
export const MESSAGE_COOKIE_REPLY = 3;
export const MESSAGE_TRANSPORT = 4;

export const INITIATION_SIZE = 148;
export const RESPONSE_SIZE = 92;
export const COOKIE_REPLY_SIZE = 64;
export const TRANSPORT_HEADER_SIZE = 16;
export const TRANSPORT_MIN_SIZE = 32; // header + tag: a keepalive
export const TAG_SIZE = 16;

// Field offsets (see the reference notes, §2).
export const INITIATION = {
  sender: 4, ephemeral: 8, encryptedStatic: 40, encryptedTimestamp: 88, mac1: 116, mac2: 132,
} as const;
export const RESPONSE = {
  sender: 4, receiver: 8, ephemeral: 12, encryptedNothing: 44, mac1: 60, mac2: 76,
} as const;
export const COOKIE_REPLY = { receiver: 4, nonce: 8, encryptedCookie: 32 } as const;
export const TRANSPORT = { receiver: 4, counter: 8, content: 16 } as const;

export type MessageType = typeof MESSAGE_INITIATION | typeof MESSAGE_RESPONSE | typeof MESSAGE_COOKIE_REPLY | typeof MESSAGE_TRANSPORT;

/** Why a datagram was not accepted as a message; each becomes a drop counter. */
export type MalformedReason = 'too-short' | 'unknown-type' | 'bad-length';

export type Classified = { ok: true; type: MessageType } | { ok: false; reason: MalformedReason };

const OK_INITIATION: Classified = { ok: true, type: MESSAGE_INITIATION };
const OK_RESPONSE: Classified = { ok: true, type: MESSAGE_RESPONSE };
const OK_COOKIE: Classified = { ok: true, type: MESSAGE_COOKIE_REPLY };
const OK_TRANSPORT: Classified = { ok: true, type: MESSAGE_TRANSPORT };
const TOO_SHORT: Classified = { ok: false, reason: 'too-short' };
const UNKNOWN_TYPE: Classified = { ok: false, reason: 'unknown-type' };
const BAD_LENGTH: Classified = { ok: false, reason: 'bad-length' };

/**
 * Dispatches on the (type, exact length) pair as wireguard-go and boringtun do. The type is one
 * byte followed by three zero bytes; anything else is an unknown type. Allocation-free.
 */
export function classifyMessage(datagram: Uint8Array): Classified {
  if (datagram.length < TRANSPORT_MIN_SIZE) return TOO_SHORT;
  if (datagram[1] !== 0 || datagram[2] !== 0 || datagram[3] !== 0) return UNKNOWN_TYPE;
  switch (datagram[0]) {
    case MESSAGE_INITIATION: return datagram.length === INITIATION_SIZE ? OK_INITIATION : BAD_LENGTH;
    case MESSAGE_RESPONSE: return datagram.length === RESPONSE_SIZE ? OK_RESPONSE : BAD_LENGTH;
    case MESSAGE_COOKIE_REPLY: return datagram.length === COOKIE_REPLY_SIZE ? OK_COOKIE : BAD_LENGTH;
    case MESSAGE_TRANSPORT: return OK_TRANSPORT;
    default: return UNKNOWN_TYPE;
  }
}

export function readU32(buf: Uint8Array, offset: number): number {
  return (buf[offset] | (buf[offset + 1] << 8) | (buf[offset + 2] << 16) | (buf[offset + 3] << 24)) >>> 0;
}

export function writeU32(buf: Uint8Array, offset: number, value: number): void {
  buf[offset] = value & 0xff;
  buf[offset + 1] = (value >>> 8) & 0xff;
  buf[offset + 2] = (value >>> 16) & 0xff;
  buf[offset + 3] = (value >>> 24) & 0xff;
}

/**
 * Reads the 64-bit counter of a transport message as a number. Counters a number cannot hold
 * exactly (>= 2^53) come back as Infinity so that every limit check rejects them.
 */
export function readCounter(buf: Uint8Array, offset: number): number {
  const lo = readU32(buf, offset);
  const hi = readU32(buf, offset + 4);
  if (hi >= 0x200000) return Infinity;
  return hi * 0x1_0000_0000 + lo;
}

export function writeCounter(buf: Uint8Array, offset: number, counter: number): void {
  writeU32(buf, offset, counter >>> 0);
  writeU32(buf, offset + 4, Math.floor(counter / 0x1_0000_0000) >>> 0);
}

/** Writes the 16-byte transport header (type 4, receiver index, counter). */
export function writeTransportHeader(buf: Uint8Array, offset: number, receiver: number, counter: number): void {
  buf[offset] = MESSAGE_TRANSPORT; buf[offset + 1] = 0; buf[offset + 2] = 0; buf[offset + 3] = 0;
  writeU32(buf, offset + TRANSPORT.receiver, receiver);
  writeCounter(buf, offset + TRANSPORT.counter, counter);
}

/**
 * Plaintext length after padding: a multiple of 16, but never past the MTU. For a packet already
 * larger than the MTU the rounding is done on `length % mtu`, as wireguard-go does, so the padded
 * size stays at most one block above the packet.
 */
export function paddedLength(length: number, mtu: number): number {
  if (length === 0) return 0;
  const last = mtu > 0 && length > mtu ? length % mtu : length;
  let padded = (last + 15) & ~15;
  if (mtu > 0 && padded > mtu) padded = mtu;
  return length + (padded - last);
}

/**
 * The real length of a decrypted inner IP packet (padding stripped), from its own header:
 * IPv4 total length, IPv6 payload length + 40. Returns -1 when the header is not a valid
 * IPv4/IPv6 header or claims more bytes than were received.
 */
export function innerPacketLength(plain: Uint8Array, offset: number, available: number): number {
  if (available < 1) return -1;
  const version = plain[offset] >> 4;
  let length: number;
  if (version === 4) {
    if (available < 20) return -1;
    length = (plain[offset + 2] << 8) | plain[offset + 3];
    if (length < 20) return -1;
  } else if (version === 6) {
    if (available < 40) return -1;
    length = ((plain[offset + 4] << 8) | plain[offset + 5]) + 40;
  } else {
    return -1;
  }
  return length > available ? -1 : length;
}
