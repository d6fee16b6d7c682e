/**
 * The reply to a packet, read by the thread that wrote the packet to the TUN.
 *
 * When the UDP reader writes a packet it opened to a TUN queue, the kernel often answers inside
 * that write: the echo reply to a ping, a TCP ACK, a response a local socket sends at once. The
 * answer lands on the same queue (the kernel steers a flow's packets back to the queue it was last
 * written through) and wakes that queue's thread. On an idle machine that thread sleeps, often on
 * the other, halted CPU, and took 80–170 µs of an idle ping's 0.4–0.5 ms round trip to be woken
 * and run (docs/performance.md). This module lets the UDP reader, which is already running, read
 * the queue right after its write and seal and send what it finds, with a sender of its own
 * (reader-sender.ts) on the sockets it receives on.
 *
 * Only a queue whose thread sleeps is read (queue-token.ts: the UDP reader only ever tries to take
 * the queue), so under load, with the queue's thread awake, its sealing stays where it is and the
 * UDP reader (the inbound bottleneck) is not given it. The read is short: one read (READS_PER_LOOK),
 * and only with half the ring free, so a super-packet's segments find room. What it reads goes
 * into the queue's own ring and books (queue-drain.ts), as the queue's thread would have put it:
 * the main thread cannot tell who read it. The UDP reader looks only after a quiet spell
 * (udp-reader-worker.ts); where its looks find nothing again and again (it is the end that sends
 * the pings, or a one-way trickle), it looks after fewer and fewer datagrams.
 */
import type { Libc } from '../sys/libc.ts';
import { STATE, STATE_RUNNING } from '../ring/shared-ring.ts';
import { DEFAULT_SLOTS, REPLIES_READ, SLOT_SIZE, ringViews } from './ring.ts';
import { QueueDrain } from './queue-drain.ts';
import { leaveQueueAsHelper, tryTakeQueueAsHelper } from './queue-token.ts';
import type { ReaderSender } from './reader-sender.ts';
import { SentBooks } from './sent-books.ts';
import type { TunQueueRing } from './tun.ts';

/**
 * Reads of one queue after a write: the reply. The queue's thread, woken too, takes what is left;
 * at a TCP sender the data an ACK releases can be a super-packet per read, which is that
 * thread's to seal, not the UDP reader's.
 */
const READS_PER_LOOK = 1;
/**
 * Free slots a queue's ring must have: a read places at most a super-packet's segments, 64 KiB
 * over the MSS, under 128 for any MTU from 576 up (below that a read may wait for the main
 * thread to free slots, as the queue's own thread would).
 */
const MIN_FREE_SLOTS = DEFAULT_SLOTS / 2;

/**
 * Empty looks in a row before the skipping starts. A look also finds nothing when the queue's
 * thread, woken by the same reply, got to it first (1 in 20 pings with a roamguard peer, 2 in 5
 * with wireguard-go); that must not stop the looks at an end that answers.
 */
const EMPTY_LOOKS_BEFORE_SKIPPING = 4;
/** The most datagrams in a row whose replies are not looked for, once skipping. */
const MAX_SKIPPED = 64;

export class ReplyReader {
  private readonly queues: { header: Int32Array; drain: QueueDrain }[];
  /**
   * Looks cost the thread a read and, at the end that sends the pings, delay the pinging process
   * (woken by this thread's TUN write, often onto this CPU): 0.03-0.06 ms an echo in a scratch
   * A/B. So after EMPTY_LOOKS_BEFORE_SKIPPING empty looks in a row the next look comes after
   * `skip` datagrams, doubled after each empty look up to MAX_SKIPPED; a look that finds a reply
   * ends the skipping.
   */
  private emptyLooks = 0;
  private skip = 0;
  private nextSkip = 0;

  /**
   * `fds`: this thread's descriptors of the queues, in queue order, as `rings`. `sender`: what
   * seals and sends the replies (without one they are left for the main thread, as a queue's
   * thread without a sender leaves them: tests).
   */
  constructor(libc: Libc, fds: readonly number[], rings: readonly TunQueueRing[], vnetHeader: boolean, sender: ReaderSender | undefined) {
    if (fds.length !== rings.length) throw new RangeError(`reply reader: ${fds.length} descriptors for ${rings.length} queue rings`);
    const layout = { slots: DEFAULT_SLOTS, slotSize: SLOT_SIZE };
    this.queues = rings.map((shared, i) => {
      const ring = ringViews(shared.ring, layout);
      const books = new SentBooks(shared.books);
      return { header: ring.header, drain: new QueueDrain({ libc, fd: fds[i], ring, ...layout, sender, books, vnetHeader }) };
    });
  }

  /**
   * After writes through the queues marked in `touched` (one byte per queue): reads the replies
   * of those whose thread sleeps, and clears the marks. Returns the reads that brought a packet.
   */
  readReplies(touched: Uint8Array): number {
    if (this.skip > 0) {
      this.skip--;
      touched.fill(0);
      return 0;
    }
    let reads = 0;
    let looked = false;
    for (let q = 0; q < touched.length; q++) {
      if (touched[q] === 0) continue;
      touched[q] = 0;
      const { header, drain } = this.queues[q];
      if (!tryTakeQueueAsHelper(header)) continue; // its thread is awake and reads it
      try {
        // Not before its thread began, nor once it was asked to stop (the device may be closing).
        if (Atomics.load(header, STATE) !== STATE_RUNNING) continue;
        drain.resume();
        if (drain.free() < MIN_FREE_SLOTS) continue;
        // A device gone or a stop request is for the queue's thread to see and act on.
        const before = drain.reads;
        looked = true;
        drain.drain(READS_PER_LOOK);
        const found = drain.reads - before;
        if (found > 0) Atomics.add(header, REPLIES_READ, found); // get=roamguard-stats: tun_replies_read
        reads += found;
      } finally {
        leaveQueueAsHelper(header);
      }
    }
    if (reads > 0) {
      this.emptyLooks = 0;
      this.nextSkip = 0;
    } else if (looked && ++this.emptyLooks >= EMPTY_LOOKS_BEFORE_SKIPPING) {
      this.skip = this.nextSkip;
      this.nextSkip = Math.min(MAX_SKIPPED, Math.max(1, 2 * this.nextSkip));
    }
    return reads;
  }
}
