/**
 * Child process of test/system/tun.test.ts: run inside a network namespace (`ip netns exec NS
 * node --import tsx tun-child.ts NAME [MTU]`, or the same with bun), it opens a TUN device there
 * (offloads as the daemon would open it: ROAMGUARD_TUN_OFFLOAD)
 * and answers ICMP/ICMPv6 echo requests read from it by writing the replies back, like a host
 * behind the tunnel. Other packets are only counted.
 *
 * Talks JSON lines. Out (stdout): {"event":"ready",name,mtu,runtime}, {"event":"stats",...},
 * {"event":"mtu",mtu}, {"event":"closed",reason} — after "closed" (the interface was deleted) it
 * exits 0 by itself. In (stdin): "stats", "mtu [N]" (set and/or report), "reset", "quit" (close the
 * device and exit 0). EOF on stdin (the test died)
 * also ends it.
 */
import { createInterface } from 'node:readline';
import { openTun } from '../../dataplane/tun/tun.ts';
import { loadDataplaneSettings } from '../../dataplane/settings.ts';
import type { LinuxTun } from '../../dataplane/tun/linux-tun.ts';
import { answerEchoRequest } from './packets.ts';

const [name, mtuArg] = process.argv.slice(2);
if (!name) {
  process.stderr.write('usage: tun-child.ts NAME [MTU]\n');
  process.exit(2);
}

const send = (message: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(message)}\n`);
const runtime = typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined' ? 'bun' : 'node';

const settings = loadDataplaneSettings();
const tun = await openTun(name, { ...(mtuArg ? { mtu: Number(mtuArg) } : {}), offload: settings.tunOffload });

const counters = { batches: 0, maxBatch: 0, multiBatches: 0, echoes: 0, other: 0, firstReadAt: 0, lastReadAt: 0 };
const replies: Uint8Array[] = [];

// TUN_CHILD_NO_START=1 leaves the device unread, so only the once-a-second check can notice its deletion.
if (process.env.TUN_CHILD_NO_START !== '1') tun.start((packets, count) => {
  const now = performance.now();
  if (counters.firstReadAt === 0) counters.firstReadAt = now;
  counters.lastReadAt = now;
  counters.batches++;
  if (count > 1) counters.multiBatches++;
  if (count > counters.maxBatch) counters.maxBatch = count;
  let n = 0;
  for (let i = 0; i < count; i++) {
    const reply = answerEchoRequest(packets[i]);
    if (reply) {
      replies[n++] = reply;
      counters.echoes++;
    } else {
      counters.other++;
    }
  }
  if (n > 0) tun.write(replies, n);
});

tun.onClose(() => {
  send({ event: 'closed', reason: (tun as LinuxTun).closeReason?.message ?? '' });
  process.exit(0);
});

// Ready once the reader really reads (its thread may still be starting on a loaded machine).
if (process.env.TUN_CHILD_NO_START !== '1') await tun.ready?.();
send({ event: 'ready', name: tun.name, mtu: tun.mtu, runtime, vnetHeader: (tun as LinuxTun).vnetHeader });

const lines = createInterface({ input: process.stdin });
lines.on('line', (line) => {
  const [command, arg] = line.trim().split(/\s+/);
  if (command === 'stats') {
    const seconds = (counters.lastReadAt - counters.firstReadAt) / 1000;
    const { readPackets, writePackets, writeErrors, readErrors } = tun.stats;
    send({ event: 'stats', ...counters, readPackets, writePackets, writeErrors, readErrors, readsPerSecond: seconds > 0 ? Math.round(tun.stats.readPackets / seconds) : 0 });
  } else if (command === 'mtu') {
    try {
      if (arg !== undefined) tun.setMtu(Number(arg));
      send({ event: 'mtu', mtu: tun.mtu });
    } catch (err) {
      send({ event: 'error', message: (err as Error).message });
    }
  } else if (command === 'reset') {
    Object.assign(counters, { batches: 0, maxBatch: 0, multiBatches: 0, echoes: 0, other: 0, firstReadAt: 0, lastReadAt: 0 });
    Object.assign(tun.stats, { readPackets: 0, writePackets: 0, writeErrors: 0 });
    send({ event: 'reset' });
  } else if (command === 'quit') {
    tun.close();
    process.exit(0);
  }
});
lines.on('close', () => {
  tun.close();
  process.exit(0);
});
