/**
 * The UDP reader's read of a TUN queue's reply (tun/reply-reader.ts) against a scripted kernel:
 * it reads only a queue it marked, whose thread sleeps (queue-token.ts), has begun and was not
 * asked to stop, and whose ring has room for a super-packet; it reads once, into
 * the queue's own ring, where the main thread finds them as the queue's thread would have left
 * them. The real threads reading one queue by turns are in ring-stress.test.ts.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ReplyReader } from '../../dataplane/tun/reply-reader.ts';
import { DEFAULT_SLOTS, PACKET_OFFSET, REPLIES_READ, SLOT_SIZE, ringBytes, ringViews } from '../../dataplane/tun/ring.ts';
import { TunQueue, type QueueOwner } from '../../dataplane/tun/tun-queue.ts';
import { SENT_BOOKS_BYTES } from '../../dataplane/tun/sent-books.ts';
import { leaveQueue, leaveQueueAsHelper, takeQueue, tryTakeQueueAsHelper } from '../../dataplane/tun/queue-token.ts';
import { READ_SEQ, STATE, STATE_RUNNING, STATE_STOP_REQUESTED, WRITE_SEQ } from '../../dataplane/ring/shared-ring.ts';
import { EAGAIN, type Libc } from '../../dataplane/sys/libc.ts';

/** Two queues (descriptors 10 and 11), their rings running, and a kernel that holds `queued[fd]`: packet lengths. */
function setup() {
  const layout = { slots: DEFAULT_SLOTS, slotSize: SLOT_SIZE };
  const queues = [0, 1].map(() => ({ ring: new SharedArrayBuffer(ringBytes(layout)), books: new SharedArrayBuffer(SENT_BOOKS_BYTES) }));
  const views = queues.map((q) => ringViews(q.ring, layout));
  for (const v of views) Atomics.store(v.header, STATE, STATE_RUNNING);
  const queued: Record<number, number[]> = { 10: [], 11: [] };
  const reads: string[] = [];
  let serial = 0;
  const libc = {
    read(fd: number, buf: Uint8Array) {
      const length = queued[fd].shift();
      if (length === undefined) {
        reads.push(`${fd} EAGAIN`);
        return -1;
      }
      buf.fill(0, 0, length);
      buf[0] = 0x45;
      buf[1] = ++serial; // which packet this is, in the order the kernel handed them out
      reads.push(`${fd} ${length}`);
      return length;
    },
    errno: () => EAGAIN,
  } as unknown as Libc;
  const reader = new ReplyReader(libc, [10, 11], queues, false, undefined);
  /** The packets published in queue q's ring, as [serial, length], oldest first. */
  const published = (q: number) => {
    const v = views[q];
    const out: [number, number][] = [];
    for (let s = Atomics.load(v.header, READ_SEQ); s !== Atomics.load(v.header, WRITE_SEQ); s = (s + 1) | 0) {
      const slot = s & (DEFAULT_SLOTS - 1);
      out.push([v.data[slot * SLOT_SIZE + PACKET_OFFSET + 1], v.lengths[slot]]);
    }
    return out;
  };
  return { reader, queued, reads, views, published };
}

describe('reading a TUN queue\'s reply on the writing thread', () => {
  test('a marked queue whose thread sleeps: its reply lands in its ring, published; the mark is cleared', () => {
    const { reader, queued, reads, published } = setup();
    queued[11].push(84);
    const touched = new Uint8Array([0, 1]);
    assert.equal(reader.readReplies(touched), 1);
    assert.deepEqual([...touched], [0, 0]);
    assert.deepEqual(reads, ['11 84'], 'queue 10 was not written to: not read');
    assert.deepEqual(published(1), [[1, 84]]);
    assert.deepEqual(published(0), []);
  });

  test('each read that brought a reply is counted in its queue\'s ring (tun_replies_read); a look that found nothing is not', () => {
    const { reader, queued, views } = setup();
    queued[10].push(84);
    queued[11].push(84);
    reader.readReplies(new Uint8Array([1, 1]));
    reader.readReplies(new Uint8Array([1, 0])); // queue 10 is empty now
    queued[11].push(60, 61);
    reader.readReplies(new Uint8Array([0, 1]));
    assert.deepEqual(views.map((v) => Atomics.load(v.header, REPLIES_READ)), [1, 2]);
  });

  test('the main thread\'s count of a queue\'s replies goes on past the ring\'s 32-bit word', () => {
    const queue = new TunQueue({} as Libc, -1, 0, {} as QueueOwner);
    const header = ringViews(queue.shared.ring, { slots: DEFAULT_SLOTS, slotSize: SLOT_SIZE }).header;
    assert.equal(queue.repliesRead, 0);
    Atomics.store(header, REPLIES_READ, 0x7fff_fff0);
    assert.equal(queue.repliesRead, 0x7fff_fff0);
    Atomics.add(header, REPLIES_READ, 0x20); // past the sign bit
    assert.equal(queue.repliesRead, 0x8000_0010);
    Atomics.add(header, REPLIES_READ, 0x8000_0000); // past 2^32: the word wraps to 0x10
    assert.equal(Atomics.load(header, REPLIES_READ), 0x10);
    assert.equal(queue.repliesRead, 0x1_0000_0010);
    assert.equal(queue.repliesRead, 0x1_0000_0010, 'asking again adds nothing');
  });

  test('one read: the queue\'s thread, woken too, takes the rest (at a TCP sender, the data an ACK released)', () => {
    const { reader, queued, reads, published } = setup();
    queued[10].push(60, 61, 62);
    assert.equal(reader.readReplies(new Uint8Array([1, 0])), 1);
    assert.deepEqual(reads, ['10 60']);
    assert.deepEqual(published(0), [[1, 60]]);
    assert.deepEqual(queued[10], [61, 62]);
  });

  test('a queue its thread holds (awake, reading) is left alone; once it sleeps again it is read', () => {
    const { reader, queued, reads, views } = setup();
    queued[10].push(84);
    takeQueue(views[0].header);
    assert.equal(reader.readReplies(new Uint8Array([1, 0])), 0);
    assert.deepEqual(reads, []);
    leaveQueue(views[0].header);
    assert.equal(reader.readReplies(new Uint8Array([1, 0])), 1);
  });

  test('not before the queue\'s thread began, nor after it was asked to stop', () => {
    const { reader, queued, reads, views } = setup();
    queued[10].push(84);
    Atomics.store(views[0].header, STATE, 0); // booting
    assert.equal(reader.readReplies(new Uint8Array([1, 0])), 0);
    Atomics.store(views[0].header, STATE, STATE_STOP_REQUESTED);
    assert.equal(reader.readReplies(new Uint8Array([1, 0])), 0);
    assert.deepEqual(reads, []);
  });

  test('not into a ring less than half free (a super-packet\'s segments must find room without waiting)', () => {
    const { reader, queued, reads, views } = setup();
    queued[10].push(84);
    Atomics.store(views[0].header, WRITE_SEQ, DEFAULT_SLOTS / 2 + 1); // the main thread has not taken these
    assert.equal(reader.readReplies(new Uint8Array([1, 0])), 0);
    assert.deepEqual(reads, []);
    Atomics.store(views[0].header, READ_SEQ, 1);
    assert.equal(reader.readReplies(new Uint8Array([1, 0])), 1, 'half free again');
  });

  test('it gives the queue back, also when the queue was empty', () => {
    const { reader, queued, views } = setup();
    queued[10].push(84);
    assert.equal(reader.readReplies(new Uint8Array([1, 0])), 1);
    assert.equal(tryTakeQueueAsHelper(views[0].header), true, 'free after a read');
    leaveQueueAsHelper(views[0].header);
    assert.equal(reader.readReplies(new Uint8Array([1, 0])), 0);
    assert.equal(tryTakeQueueAsHelper(views[0].header), true, 'free after finding nothing');
  });

  test('an end whose looks find nothing (it sends the pings): after four in a row, looks come after fewer and fewer datagrams; a reply found ends that', () => {
    const { reader, queued, reads } = setup();
    const touched = new Uint8Array(2);
    const lookedAt: number[] = [];
    for (let datagram = 1; datagram <= 140; datagram++) {
      touched[0] = 1;
      const before = reads.length;
      reader.readReplies(touched);
      assert.equal(touched[0], 0, 'the mark is cleared, looked or not');
      if (reads.length > before) lookedAt.push(datagram);
    }
    // Four looks, then skips of 0, 1, 2, 4, ... 64 datagrams after each empty look.
    assert.deepEqual(lookedAt, [1, 2, 3, 4, 5, 7, 10, 15, 24, 41, 74, 139]);
    // Replies again (pings): the first look after the current skip finds one, and from then on
    // every datagram's reply is looked for.
    const found: number[] = [];
    for (let datagram = 141; datagram <= 300; datagram++) {
      queued[10].push(84);
      touched[0] = 1;
      if (reader.readReplies(touched) > 0) found.push(datagram);
    }
    assert.equal(found[0], 204, 'after the 64 datagrams skipped since the look at 139');
    assert.deepEqual(found, Array.from({ length: 97 }, (_, i) => 204 + i));
  });

  test('an answering end whose queue\'s thread wins the race to a reply now and then keeps looking', () => {
    const { reader, queued } = setup();
    const touched = new Uint8Array(2);
    let found = 0;
    for (let ping = 1; ping <= 200; ping++) {
      // Three replies in a row taken by the queue's thread (the look finds nothing), then one found.
      if (ping % 4 === 0) queued[10].push(84);
      touched[0] = 1;
      found += reader.readReplies(touched);
    }
    assert.equal(found, 50, 'every reply that was there when looked for');
  });
});
