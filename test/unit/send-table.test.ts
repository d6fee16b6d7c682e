/**
 * The per-peer send table (dataplane/session/send-table.ts): what a thread that sends on its own
 * reads of a peer.
 * - what the main thread publishes is what a reader reads, IPv4 and IPv6, with and without a
 *   sticky source; an unchanged publish keeps the entry's SEQ, a change moves it;
 * - chunks come with their first peer and go with their last (the table stays bounded however
 *   peers come and go), and subscribers hear of both;
 * - a worker reading an entry the main thread keeps rewriting never reads a torn entry;
 * - a Peer keeps its entry by sendableKeypair's rule (the model-based check is in
 *   keypair-lifetime-model.test.ts, over random interleavings).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Endpoint, LocalSource } from '../../dataplane/net/endpoint.ts';
import { parseIp } from '../../dataplane/net/ip.ts';
import {
  CHUNK_ENTRIES, NO_KEYPAIR, PeerSendTable, newSendTarget, readSendTarget, sendEntrySeq, type SendChunkChange, type SendKeypair,
} from '../../dataplane/session/send-table.ts';
import { startWorker } from '../../dataplane/sys/threads.ts';
import { SEND_STATES, type EncodedStates, type SendTableWorkerConfig } from './send-table-worker.ts';

const SOAK = process.env.ROAMGUARD_SOAK === '1';

const keypair = (slot: number, generation: number, remoteIndex: number): SendKeypair => ({ at: { slot, generation }, remoteIndex });

describe('send table: what a reader reads', () => {
  test('IPv4 and IPv6 endpoints, with and without a sticky source, and the cleared entry', () => {
    const table = new PeerSendTable();
    table.add(5);
    assert.equal(table.read(5)!.keySlot, NO_KEYPAIR, 'a new peer is sent by the main thread');

    table.publish(5, keypair(12, 3, 0xfeedbeef), new Endpoint('192.0.2.44', 51820));
    let t = table.read(5)!;
    assert.deepEqual([t.keySlot, t.keyGeneration, t.remoteIndex >>> 0, t.family, t.port, t.sourceFamily], [12, 3, 0xfeedbeef, 4, 51820, 0]);
    assert.deepEqual([...t.address], [192, 0, 2, 44, ...new Array(12).fill(0)]);

    const local = new LocalSource(parseIp('2001:db8::2'), 7);
    table.publish(5, keypair(13, 4, 9), new Endpoint('2001:db8::99', 443, local));
    t = table.read(5)!;
    assert.deepEqual([t.keySlot, t.keyGeneration, t.remoteIndex, t.family, t.port, t.sourceFamily, t.sourceIfindex], [13, 4, 9, 6, 443, 6, 7]);
    assert.deepEqual([...t.address], [...parseIp('2001:db8::99')]);
    assert.deepEqual([...t.sourceAddress], [...parseIp('2001:db8::2')]);

    table.publish(5, null, new Endpoint('2001:db8::99', 443, local));
    t = table.read(5)!;
    assert.deepEqual([t.keySlot, t.family, t.port, t.sourceFamily], [NO_KEYPAIR, 0, 0, 0], 'no keypair: nothing else is published either');
    table.publish(5, keypair(13, 4, 9), undefined);
    assert.equal(table.read(5)!.keySlot, NO_KEYPAIR, 'no endpoint: the main thread sends');
    assert.equal(table.read(5 * CHUNK_ENTRIES), undefined, 'a number of a chunk never made has no entry');
  });

  test('an unchanged publish keeps SEQ (readers keep what they derived); a change moves it by two', () => {
    const table = new PeerSendTable();
    table.add(70);
    const endpoint = new Endpoint('192.0.2.1', 1);
    table.publish(70, keypair(1, 1, 1), endpoint);
    const seq = table.read(70)!.seq;
    assert.equal(seq % 2, 0);
    table.publish(70, keypair(1, 1, 1), new Endpoint('192.0.2.1', 1));
    assert.equal(table.read(70)!.seq, seq, 'the same values again: no write');
    table.publish(70, keypair(1, 2, 1), endpoint);
    assert.equal(table.read(70)!.seq, seq + 2);
    table.publish(70, keypair(1, 2, 1), new Endpoint('192.0.2.1', 1, new LocalSource(parseIp('192.0.2.200'), 3)));
    assert.equal(table.read(70)!.seq, seq + 4, 'a new sticky source is a change');
  });

  test('chunks come with their first peer and go with their last; subscribers hear of both', () => {
    const table = new PeerSendTable();
    const heard: SendChunkChange[] = [];
    table.onChange((change) => heard.push(change));
    for (let n = 0; n < 3 * CHUNK_ENTRIES; n++) table.add(n);
    assert.equal(table.chunkCount, 3);
    assert.deepEqual(heard.map((c) => [c.chunk, c.buffer !== undefined]), [[0, true], [1, true], [2, true]]);
    assert.deepEqual(table.currentChunks.map((c) => c.chunk), [0, 1, 2]);
    const held = table.currentChunks[1].buffer!;
    table.publish(CHUNK_ENTRIES + 1, keypair(4, 4, 4), new Endpoint('192.0.2.9', 9));
    // Peers come and go: one long-lived peer keeps its chunk, every other chunk goes.
    for (let n = 0; n < 3 * CHUNK_ENTRIES; n++) if (n !== CHUNK_ENTRIES + 1) table.remove(n);
    assert.equal(table.chunkCount, 1);
    assert.deepEqual(heard.slice(3).map((c) => [c.chunk, c.buffer !== undefined]), [[0, false], [2, false]]);
    table.remove(CHUNK_ENTRIES + 1);
    assert.equal(table.chunkCount, 0);
    assert.equal(readSendTarget(new Int32Array(held), 1, newSendTarget()), false, 'a removed peer\'s entry names no keypair, for a reader still holding the chunk');
    assert.throws(() => table.publish(CHUNK_ENTRIES + 1, null, undefined), /no entry for peer/);
  });
});

describe('send table: a worker reading while the main thread writes', () => {
  test('never reads a torn entry (the seqlock)', { timeout: 60_000 }, async () => {
    const table = new PeerSendTable();
    const number = 3 * CHUNK_ENTRIES + 17;
    table.add(number);
    const chunk = table.currentChunks[0].buffer!;
    const encoded: EncodedStates = {
      addresses: SEND_STATES.map((s) => parseIp(s.host)),
      locals: SEND_STATES.map((s) => (s.local === undefined ? undefined : parseIp(s.local))),
    };
    const endpoints = SEND_STATES.map((s, i) => new Endpoint(s.host, s.port, encoded.locals[i] && new LocalSource(encoded.locals[i]!, 2)));
    const control = new Int32Array(new SharedArrayBuffer(16));
    const config: SendTableWorkerConfig & EncodedStates = { chunk, index: number % CHUNK_ENTRIES, control: control.buffer as SharedArrayBuffer, ...encoded };
    const worker = startWorker(new URL('./send-table-worker.ts', import.meta.url), { ...config });
    const exited = new Promise<number>((resolve, reject) => { worker.once('exit', resolve); worker.once('error', reject); });
    // Until the worker runs, its reads would prove nothing.
    while (Atomics.load(control, 3) === 0) await new Promise((resolve) => setTimeout(resolve, 5));
    const until = performance.now() + (SOAK ? 30_000 : 1000);
    let writes = 0;
    while (performance.now() < until) {
      for (let i = 0; i < 1000; i++, writes++) {
        const which = writes % 3;
        if (which === 2) table.publish(number, null, undefined);
        else table.publish(number, keypair(SEND_STATES[which].slot, SEND_STATES[which].generation, SEND_STATES[which].remoteIndex), endpoints[which]);
      }
      await new Promise((resolve) => setImmediate(resolve));
    }
    Atomics.store(control, 0, 1);
    await exited;
    assert.equal(Atomics.load(control, 1), 0, 'the worker read a torn entry');
    assert.ok(Atomics.load(control, 2) > 1000, `the worker read published states: ${Atomics.load(control, 2)} of ${Atomics.load(control, 3)}`);
    assert.ok(sendEntrySeq(new Int32Array(chunk), number % CHUNK_ENTRIES) >= 2 * writes - 2, 'every write moved SEQ');
  });
});
