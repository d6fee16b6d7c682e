/**
 * Which Bind the daemon uses: `dgram` (UdpBind over node:dgram; the default) or `ffi` (FfiUdpBind:
 * own sockets through FFI, sendmmsg/recvmmsg, a reader thread; opt-in until a hang seen in the
 * open/close stress test with it as the default is understood). The environment variable
 * ROAMGUARD_UDP chooses when no kind is passed.
 *
 * Measured (bench/udp-micro.ts, Node, 1452 B): dgram send 9.5 us and receive 5.3 us of main-thread
 * time per datagram; ffi batched send 3.6 us, receive 1.65 us. Through the daemon against
 * wireguard-go (iperf3): receiving 228 -> 357 Mbit/s, sending 224 -> 246 Mbit/s.
 */
import type { Bind } from './bind.ts';
import { FfiUdpBind } from './ffi-udp-bind.ts';
import { UdpBind } from './udp-bind.ts';

export type BindKind = 'dgram' | 'ffi';

export function createBind(kind: string = process.env.ROAMGUARD_UDP ?? 'dgram'): Bind {
  switch (kind) {
    case '':
    case 'dgram':
      return new UdpBind();
    case 'ffi':
      return new FfiUdpBind();
    default:
      throw new RangeError(`unknown UDP bind ${JSON.stringify(kind)} (use 'dgram' or 'ffi')`);
  }
}
