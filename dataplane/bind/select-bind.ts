/**
 * Which Bind the daemon uses: `ffi` (FfiUdpBind: own sockets through FFI, sendmmsg/recvmmsg with
 * UDP GSO/GRO, a reader thread; the default) or `dgram` (UdpBind over node:dgram, one system call
 * and one callback per datagram). The daemon passes ROAMGUARD_UDP and ROAMGUARD_UDP_OFFLOAD
 * (dataplane/settings.ts).
 *
 * Measured (bench/udp-micro.ts, Node, 1452 B): dgram send 9.5 us and receive 5.3 us of main-thread
 * time per datagram; ffi batched send 3.6 us, receive 1.65 us, before UDP GSO/GRO cut the kernel's
 * work per datagram as well. Through the bench suite (iperf3, one TCP stream, TUN offloads on):
 * tunnel CPU per GB 76-108 s (dgram) -> 30-50 s (ffi), see the commit message for the runs.
 */
import type { Bind } from './bind.ts';
import { FfiUdpBind, type FfiUdpBindOptions } from './ffi-udp-bind.ts';
import { UdpBind } from './udp-bind.ts';

export type BindKind = 'dgram' | 'ffi';

export function createBind(kind: BindKind = 'ffi', options: Pick<FfiUdpBindOptions, 'offload'> = {}): Bind {
  switch (kind) {
    case 'dgram':
      return new UdpBind();
    case 'ffi':
      return new FfiUdpBind(options);
    default:
      throw new RangeError(`unknown UDP bind ${JSON.stringify(kind)} (use 'dgram' or 'ffi')`);
  }
}
