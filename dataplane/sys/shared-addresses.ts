/**
 * Raw addresses of views into SharedArrayBuffers, for pointers handed to the kernel or to libc
 * (iovecs of sendmmsg, memmove). A buffer's address is looked up once (libc.address is an FFI
 * call) and kept per buffer; a view's is that plus its byteOffset. Only shared memory qualifies:
 * it never moves and is never detached, so the address stays good while the buffer is reachable.
 */
import type { Libc } from './libc.ts';

export class SharedAddresses {
  private readonly bases = new WeakMap<SharedArrayBuffer, number>();

  constructor(private readonly libc: Libc) {}

  /** The address of `view[0]`; `view` must lie in a SharedArrayBuffer of at least one byte. */
  of(view: Uint8Array): number {
    const buffer = view.buffer;
    if (!(buffer instanceof SharedArrayBuffer)) throw new TypeError('SharedAddresses: the view is not of a SharedArrayBuffer (its memory may move)');
    let base = this.bases.get(buffer);
    if (base === undefined) {
      base = this.libc.address(new Uint8Array(buffer, 0, 1));
      this.bases.set(buffer, base);
    }
    return base + view.byteOffset;
  }
}
