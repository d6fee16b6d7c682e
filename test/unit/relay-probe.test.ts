/**
 * The relay prober sends one byte of UDP to port 9 of each target every interval, stops when it
 * has no targets, and starts again when it gets some (needs root: it listens on port 9 of
 * loopback to see the probes).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { RelayProber } from '../../control/agent/relay-probe.ts';

test('probes reach port 9 of each target every interval and stop with no targets', async (t) => {
  // An address of its own in 127/8: the Bun run of the unit tests may listen on port 9 meanwhile.
  const target = `127.${1 + Math.floor(Math.random() * 250)}.${Math.floor(Math.random() * 256)}.${1 + Math.floor(Math.random() * 250)}`;
  const received: Array<{ from: string; bytes: number; at: number }> = [];
  const listener = dgram.createSocket('udp4');
  await new Promise<void>((resolve, reject) => { listener.once('error', reject); listener.bind(9, target, resolve); });
  listener.on('message', (msg, rinfo) => received.push({ from: rinfo.address, bytes: msg.length, at: Date.now() }));
  const prober = new RelayProber(100);
  t.after(() => { prober.close(); listener.close(); });

  prober.setTargets([target]);
  await new Promise((r) => setTimeout(r, 450));
  const whileProbing = received.length;
  // One at once, then one per 100 ms: 5 on time, fewer on a busy machine, never more.
  assert.ok(whileProbing >= 2 && whileProbing <= 6, `${whileProbing} probes in 450 ms at one per 100 ms`);
  assert.ok(received.every((r) => r.bytes === 1), 'each probe is one byte');
  assert.equal(prober.sent, whileProbing);

  prober.setTargets([]);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(received.length, whileProbing, 'no targets: no probes');

  prober.setTargets([target]);
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(received.length, whileProbing + 1, 'new targets are probed at once');
});

test('a target that cannot be reached costs nothing: no throw, no unhandled error', async (t) => {
  const prober = new RelayProber(50);
  t.after(() => prober.close());
  prober.setTargets(['192.0.2.1', '2001:db8::1']);
  await new Promise((r) => setTimeout(r, 200));
  assert.ok(prober.sent >= 4);
});
