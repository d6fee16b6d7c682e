/** A non-blocking UDP socket of our own (libc, not node:dgram) on 127.0.0.1, for tests that hand a reader thread a descriptor. */
import assert from 'node:assert/strict';
import { AF_INET, SOCK_CLOEXEC, SOCK_DGRAM, SOCK_NONBLOCK, SOCKADDR_IN_SIZE, loadLibc } from '../../dataplane/sys/libc.ts';

/** The socket's descriptor (the caller closes it, or hands it to something that does) and its port. */
export async function loopbackSocket(): Promise<{ fd: number; port: number }> {
  const libc = await loadLibc();
  const fd = libc.socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  assert.ok(fd >= 0, 'socket');
  const address = new Uint8Array(SOCKADDR_IN_SIZE);
  new Uint16Array(address.buffer, 0, 1)[0] = AF_INET;
  address.set([127, 0, 0, 1], 4);
  assert.equal(libc.bind(fd, address, SOCKADDR_IN_SIZE), 0, 'bind');
  const length = new Uint8Array(4);
  new Uint32Array(length.buffer)[0] = SOCKADDR_IN_SIZE;
  assert.equal(libc.getsockname(fd, address, length), 0, 'getsockname');
  return { fd, port: (address[2] << 8) | address[3] };
}
