/**
 * The few libc calls the Linux TUN device needs and Node.js lacks (ioctl, poll on an arbitrary fd,
 * eventfd, read/write on a raw fd without libuv), and those of the FFI UDP bind
 * (bind/ffi-udp-bind.ts: socket options, sendmmsg/recvmmsg), bound through a foreign function
 * interface: koffi on Node, bun:ffi on Bun. Both backends expose exactly the {@link Libc} shape, so
 * the code that uses it does not care which runtime it runs on. It is loaded per thread: in the
 * main thread and again in each reader worker (TUN, UDP).
 *
 * Pointers are Uint8Arrays (also views of a SharedArrayBuffer): the FFI hands the native function
 * the memory of the view itself, honouring byteOffset, without copying. Strings (paths) are passed
 * as NUL-terminated byte arrays, because bun:ffi has no string arguments. Pointers stored inside C
 * structures (iovec, msghdr) are raw addresses obtained with `address()`.
 *
 * Variadic prototypes (open, ioctl) are declared with a fixed third argument: bun:ffi cannot call
 * variadic functions, and on the Linux ABIs we run on (x86-64 System V, AArch64) an integer or
 * pointer passed this way lands exactly where the variadic callee looks for it.
 *
 * The constants below are the Linux values (identical on x86-64 and AArch64).
 */
import { isBun } from './threads.ts';

// --- Linux constants -----------------------------------------------------------------------------

export const O_RDWR = 0o2;
export const O_NONBLOCK = 0o4000;
export const O_CLOEXEC = 0o2000000;
export const EFD_NONBLOCK = O_NONBLOCK;
export const EFD_CLOEXEC = O_CLOEXEC;

export const AF_INET = 2;
export const AF_INET6 = 10;
export const SOCK_DGRAM = 2;
export const SOCK_CLOEXEC = O_CLOEXEC;
export const SOCK_NONBLOCK = O_NONBLOCK;
export const SOL_SOCKET = 1;
export const SO_SNDBUF = 7;
export const SO_RCVBUF = 8;
/** Like SO_SNDBUF/SO_RCVBUF but past net.core.wmem_max/rmem_max; needs CAP_NET_ADMIN. */
export const SO_SNDBUFFORCE = 32;
export const SO_RCVBUFFORCE = 33;
export const SO_MARK = 36;
/** Each received datagram carries the socket's count of datagrams dropped so far (a full receive queue). */
export const SO_RXQ_OVFL = 40;
export const IPPROTO_IP = 0;
/** IPv4: received datagrams carry a struct in_pktinfo (the local address and interface); on send, it picks the source. */
export const IP_PKTINFO = 8;
/**
 * Path-MTU behaviour of a socket (int). IP_PMTUDISC_PROBE: every datagram carries DF and the kernel
 * neither fragments it nor refuses it for a path MTU learned from ICMP; only the device MTU limits it.
 */
export const IP_MTU_DISCOVER = 10;
export const IP_PMTUDISC_PROBE = 3;
export const IPPROTO_IPV6 = 41;
/** IPv6 counterparts of IP_MTU_DISCOVER / IP_PMTUDISC_PROBE (IPv6 routers never fragment anyway). */
export const IPV6_MTU_DISCOVER = 23;
export const IPV6_PMTUDISC_PROBE = 3;
export const IPV6_V6ONLY = 26;
/** IPv6: received datagrams carry a struct in6_pktinfo (cmsg type IPV6_PKTINFO); on send, IPV6_PKTINFO picks the source. */
export const IPV6_RECVPKTINFO = 49;
export const IPV6_PKTINFO = 50;
export const SOL_UDP = 17;
/** UDP generic segmentation offload: a uint16_t segment size, as a cmsg on sendmsg (or a socket option). */
export const UDP_SEGMENT = 103;
/** UDP generic receive offload: an int socket option; received super-datagrams carry their segment size as a cmsg. */
export const UDP_GRO = 104;
/** sizeof(struct cmsghdr) on 64-bit Linux (size_t cmsg_len, int cmsg_level, int cmsg_type). */
export const CMSGHDR_SIZE = 16;
export const MSG_TRUNC = 0x20;
export const MSG_DONTWAIT = 0x40;
/** sizeof(struct sockaddr_in) and sizeof(struct sockaddr_in6). */
export const SOCKADDR_IN_SIZE = 16;
export const SOCKADDR_IN6_SIZE = 28;
/** sizeof(struct mmsghdr) (a 56-byte struct msghdr, then unsigned int msg_len, padded) and of struct iovec, on 64-bit Linux. */
export const MMSGHDR_SIZE = 64;
export const IOVEC_SIZE = 16;

export const POLLIN = 0x001;
export const POLLOUT = 0x004;
export const POLLERR = 0x008;
export const POLLHUP = 0x010;
export const POLLNVAL = 0x020;

export const EINTR = 4;
export const EIO = 5;
export const ENXIO = 6;
export const EBADF = 9;
export const EAGAIN = 11;
export const ENODEV = 19;
export const EINVAL = 22;
export const EMSGSIZE = 90;
export const ENOPROTOOPT = 92;
export const EOPNOTSUPP = 95;
export const EAFNOSUPPORT = 97;
export const EADDRINUSE = 98;
export const EADDRNOTAVAIL = 99;
export const ENETUNREACH = 101;
export const EBADFD = 77;
/** errno values of a TUN read that mean the device has been detached (deleted) or the fd is unusable. */
export const DEVICE_GONE_ERRNOS: ReadonlySet<number> = new Set([EBADFD, EIO, ENXIO, ENODEV, EBADF]);

/** `_IOW('T', 202, int)` (linux/if_tun.h). */
export const TUNSETIFF = 0x400454ca;
export const IFF_TUN = 0x0001;
export const IFF_NO_PI = 0x1000;
/** Every read and write starts with a struct virtio_net_hdr (tun/offload.ts). */
export const IFF_VNET_HDR = 0x4000;
/** One descriptor per queue (TUNSETIFF on several fds with one name): the kernel spreads flows over them. */
export const IFF_MULTI_QUEUE = 0x0100;
/** `_IOW('T', 208, unsigned int)`: the offloads the reader accepts; the argument is the value itself. */
export const TUNSETOFFLOAD = 0x400454d0;
export const TUN_F_CSUM = 0x01;
export const TUN_F_TSO4 = 0x02;
export const TUN_F_TSO6 = 0x04;
export const SIOCGIFMTU = 0x8921;
export const SIOCSIFMTU = 0x8922;
/** IFNAMSIZ: 16 bytes including the terminating NUL. */
export const IFNAMSIZ = 16;
/** sizeof(struct ifreq) on 64-bit Linux: name[16] then a 24-byte union (flags, mtu, ...) at offset 16. */
export const IFREQ_SIZE = 40;

// --- the binding -----------------------------------------------------------------------------------

/** libc entry points in their C argument order; results are the raw C return values (-1 on error). */
export interface Libc {
  /** Which FFI backs this binding. */
  readonly backend: 'koffi' | 'bun:ffi';
  open(path: Uint8Array, flags: number, mode: number): number;
  close(fd: number): number;
  /** A second descriptor for the same open file (the lowest free number), or -1. */
  dup(fd: number): number;
  ioctl(fd: number, request: number, arg: Uint8Array): number;
  /** ioctl with an integer argument passed by value (TUNSETOFFLOAD). */
  ioctlValue(fd: number, request: number, value: number): number;
  read(fd: number, buf: Uint8Array, count: number): number;
  write(fd: number, buf: Uint8Array, count: number): number;
  /** `fds` holds `nfds` struct pollfd (8 bytes each: int fd, short events, short revents). */
  poll(fds: Uint8Array, nfds: number, timeoutMs: number): number;
  eventfd(initval: number, flags: number): number;
  socket(domain: number, type: number, protocol: number): number;
  setsockopt(fd: number, level: number, name: number, value: Uint8Array, length: number): number;
  /** `length` is a socklen_t (4 bytes, host order): in, the room in `value`; out, the option's size. */
  getsockopt(fd: number, level: number, name: number, value: Uint8Array, length: Uint8Array): number;
  bind(fd: number, address: Uint8Array, addressLength: number): number;
  /** `addressLength` as for getsockopt's `length`. */
  getsockname(fd: number, address: Uint8Array, addressLength: Uint8Array): number;
  sendto(fd: number, buf: Uint8Array, length: number, flags: number, address: Uint8Array, addressLength: number): number;
  /**
   * `msgvec` holds `vlen` struct mmsghdr (MMSGHDR_SIZE bytes each) whose pointers (names, iovecs,
   * buffers) are raw addresses, see {@link Libc.address}.
   */
  sendmmsg(fd: number, msgvec: Uint8Array, vlen: number, flags: number): number;
  /** As sendmmsg; no timeout (a NULL struct timespec *): use MSG_DONTWAIT on a non-blocking fd. */
  recvmmsg(fd: number, msgvec: Uint8Array, vlen: number, flags: number): number;
  /**
   * The raw address of a view's first byte (byteOffset included), for pointers stored inside
   * structures (iovec, msghdr). Only meaningful for memory that never moves while in use: take it
   * of SharedArrayBuffer views only (see the note in bind/ffi-udp-bind.ts) and keep a reference to
   * the buffer for as long as the kernel may use the address.
   */
  address(view: Uint8Array): number;
  /**
   * memmove(3) between raw addresses (see {@link Libc.address}); sys/copy-bytes.ts is the one
   * caller, and checks both ranges against their views first.
   */
  memmove(dst: number, src: number, length: number): void;
  /** errno of the calling thread, as left by the last failed call made through this binding. */
  errno(): number;
}

/**
 * The slice of bun:ffi the native bindings use (libc here, sodium-ffi and openssl-ffi): the
 * project type-checks against Node's types only.
 */
export interface BunFfi {
  dlopen(path: string, symbols: Record<string, { args: string[]; returns: string }>): { symbols: Record<string, (...args: any[]) => any> };
  read: { i32(pointer: number, offset?: number): number };
  ptr(view: ArrayBufferView, byteOffset?: number): number;
}

const LIBC_CANDIDATES = ['libc.so.6', '/lib/x86_64-linux-gnu/libc.so.6', '/lib/aarch64-linux-gnu/libc.so.6', '/lib64/libc.so.6'];

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

async function bindWithKoffi(): Promise<Libc> {
  const koffi = (await import('koffi')).default;
  const errors: string[] = [];
  for (const name of LIBC_CANDIDATES) {
    let lib: ReturnType<typeof koffi.load>;
    try {
      lib = koffi.load(name);
    } catch (err) {
      errors.push(`${name}: ${message(err)}`);
      continue;
    }
    const f = (proto: string) => lib.func(proto) as (...args: any[]) => number;
    return {
      backend: 'koffi',
      open: f('int open(const uint8_t *path, int flags, int mode)'),
      close: f('int close(int fd)'),
      dup: f('int dup(int fd)'),
      ioctl: f('int ioctl(int fd, unsigned long request, uint8_t *arg)'),
      ioctlValue: f('int ioctl(int fd, unsigned long request, unsigned long value)'),
      read: f('long read(int fd, uint8_t *buf, size_t count)'),
      write: f('long write(int fd, const uint8_t *buf, size_t count)'),
      poll: f('int poll(uint8_t *fds, unsigned long nfds, int timeout)'),
      eventfd: f('int eventfd(unsigned int initval, int flags)'),
      socket: f('int socket(int domain, int type, int protocol)'),
      setsockopt: f('int setsockopt(int fd, int level, int name, const uint8_t *value, unsigned int length)'),
      getsockopt: f('int getsockopt(int fd, int level, int name, uint8_t *value, uint8_t *length)'),
      bind: f('int bind(int fd, const uint8_t *address, unsigned int length)'),
      getsockname: f('int getsockname(int fd, uint8_t *address, uint8_t *length)'),
      // ssize_t results are at most 64 KiB here: an int holds them, as in the bun:ffi declarations.
      sendto: f('int sendto(int fd, const uint8_t *buf, size_t length, int flags, const uint8_t *address, unsigned int addressLength)'),
      sendmmsg: f('int sendmmsg(int fd, uint8_t *msgvec, unsigned int vlen, int flags)'),
      recvmmsg: (() => {
        const recvmmsg = f('int recvmmsg(int fd, uint8_t *msgvec, unsigned int vlen, int flags, void *timeout)');
        return (fd: number, msgvec: Uint8Array, vlen: number, flags: number) => recvmmsg(fd, msgvec, vlen, flags, null);
      })(),
      // koffi.address() takes typed arrays (since koffi 2.16) and includes their byteOffset.
      address: (view: Uint8Array) => Number(koffi.address(view)),
      // Addresses as integers: no typed array to resolve per call (sys/copy-bytes.ts).
      memmove: f('void memmove(uintptr_t dst, uintptr_t src, size_t length)') as Libc['memmove'],
      errno: () => koffi.errno(),
    };
  }
  throw new Error(`libc not found (${errors.join('; ')})`);
}

async function bindWithBunFfi(): Promise<Libc> {
  // A computed specifier keeps TypeScript (and any bundler) from resolving bun:ffi under Node.
  const specifier = 'bun:ffi';
  const ffi = (await import(specifier)) as BunFfi;
  const declarations = {
    open: { args: ['ptr', 'i32', 'i32'], returns: 'i32' },
    close: { args: ['i32'], returns: 'i32' },
    dup: { args: ['i32'], returns: 'i32' },
    ioctl: { args: ['i32', 'u64', 'ptr'], returns: 'i32' },
    // ssize_t results fit an int here (at most 64 KiB or -1); i64 would come back as a BigInt.
    read: { args: ['i32', 'ptr', 'u64'], returns: 'i32' },
    write: { args: ['i32', 'ptr', 'u64'], returns: 'i32' },
    poll: { args: ['ptr', 'u64', 'i32'], returns: 'i32' },
    eventfd: { args: ['u32', 'i32'], returns: 'i32' },
    socket: { args: ['i32', 'i32', 'i32'], returns: 'i32' },
    setsockopt: { args: ['i32', 'i32', 'i32', 'ptr', 'u32'], returns: 'i32' },
    getsockopt: { args: ['i32', 'i32', 'i32', 'ptr', 'ptr'], returns: 'i32' },
    bind: { args: ['i32', 'ptr', 'u32'], returns: 'i32' },
    getsockname: { args: ['i32', 'ptr', 'ptr'], returns: 'i32' },
    sendto: { args: ['i32', 'ptr', 'u64', 'i32', 'ptr', 'u32'], returns: 'i32' },
    sendmmsg: { args: ['i32', 'ptr', 'u32', 'i32'], returns: 'i32' },
    recvmmsg: { args: ['i32', 'ptr', 'u32', 'i32', 'ptr'], returns: 'i32' },
    memmove: { args: ['ptr', 'ptr', 'u64'], returns: 'void' },
    __errno_location: { args: [], returns: 'ptr' },
  };
  const errors: string[] = [];
  for (const name of LIBC_CANDIDATES) {
    let s: Record<string, (...args: any[]) => any>;
    try {
      s = ffi.dlopen(name, declarations).symbols;
    } catch (err) {
      errors.push(`${name}: ${message(err)}`);
      continue;
    }
    // errno is thread-local: its address is fixed per thread, so look it up once in this thread
    // (the main thread and the reader worker each load their own binding).
    const errnoAddress = s.__errno_location() as number;
    const read = ffi.read;
    return {
      backend: 'bun:ffi',
      open: s.open as Libc['open'],
      close: s.close as Libc['close'],
      dup: s.dup as Libc['dup'],
      ioctl: s.ioctl as Libc['ioctl'],
      // The same symbol, its pointer argument given as a plain number (bun:ffi passes it as the value).
      ioctlValue: s.ioctl as Libc['ioctlValue'],
      read: s.read as Libc['read'],
      write: s.write as Libc['write'],
      poll: s.poll as Libc['poll'],
      eventfd: s.eventfd as Libc['eventfd'],
      socket: s.socket as Libc['socket'],
      setsockopt: s.setsockopt as Libc['setsockopt'],
      getsockopt: s.getsockopt as Libc['getsockopt'],
      bind: s.bind as Libc['bind'],
      getsockname: s.getsockname as Libc['getsockname'],
      sendto: s.sendto as Libc['sendto'],
      sendmmsg: s.sendmmsg as Libc['sendmmsg'],
      recvmmsg: (fd, msgvec, vlen, flags) => s.recvmmsg(fd, msgvec, vlen, flags, null) as number,
      address: (view) => ffi.ptr(view),
      memmove: s.memmove as Libc['memmove'],
      errno: () => read.i32(errnoAddress, 0),
    };
  }
  throw new Error(`libc not found (${errors.join('; ')})`);
}

let cached: Promise<Libc> | undefined;

/** The libc binding for this thread and runtime (loaded once per thread). */
export function loadLibc(): Promise<Libc> {
  cached ??= isBun ? bindWithBunFfi() : bindWithKoffi();
  return cached;
}

/** NUL-terminated bytes of `text` (for path arguments). */
export function cString(text: string): Uint8Array {
  const bytes = new TextEncoder().encode(text);
  const out = new Uint8Array(bytes.length + 1);
  out.set(bytes);
  return out;
}

/** Adds one to an eventfd's counter, which wakes whoever polls it. */
export function signalEventFd(libc: Libc, fd: number): void {
  const one = new Uint8Array(8);
  new BigUint64Array(one.buffer)[0] = 1n; // the counter increment, a host-order u64
  libc.write(fd, one, 8);
}

/** An Error for a failed libc call, with the errno and its symbolic name when known. */
export function errnoError(call: string, errno: number, detail = ''): Error & { errno: number; code?: string } {
  const code = ERRNO_NAMES[errno];
  const err = new Error(`${call} failed: ${code ?? 'errno'} ${errno}${detail ? ` (${detail})` : ''}`) as Error & { errno: number; code?: string };
  err.errno = errno;
  if (code) err.code = code;
  return err;
}

const ERRNO_NAMES: Record<number, string> = {
  1: 'EPERM', 2: 'ENOENT', 4: 'EINTR', 5: 'EIO', 6: 'ENXIO', 9: 'EBADF', 11: 'EAGAIN', 12: 'ENOMEM', 13: 'EACCES',
  16: 'EBUSY', 17: 'EEXIST', 19: 'ENODEV', 22: 'EINVAL', 24: 'EMFILE', 77: 'EBADFD', 90: 'EMSGSIZE', 95: 'EOPNOTSUPP',
  97: 'EAFNOSUPPORT', 98: 'EADDRINUSE', 99: 'EADDRNOTAVAIL', 101: 'ENETUNREACH', 105: 'ENOBUFS', 111: 'ECONNREFUSED',
  113: 'EHOSTUNREACH',
};

/**
 * Sets SO_MARK on a socket file descriptor (needs CAP_NET_ADMIN), for policy routing of the
 * encrypted traffic (wg's fwmark). Node's dgram has no such option; the fd of a bound dgram socket
 * is reachable through its handle. Throws on failure.
 */
export async function setSocketMark(fd: number, mark: number): Promise<void> {
  if (!Number.isInteger(fd) || fd < 0) throw new RangeError(`bad file descriptor ${fd}`);
  if (!Number.isInteger(mark) || mark < 0 || mark > 0xffffffff) throw new RangeError(`bad mark ${mark}`);
  const libc = await loadLibc();
  const value = new Uint8Array(4);
  new Uint32Array(value.buffer)[0] = mark; // host byte order, as the kernel reads an int
  if (libc.setsockopt(fd, SOL_SOCKET, SO_MARK, value, 4) !== 0) throw errnoError('setsockopt(SO_MARK)', libc.errno());
}
