/**
 * The multi-queue TUN (dataplane/tun/linux-tun.ts, tun-queue.ts) in a real daemon: A runs
 * `roamguard wg --threads 2` (two TUN queues, each read, sealed and sent by its own thread), B is
 * roamguard too. Sixteen UDP flows from A's side, interleaved, go to one port on B's side.
 *
 * - The flows spread over A's two readers (`tun_queue_reads` of get=roamguard-stats: both queues
 *   read a share). The kernel picks each flow's queue by its hash; with sixteen flows, all on one
 *   queue has odds of 2^-15.
 * - Each flow's datagrams arrive in the order they were sent: a flow stays on one reader, which
 *   seals and sends in order. Losses are allowed (UDP under load); a datagram older than one
 *   already received from its flow is not.
 *
 * Under both runtimes of the daemon.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { UapiClient } from '../../dataplane/uapi/uapi-client.ts';
import { createPair, Scope, waitFor, WG_SOCKET_DIR } from './netns.ts';
import { assertPing, describeTunnel, INNER, requireDaemonPrerequisites, startTunnel, type Implementation } from './userspace-wg.ts';

const FLOWS = 16;
const PER_FLOW = 1500;
const PORT = 9000;

/** B's side: counts datagrams per source port and those that came after a later one of their flow. */
const RECEIVER = `
const s = require('node:dgram').createSocket({ type: 'udp4', recvBufferSize: 8 << 20 });
const last = new Map(), got = new Map();
let reordered = 0, timer;
const done = () => { process.stdout.write(JSON.stringify({ flows: got.size, packets: [...got.values()].reduce((a, b) => a + b, 0), reordered }) + '\\n'); process.exit(0); };
s.on('message', (m, r) => {
  const seq = m.readUInt32BE(0), before = last.get(r.port);
  if (before !== undefined && seq <= before) reordered++;
  else last.set(r.port, seq);
  got.set(r.port, (got.get(r.port) ?? 0) + 1);
  clearTimeout(timer);
  timer = setTimeout(done, 1500);
});
s.bind(${PORT}, '${INNER.b.ipv4}', () => process.stdout.write('ready\\n'));
setTimeout(done, 60000);
`;

/**
 * A's side: FLOWS sockets, each sending PER_FLOW numbered datagrams, interleaved, in small paced
 * rounds: 80 datagrams a millisecond at most, so that what is lost (a receiver in JavaScript) does
 * not leave too few to judge the order by.
 */
const SENDER = `
const dgram = require('node:dgram');
const socks = Array.from({ length: ${FLOWS} }, () => dgram.createSocket('udp4'));
let seq = 0;
const round = () => {
  for (let k = 0; k < 5 && seq < ${PER_FLOW}; k++, seq++) {
    for (const s of socks) { const b = Buffer.alloc(200); b.writeUInt32BE(seq, 0); s.send(b, ${PORT}, '${INNER.b.ipv4}'); }
  }
  if (seq < ${PER_FLOW}) setTimeout(round, 1); else setTimeout(() => process.exit(0), 300);
};
round();
`;

const scope = new Scope();
after(async () => { await scope.cleanup(); });

describe('multi-queue TUN: several flows spread over the readers, each in order', { timeout: 240_000 }, () => {
  before(async () => { await requireDaemonPrerequisites(['roamguard-node', 'roamguard-bun']); });

  for (const implementation of ['roamguard-node', 'roamguard-bun'] as Implementation[]) {
    test(`${implementation} --threads 2`, async (t) => {
      const topo = await createPair(scope);
      const tunnel = await startTunnel(scope, topo, { a: { implementation, threads: 2 }, b: { implementation: 'roamguard-node' } });
      await assertPing(tunnel.a.ns, INNER.b.ipv4, { count: 2, deadlineS: 10 }, `A → B${describeTunnel(tunnel)}`);
      const client = UapiClient.forInterface(WG_SOCKET_DIR, tunnel.a.ifname);
      const before = (await client.stats())?.tunQueueReads;
      assert.equal(before?.length, 2, `two TUN queues: ${JSON.stringify(before)}`);

      const receiver = scope.spawn(tunnel.b.ns, process.execPath, ['-e', RECEIVER], { label: 'flow receiver' });
      await waitFor(() => receiver.stdout.includes('ready'), 15_000, { description: 'the receiver to listen' });
      await tunnel.a.ns.exec(process.execPath, ['-e', SENDER], { timeoutMs: 60_000 });
      await receiver.exited;
      const result = JSON.parse(receiver.stdout.split('\n').find((l) => l.startsWith('{')) ?? '{}') as { flows: number; packets: number; reordered: number };
      const reads = (await client.stats())!.tunQueueReads!.map((n, i) => n - before![i]);
      t.diagnostic(`${implementation}: ${result.packets} of ${FLOWS * PER_FLOW} datagrams in ${result.flows} flows; per TUN queue ${reads.join(' / ')}`);

      assert.equal(result.reordered, 0, `no datagram arrived after a later one of its flow: ${JSON.stringify(result)}`);
      assert.equal(result.flows, FLOWS, 'every flow arrived');
      assert.ok(result.packets >= FLOWS * PER_FLOW / 2, `most datagrams arrived: ${result.packets}`);
      for (const [i, n] of reads.entries()) assert.ok(n >= FLOWS * PER_FLOW / 40, `queue ${i} read its share: ${reads.join(' / ')}`);
    });
  }
});
