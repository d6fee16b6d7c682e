/**
 * The receive path (wireguard-go's receive.go), top to bottom:
 *
 *   1. The bind's reader thread takes datagrams from the kernel (recvmmsg, UDP GRO runs) and opens
 *      each transport message of a known session in place, under a hold on its keypair's slot
 *      (session/transport-opener.ts; FfiUdpBind's udp-reader-worker.ts). MemoryBind runs the same
 *      opener as a datagram arrives.
 *   2. The main thread gets each datagram with what the opener did (`receive` below):
 *      - opened, or refused by the AEAD: core.receiveOpenedTransport: the index, age and counter
 *        checks, then (if it is still the keypair it was opened under) the replay window, key
 *        confirmation, timers, roaming, padding, the allowed-IPs source check and delivery
 *        (core.finishTransport);
 *      - left as it came (handshakes, cookie replies, malformed datagrams, a transport message
 *        whose keypair the reader could not hold): core.receiveDatagram, which opens a transport
 *        message here if it still names a live session.
 *   3. Delivered packets collect while the bind hands over one run of datagrams and go to the TUN
 *      in one write at its end (device.ts; LinuxTun coalesces them per TCP flow).
 *
 * Nothing is queued between the steps on the main thread, so nothing can change under a packet
 * between its checks and its delivery; what may change between step 1 and step 2 (the keypair
 * retired, its slot reused) is what the slot and generation check of step 2 catches.
 */
import type { WireGuardCore } from '../core.ts';
import type { Endpoint } from '../net/endpoint.ts';
import { NOT_OPENED, type OpenedTransport } from '../session/transport-opener.ts';

/** Step 2: one datagram from the bind. */
export function receive(core: WireGuardCore, datagram: Uint8Array, source: Endpoint, opened: OpenedTransport): void {
  if (opened.outcome === NOT_OPENED) core.receiveDatagram(datagram, source);
  else core.receiveOpenedTransport(datagram, source, opened);
}
