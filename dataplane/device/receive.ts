/**
 * The receive path (wireguard-go's receive.go), top to bottom:
 *
 *   1. The bind's reader thread takes datagrams from the kernel (recvmmsg, UDP GRO runs) and opens
 *      each transport message of a known session in place, under a hold on its keypair's slot
 *      (session/transport-opener.ts; FfiUdpBind's udp-reader-worker.ts). MemoryBind runs the same
 *      opener as a datagram arrives.
 *   2. Under a keypair the main thread has confirmed (and not near expiry), the reader delivers
 *      the packet itself: inner length, the allowed-IPs source check on the published table,
 *      the keypair's replay window (shared with the main thread), then the TUN write, before the
 *      main thread hears of it (DELIVERED; a replay: REPLAYED).
 *   3. The main thread gets each datagram with what the reader did (`receive` below):
 *      - delivered: core.receiveOpenedTransport keeps the books (key freshness, timers, rxBytes,
 *        roaming), off the packet's path;
 *      - opened, or refused: core.receiveOpenedTransport: the index, age and counter checks, then
 *        (if it is still the keypair it was opened under) the replay window, key confirmation,
 *        timers, roaming, padding, the allowed-IPs source check and delivery
 *        (core.finishTransport);
 *      - left as it came (handshakes, cookie replies, malformed datagrams, a transport message
 *        whose keypair the reader could not hold): core.receiveDatagram, which opens a transport
 *        message here if it still names a live session.
 *   4. Packets the main thread delivers collect while the bind hands over one run of datagrams
 *      and go to the TUN in one write at its end (device.ts; LinuxTun coalesces them per TCP
 *      flow); the reader coalesces its own the same way (tun/tun-writer.ts).
 *
 * What may change between the reader's work and the main thread's (the keypair retired, its slot
 * reused) is what the slot and generation check of step 3 catches; a packet the reader delivered
 * was authenticated, fresh and routed when it was written, as in any WireGuard implementation
 * that checks at decryption time.
 */
import type { WireGuardCore } from '../core.ts';
import type { Endpoint } from '../net/endpoint.ts';
import { NOT_OPENED, type OpenedTransport } from '../session/transport-opener.ts';

/** Step 3: one datagram from the bind. */
export function receive(core: WireGuardCore, datagram: Uint8Array, source: Endpoint, opened: OpenedTransport): void {
  if (opened.outcome === NOT_OPENED) core.receiveDatagram(datagram, source);
  else core.receiveOpenedTransport(datagram, source, opened);
}
