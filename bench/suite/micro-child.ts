/**
 * The microbenchmarks of `roamguard bench`, run in a child process per runtime (Node and Bun) so
 * each gets a fresh heap and JIT:
 *
 *   node --expose-gc --import tsx bench/suite/micro-child.ts '{"quick":true,"peers":1000}'
 *   bun bench/suite/micro-child.ts '{"quick":true,"peers":1000}'
 *
 * AEAD seal/open MB/s per crypto provider at 64/512/1420 bytes (bench/micro/aead.ts), complete
 * handshakes per second on one core (bench/micro/handshake.ts), allowed-IPs lookups per second
 * with 1, 1 000 and 100 000 prefixes (bench/micro/allowedips.ts; IPv4 only with quick), and the
 * heap a core grows by per peer (bench/micro/peer-memory.ts). Writes one JSON object per line
 * to stdout: progress lines, then the result (see micro-types.ts).
 */
import { loadProviders, selectCrypto } from '../../dataplane/crypto/select.ts';
import { AEAD_SIZES, measureAead, megabytesPerSecond } from '../micro/aead.ts';
import { TABLE_SIZES, buildWorkload, measureLookups } from '../micro/allowedips.ts';
import { measureHandshakes } from '../micro/handshake.ts';
import { ON_BUN, runtimeLabel } from '../micro/measure.ts';
import { measurePeerMemory } from '../micro/peer-memory.ts';
import type { MicroMessage, MicroRuntimeResult, MicroSettings } from './micro-types.ts';

const send = (message: MicroMessage) => process.stdout.write(`${JSON.stringify(message)}\n`);
const progress = (text: string) => send({ type: 'progress', text });
const message = (err: unknown) => (err instanceof Error ? err.message : String(err)).split('\n')[0];

async function main(): Promise<void> {
  const settings = JSON.parse(process.argv[2] ?? '{}') as Partial<MicroSettings>;
  const quick = settings.quick === true;
  const peers = settings.peers ?? 1000;
  const started = performance.now();
  const result: MicroRuntimeResult = {
    runtime: ON_BUN ? 'bun' : 'node', version: runtimeLabel(), selected: {}, aead: [], aeadErrors: {}, allowedIps: [], errors: {}, elapsedSeconds: 0,
  };
  const aeadTiming = quick ? { measureMs: 50, runs: 2 } : { measureMs: 150, runs: 3 };

  const crypto = await selectCrypto();
  result.selected = { ...crypto.providers };
  for (const { provider, error } of await loadProviders()) {
    if (!provider.aead) continue;
    if (error && /aead/.test(error)) { result.aeadErrors[provider.name] = error; continue; }
    progress(`AEAD ${provider.name}`);
    try {
      for (const f of measureAead(provider, AEAD_SIZES, aeadTiming)) {
        result.aead.push({ provider: provider.name, size: f.size, sealMBps: megabytesPerSecond(f.sealsPerSecond, f.size), openMBps: megabytesPerSecond(f.opensPerSecond, f.size), batchSealMBps: megabytesPerSecond(f.batchSealsPerSecond, f.size) });
      }
    } catch (err) {
      result.aeadErrors[provider.name] = message(err);
    }
  }

  progress('handshakes per second');
  try {
    const h = measureHandshakes(crypto, quick ? { measureMs: 400, runs: 2 } : { measureMs: 1000, runs: 3 });
    result.handshakes = { perSecond: h.handshakesPerSecond, count: h.count };
  } catch (err) {
    result.errors.handshakes = message(err);
  }

  const families: Array<4 | 6> = quick ? [4] : [4, 6];
  for (const family of families) {
    for (const size of TABLE_SIZES) {
      progress(`allowed-IPs lookups, IPv${family}, ${size} prefixes`);
      try {
        const work = buildWorkload(size, family, 0x5eed + size, quick ? 1 << 15 : 1 << 17);
        const f = measureLookups(work, quick ? 2 : 4, quick ? 80 : 200);
        result.allowedIps.push({ family, prefixes: size, lookupsPerSecond: f.lookupsPerSecond, hitRatio: f.hitRatio, nodes: work.table.nodeCount });
      } catch (err) {
        result.errors[`allowed-IPs IPv${family} ${size}`] = message(err);
      }
    }
  }

  progress(`heap per peer (${peers} peers)`);
  try {
    const m = measurePeerMemory(crypto, peers);
    result.peerMemory = { peers: m.peers, heapBytesPerPeer: m.heapBytesPerPeer };
  } catch (err) {
    result.errors['peer memory'] = message(err);
  }

  result.elapsedSeconds = (performance.now() - started) / 1000;
  send({ type: 'result', result });
}

main().then(() => process.exit(0), (err: unknown) => {
  process.stderr.write(`micro-child: ${(err as Error)?.stack ?? String(err)}\n`);
  process.exit(1);
});
