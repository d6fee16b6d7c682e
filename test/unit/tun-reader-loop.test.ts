/**
 * The TUN reader's loop (tun/reader-worker.ts) against a scripted kernel and a recording sender:
 * in what order it reads and hands packets to the sender. The first packet of a wake-up leaves
 * before the read that finds the kernel's queue empty (an idle ping's hop is one read, not two);
 * what else is queued still goes in rounds.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { runReader } from '../../dataplane/tun/reader-worker.ts';
import { ringBytes, ringViews } from '../../dataplane/tun/ring.ts';
import { STATE, STATE_STOPPED, STATE_STOP_REQUESTED, WRITE_SEQ } from '../../dataplane/ring/shared-ring.ts';
import { EAGAIN, POLLIN, type Libc } from '../../dataplane/sys/libc.ts';
import type { ReaderSender } from '../../dataplane/tun/reader-sender.ts';

/**
 * Runs the reader over `wakes`: at each poll the kernel's queue holds the next list of packet
 * lengths; after the last the main thread asks it to stop. Returns what happened, in order:
 * `read N` (a packet of N bytes), `read EAGAIN`, `send K` (the sender got K packets).
 */
function script(wakes: number[][]): string[] {
  const layout = { slots: 256, slotSize: 2048 }; // room for every packet: nothing consumes them here
  const buffer = new SharedArrayBuffer(ringBytes(layout));
  const ring = ringViews(buffer, layout);
  const events: string[] = [];
  let queue: number[] = [];
  let wake = 0;
  const libc = {
    poll(fds: Uint8Array) {
      const revents = new Int16Array(fds.buffer, fds.byteOffset, 8);
      if (wake < wakes.length) {
        queue = [...wakes[wake++]];
        revents[3] = POLLIN; // the TUN fd is readable
      } else {
        Atomics.store(ring.header, STATE, STATE_STOP_REQUESTED);
        revents[7] = POLLIN; // the main thread's eventfd: stop
      }
      return 1;
    },
    read(fd: number, buf: Uint8Array) {
      if (fd !== 3) return 8; // the eventfd's counter
      const length = queue.shift();
      if (length === undefined) {
        events.push('read EAGAIN');
        return -1;
      }
      buf.fill(0x45, 0, length);
      events.push(`read ${length}`);
      return length;
    },
    errno: () => EAGAIN,
  } as unknown as Libc;
  const sender = {
    sendErrors: 0,
    handle(_data: Uint8Array, _stride: number, _lengths: Int32Array, _records: Int32Array, _first: number, count: number) {
      events.push(`send ${count}`);
      return false; // left for the main thread: the slots are published
    },
    takeChanges() {},
    close() {},
  } as unknown as ReaderSender;
  runReader(libc, { fd: 3, wakeFd: 4, buffer, ...layout }, sender);
  assert.equal(Atomics.load(ring.header, STATE), STATE_STOPPED);
  assert.equal(Atomics.load(ring.header, WRITE_SEQ), wakes.flat().length, 'every packet published');
  return events;
}

describe('TUN reader loop: reads and sends in order', () => {
  test('an idle wake-up sends its one packet before the read that finds the queue empty', () => {
    assert.deepEqual(script([[84], [84]]), [
      'read 84', 'send 1', 'read EAGAIN',
      'read 84', 'send 1', 'read EAGAIN',
    ]);
  });

  test('a queue of several: the first goes at once, the rest in one round once the queue is empty', () => {
    assert.deepEqual(script([[100, 200, 300, 400]]), [
      'read 100', 'send 1', 'read 200', 'read 300', 'read 400', 'read EAGAIN', 'send 3',
    ]);
  });

  test('a long queue is cut into rounds of 64 after the first packet', () => {
    const events = script([Array.from({ length: 1 + 64 + 10 }, () => 60)]);
    assert.deepEqual(events.filter((e) => e.startsWith('send')), ['send 1', 'send 64', 'send 10']);
    assert.equal(events.indexOf('send 1'), 1, 'the first packet leaves right after its read');
  });
});
