/**
 * Sending datagrams that lie in place in shared memory (a batch's slots, a ring's slots) with one
 * sendmmsg(2) per up to TX_CAPACITY messages: the one place where the data plane's bulk datagrams
 * meet the kernel, used by the UDP bind on the main thread (ffi-udp-bind.ts sendBatch) and by a
 * thread that seals and sends on its own (docs/data-workers.md, step 3).
 *
 * UDP GSO: consecutive datagrams of one size (the last of a run may be shorter) leave as one
 * message with a UDP_SEGMENT control message, so the kernel takes the run through its stack once
 * and a receiver with UDP_GRO gets it in one piece. A sticky source (endpoint.ts) is an
 * IP_PKTINFO / IPV6_PKTINFO control message on every message.
 *
 * sendInPlace stops at the first message the kernel does not take for a reason its caller must
 * decide on (the send buffer full, the sticky source refused, GSO refused) and says which; a
 * message refused for anything else is skipped and counted. The caller owns the policy: the bind
 * queues what met a full buffer, a sending thread waits for room.
 */
import {
  AF_INET, AF_INET6, CMSGHDR_SIZE, EADDRNOTAVAIL, EAGAIN, EINTR, EINVAL, EIO, EMSGSIZE, ENETUNREACH, ENODEV, ENOPROTOOPT, EOPNOTSUPP,
  IOVEC_SIZE, IPPROTO_IP, IPPROTO_IPV6, IPV6_PKTINFO, IP_PKTINFO, MMSGHDR_SIZE, MSG_DONTWAIT, SOCKADDR_IN6_SIZE, SOCKADDR_IN_SIZE,
  SOL_UDP, UDP_SEGMENT, type Libc,
} from '../sys/libc.ts';
import { NAME_SIZE } from './udp-ring.ts';

/** mmsghdr entries (and iovecs) per sendmmsg; bigger batches go in several calls (the kernel's limit is 1024). */
export const TX_CAPACITY = 256;
/** Datagrams per UDP GSO message (UDP_MAX_SEGMENTS is 64 in older kernels, 128 in newer ones). */
const GSO_MAX_SEGMENTS = 64;
/** Bytes per UDP GSO message: within the 64 KiB an IP packet (and so a GSO super-datagram) may carry. */
const GSO_MAX_BYTES = 65000;
/** errno values of a UDP GSO send that mean "not here": the sender goes without GSO from then on. */
export const GSO_UNSUPPORTED: ReadonlySet<number> = new Set([EINVAL, EIO, EMSGSIZE, ENOPROTOOPT, EOPNOTSUPP]);
/**
 * errno values of a send from a sticky source that may mean the kernel will not send from that
 * address (any more): it is not ours (IPv6: EINVAL; IPv4: ENETUNREACH on Linux 6.x, EINVAL on
 * older kernels), or its interface is gone. The source is cleared and the datagram sent again
 * from an address the kernel picks (which fails the same way if the cause was something else).
 */
export const SOURCE_GONE: ReadonlySet<number> = new Set([EINVAL, EADDRNOTAVAIL, ENETUNREACH, ENODEV]);

/** The struct sockaddr_in / sockaddr_in6 bytes of an address (4 or 16 bytes) and port (host byte order family, network order port). */
export function encodeSockaddr(address: Uint8Array, port: number): Uint8Array {
  const v4 = address.length === 4;
  const bytes = new Uint8Array(v4 ? SOCKADDR_IN_SIZE : SOCKADDR_IN6_SIZE);
  new Uint16Array(bytes.buffer, 0, 1)[0] = v4 ? AF_INET : AF_INET6;
  bytes[2] = port >>> 8;
  bytes[3] = port & 0xff;
  bytes.set(address, v4 ? 4 : 8); // sin6_flowinfo (4..7) and sin6_scope_id (24..27) stay 0
  return bytes;
}

/** CMSG_SPACE(sizeof(uint16_t)): the UDP_SEGMENT control message. */
export const SEGMENT_SPACE = 24;
/** CMSG_SPACE(sizeof(struct in_pktinfo)) and CMSG_SPACE(sizeof(struct in6_pktinfo)): the sticky source. */
export const PKTINFO4_SPACE = 32;
export const PKTINFO6_SPACE = 40;

/**
 * The control message that makes the kernel send from `address` (IP_PKTINFO's ipi_spec_dst,
 * IPV6_PKTINFO's ipi6_addr). The interface index stays 0: the routing table picks the way out,
 * so a route that moved to another interface is followed (wireguard-go also passes the index it
 * received, and watches the routing table to clear the source when a route changes; the address
 * alone is what keeps the peer from seeing us roam).
 */
export function encodeSourceControl(address: Uint8Array): Uint8Array {
  const v4 = address.length === 4;
  const bytes = new Uint8Array(v4 ? PKTINFO4_SPACE : PKTINFO6_SPACE);
  const view = new DataView(bytes.buffer);
  view.setBigUint64(0, BigInt(CMSGHDR_SIZE + (v4 ? 12 : 20)), true); // cmsg_len = CMSG_LEN(sizeof the struct)
  view.setInt32(8, v4 ? IPPROTO_IP : IPPROTO_IPV6, true);
  view.setInt32(12, v4 ? IP_PKTINFO : IPV6_PKTINFO, true);
  // in_pktinfo: ipi_ifindex (16), ipi_spec_dst (20), ipi_addr (24, unused on send); in6_pktinfo: ipi6_addr (16), ipi6_ifindex (32).
  bytes.set(address, v4 ? 20 : 16);
  return bytes;
}

/** Bytes of one message's control buffer: UDP_SEGMENT at 0, the sticky source right after it. */
const TX_CONTROL_SIZE = SEGMENT_SPACE + PKTINFO6_SPACE;

/**
 * The long-lived sendmmsg arguments: TX_CAPACITY mmsghdrs, as many iovecs, one sockaddr, and a
 * control buffer per mmsghdr (a UDP_SEGMENT control message, then room for a sticky source's).
 * Message m points at the sockaddr for good; its iovec range, iovec count, control pointer and
 * control length are set per call.
 */
export class TxArea {
  readonly msgs: Uint8Array;
  readonly msg32: Uint32Array;
  readonly iov32: Uint32Array;
  readonly name: Uint8Array;
  /** The control buffers as 16-bit words (the segment size of message m at m * 32 + 8) and as bytes. */
  readonly control16: Uint16Array;
  readonly control8: Uint8Array;
  /** Raw address of iovec 0 and of control buffer 0. */
  readonly iovBase: number;
  readonly controlBase: number;
  /** Per message: the sticky source control message last copied into its buffer (copied again only when it changes). */
  private readonly stamped: Array<Uint8Array | undefined> = new Array(TX_CAPACITY).fill(undefined);
  /** Per message of the current call: the index of its first datagram in the caller's batch, and how many it carries. */
  readonly first = new Int32Array(TX_CAPACITY);
  readonly datagrams = new Int32Array(TX_CAPACITY);
  /** The name length currently written in every mmsghdr (16 or 28). */
  nameLength = 0;

  constructor(libc: Libc) {
    const msgsOffset = 0;
    const iovOffset = TX_CAPACITY * MMSGHDR_SIZE;
    const controlOffset = iovOffset + TX_CAPACITY * IOVEC_SIZE;
    const nameOffset = controlOffset + TX_CAPACITY * TX_CONTROL_SIZE;
    const buffer = new SharedArrayBuffer(nameOffset + NAME_SIZE);
    this.msgs = new Uint8Array(buffer, msgsOffset, TX_CAPACITY * MMSGHDR_SIZE);
    this.msg32 = new Uint32Array(buffer, msgsOffset, (TX_CAPACITY * MMSGHDR_SIZE) / 4);
    this.iov32 = new Uint32Array(buffer, iovOffset, (TX_CAPACITY * IOVEC_SIZE) / 4);
    this.control16 = new Uint16Array(buffer, controlOffset, (TX_CAPACITY * TX_CONTROL_SIZE) / 2);
    this.control8 = new Uint8Array(buffer, controlOffset, TX_CAPACITY * TX_CONTROL_SIZE);
    this.name = new Uint8Array(buffer, nameOffset, NAME_SIZE);
    const base = libc.address(new Uint8Array(buffer, 0, 1));
    this.iovBase = base + iovOffset;
    this.controlBase = base + controlOffset;
    const view = new DataView(buffer);
    for (let i = 0; i < TX_CAPACITY; i++) {
      const msg = msgsOffset + i * MMSGHDR_SIZE;
      view.setBigUint64(msg, BigInt(base + nameOffset), true); // msg_name
      view.setBigUint64(msg + 16, BigInt(base + iovOffset + i * IOVEC_SIZE), true); // msg_iov (set per call)
      view.setBigUint64(msg + 24, 1n, true); // msg_iovlen (set per call)
      view.setBigUint64(msg + 32, BigInt(base + controlOffset + i * TX_CONTROL_SIZE), true); // msg_control (set per call)
      // msg_namelen and msg_controllen are set per call; msg_flags stays 0.
      const control = controlOffset + i * TX_CONTROL_SIZE;
      view.setBigUint64(control, BigInt(CMSGHDR_SIZE + 2), true); // cmsg_len = CMSG_LEN(sizeof(uint16_t))
      view.setInt32(control + 8, SOL_UDP, true); // cmsg_level
      view.setInt32(control + 12, UDP_SEGMENT, true); // cmsg_type; the segment size follows at +16
    }
  }

  setNameLength(length: number): void {
    if (this.nameLength === length) return;
    for (let i = 0; i < TX_CAPACITY; i++) this.msg32[i * (MMSGHDR_SIZE / 4) + 2] = length;
    this.nameLength = length;
  }

  /**
   * Message m carries `iovecs` iovecs from iovec `firstIovec`, as one datagram or as segments of
   * `segmentSize` bytes, from the sticky source whose control message is `source` (if any).
   */
  setMessage(m: number, firstIovec: number, iovecs: number, segmentSize: number, source: Uint8Array | undefined): void {
    const w = m * (MMSGHDR_SIZE / 4);
    const address = this.iovBase + firstIovec * IOVEC_SIZE;
    const low = address >>> 0;
    this.msg32[w + 4] = low;
    this.msg32[w + 5] = (address - low) / 4294967296;
    this.msg32[w + 6] = iovecs;
    const segmented = iovecs > 1;
    if (segmented) this.control16[m * (TX_CONTROL_SIZE / 2) + 8] = segmentSize;
    if (source === undefined) {
      this.msg32[w + 10] = segmented ? SEGMENT_SPACE : 0;
      if (!segmented) return;
    } else {
      if (this.stamped[m] !== source) {
        this.control8.set(source, m * TX_CONTROL_SIZE + SEGMENT_SPACE);
        this.stamped[m] = source;
      }
      this.msg32[w + 10] = segmented ? SEGMENT_SPACE + source.length : source.length;
    }
    // The control messages start with UDP_SEGMENT when there is one, else with the source's.
    const control = this.controlBase + m * TX_CONTROL_SIZE + (segmented ? 0 : SEGMENT_SPACE);
    const controlLow = control >>> 0;
    this.msg32[w + 8] = controlLow;
    this.msg32[w + 9] = (control - controlLow) / 4294967296;
  }
}


/** Why sendInPlace stopped before the end. */
export const SENT_ALL = 0;
/** The socket's send buffer is full (EAGAIN). */
export const STOPPED_FULL = 1;
/** The kernel refused to send from the sticky source (SOURCE_GONE). */
export const STOPPED_SOURCE = 2;
/** The kernel refused a GSO message (GSO_UNSUPPORTED). */
export const STOPPED_GSO = 3;

/** What one sendInPlace call did (reused). */
export interface SendProgress {
  /** SENT_ALL, or why it stopped. */
  stop: number;
  /** The first datagram not handed to the kernel (the stopped message's first), or `count`. */
  next: number;
  /** Datagrams the kernel took. */
  sent: number;
  /** Datagrams skipped: refused by the kernel for another reason, or lying outside `data`. */
  refused: number;
}

export function newSendProgress(): SendProgress {
  return { stop: SENT_ALL, next: 0, sent: 0, refused: 0 };
}

/**
 * Sends datagrams [from, count) of `data` over `fd` to the sockaddr `name`, from the sticky source
 * whose control message is `source` (if any): datagram i is `lengths[i]` bytes at `i * stride`
 * (a length of 0 or less is skipped), read in place at raw address `base` (that of data[0]).
 * With `gso`, runs of datagrams of one size leave as one message each. Fills and returns `out`.
 */
export function sendInPlace(
  libc: Libc, tx: TxArea, fd: number, data: Uint8Array, base: number, stride: number, lengths: ArrayLike<number>,
  from: number, count: number, name: Uint8Array, source: Uint8Array | undefined, gso: boolean, out: SendProgress,
): SendProgress {
  out.stop = SENT_ALL;
  out.next = count;
  out.sent = 0;
  out.refused = 0;
  tx.name.set(name);
  tx.setNameLength(name.length);
  const { iov32, first, datagrams, msgs } = tx;
  const limit = data.length;
  let i = from;
  while (i < count) {
    // Fill up to TX_CAPACITY messages and iovecs: iovec v = datagram i, in place.
    let m = 0;
    let v = 0;
    let runSize = 0; // segment size of the open GSO run (0 = no run open)
    let runStart = 0; // its first iovec
    let runBytes = 0;
    for (; i < count; i++) {
      const length = lengths[i] | 0;
      if (length <= 0) continue;
      const start = i * stride;
      if (start + length > limit) { // would make the kernel read past the caller's memory
        out.refused++;
        continue;
      }
      const joins = runSize > 0 && length <= runSize && v - runStart < GSO_MAX_SEGMENTS && runBytes + length <= GSO_MAX_BYTES;
      if (!joins) {
        if (m === TX_CAPACITY || v === TX_CAPACITY) break;
        first[m] = i;
        datagrams[m] = 0;
        m++;
        runStart = v;
        runBytes = 0;
        runSize = gso ? length : 0;
      } else if (v === TX_CAPACITY) {
        break;
      }
      const address = base + start;
      const low = address >>> 0;
      const w = v << 2;
      iov32[w] = low;
      iov32[w + 1] = (address - low) / 4294967296;
      iov32[w + 2] = length;
      v++;
      runBytes += length;
      datagrams[m - 1]++;
      tx.setMessage(m - 1, runStart, v - runStart, runSize, source);
      if (length < runSize) runSize = 0; // a shorter datagram ends its run
    }
    let done = 0;
    while (done < m) {
      const sent = libc.sendmmsg(fd, done === 0 ? msgs : msgs.subarray(done * MMSGHDR_SIZE), m - done, MSG_DONTWAIT);
      if (sent > 0) {
        for (let k = done; k < done + sent; k++) out.sent += datagrams[k];
        done += sent;
        continue;
      }
      const errno = libc.errno();
      if (errno === EINTR) continue;
      // Checked in this order: a refused source before GSO is blamed for an EINVAL.
      const stop = errno === EAGAIN ? STOPPED_FULL
        : source !== undefined && SOURCE_GONE.has(errno) ? STOPPED_SOURCE
          : datagrams[done] > 1 && GSO_UNSUPPORTED.has(errno) ? STOPPED_GSO : SENT_ALL;
      if (stop !== SENT_ALL) {
        out.stop = stop;
        out.next = first[done];
        return out;
      }
      // The kernel refused message `done` (too large, unreachable, filtered): skip it, send the rest.
      out.refused += datagrams[done];
      done++;
    }
  }
  return out;
}
