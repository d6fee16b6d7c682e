/**
 * The few libc calls the Linux TUN device needs and Node.js lacks (ioctl, poll on an arbitrary fd,
 * eventfd, read/write on a raw fd without libuv), bound through a foreign function interface:
 * koffi on Node, bun:ffi on Bun. Both backends expose exactly the {@link Libc} shape, so the code
 * that uses it does not care which runtime it runs on. It is loaded in the main thread (open,
 * ioctl, write) and in the TUN reader worker (poll, read).
 *
 * Pointers are Uint8Arrays (also views of a SharedArrayBuffer): the FFI hands the native function
 * the memory of the view itself, honouring byteOffset, without copying. Strings (paths) are passed
 * as NUL-terminated byte arrays, because bun:ffi has no string arguments.
 *
 * Variadic prototypes (open, ioctl) are declared with a fixed third argument: bun:ffi cannot call
 * variadic functions, and on the Linux ABIs we run on (x86-64 System V, AArch64) an integer or
 * pointer passed this way lands exactly where the variadic callee looks for it.
 *
 * The constants below are the Linux values (identical on x86-64 and AArch64).
 */

// --- Linux constants -----------------------------------------------------------------------------

export const O_RDWR = 0o2;
export const O_NONBLOCK = 0o4000;
export const O_CLOEXEC = 0o2000000;
export const EFD_NONBLOCK = O_NONBLOCK;
export const EFD_CLOEXEC = O_CLOEXEC;

export const AF_INET = 2;
export const SOCK_DGRAM = 2;
export const SOCK_CLOEXEC = O_CLOEXEC;
export const SOL_SOCKET = 1;
export const SO_MARK = 36;

export const POLLIN = 0x001;
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
export const EBADFD = 77;
/** errno values of a TUN read that mean the device has been detached (deleted) or the fd is unusable. */
export const DEVICE_GONE_ERRNOS: ReadonlySet<number> = new Set([EBADFD, EIO, ENXIO, ENODEV, EBADF]);

/** `_IOW('T', 202, int)` (linux/if_tun.h). */
export const TUNSETIFF = 0x400454ca;
export const IFF_TUN = 0x0001;
export const IFF_NO_PI = 0x1000;
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
  ioctl(fd: number, request: number, arg: Uint8Array): number;
  read(fd: number, buf: Uint8Array, count: number): number;
  write(fd: number, buf: Uint8Array, count: number): number;
  /** `fds` holds `nfds` struct pollfd (8 bytes each: int fd, short events, short revents). */
  poll(fds: Uint8Array, nfds: number, timeoutMs: number): number;
  eventfd(initval: number, flags: number): number;
  socket(domain: number, type: number, protocol: number): number;
  setsockopt(fd: number, level: number, name: number, value: Uint8Array, length: number): number;
  /** errno of the calling thread, as left by the last failed call made through this binding. */
  errno(): number;
}

/** The slice of bun:ffi used here (the project type-checks against Node's types only). */
interface BunFfi {
  dlopen(path: string, symbols: Record<string, { args: string[]; returns: string }>): { symbols: Record<string, (...args: any[]) => any> };
  read: { i32(pointer: number, offset?: number): number };
}

const isBun = typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined';

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
      ioctl: f('int ioctl(int fd, unsigned long request, uint8_t *arg)'),
      read: f('long read(int fd, uint8_t *buf, size_t count)'),
      write: f('long write(int fd, const uint8_t *buf, size_t count)'),
      poll: f('int poll(uint8_t *fds, unsigned long nfds, int timeout)'),
      eventfd: f('int eventfd(unsigned int initval, int flags)'),
      socket: f('int socket(int domain, int type, int protocol)'),
      setsockopt: f('int setsockopt(int fd, int level, int name, const uint8_t *value, unsigned int length)'),
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
    ioctl: { args: ['i32', 'u64', 'ptr'], returns: 'i32' },
    // ssize_t results fit an int here (at most 64 KiB or -1); i64 would come back as a BigInt.
    read: { args: ['i32', 'ptr', 'u64'], returns: 'i32' },
    write: { args: ['i32', 'ptr', 'u64'], returns: 'i32' },
    poll: { args: ['ptr', 'u64', 'i32'], returns: 'i32' },
    eventfd: { args: ['u32', 'i32'], returns: 'i32' },
    socket: { args: ['i32', 'i32', 'i32'], returns: 'i32' },
    setsockopt: { args: ['i32', 'i32', 'i32', 'ptr', 'u32'], returns: 'i32' },
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
      ioctl: s.ioctl as Libc['ioctl'],
      read: s.read as Libc['read'],
      write: s.write as Libc['write'],
      poll: s.poll as Libc['poll'],
      eventfd: s.eventfd as Libc['eventfd'],
      socket: s.socket as Libc['socket'],
      setsockopt: s.setsockopt as Libc['setsockopt'],
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
  16: 'EBUSY', 17: 'EEXIST', 19: 'ENODEV', 22: 'EINVAL', 24: 'EMFILE', 77: 'EBADFD', 95: 'EOPNOTSUPP',
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
