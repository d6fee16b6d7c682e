/**
 * Crypto microbenchmark: per provider, ChaCha20-Poly1305 seals/s (and opens/s) at WireGuard packet
 * sizes, X25519 operations/s, and HMAC-BLAKE2s / keyed-BLAKE2s MAC operations/s, plus which
 * provider selectCrypto() picks for each group.
 *
 *   node --import tsx bench/crypto-micro.ts
 *   bun bench/crypto-micro.ts
 *
 * Each figure is the best of three timed runs of ~MEASURE_MS after a warm-up, single-threaded.
 * Seals write into a preallocated buffer, as the data path does. These numbers justify the
 * preference order in dataplane/crypto/select.ts. The AEAD part lives in bench/micro/aead.ts,
 * which `roamguard bench` also runs (in a child process per runtime).
 */

import { loadProviders, selectCrypto } from '../dataplane/crypto/select.ts';
import type { CryptoProvider } from '../dataplane/crypto/primitives.ts';
import { AEAD_SIZES, measureAead } from './micro/aead.ts';
import { opsPerSecond as timedOpsPerSecond, runtimeLabel } from './micro/measure.ts';

const MEASURE_MS = Number(process.env.BENCH_MS ?? 300);
const TIMING = { measureMs: MEASURE_MS, runs: 3 };

/** Operations per second of `op`, best of three runs (batches of `batch` calls between clock reads). */
const opsPerSecond = (op: () => void, batch: number): number => timedOpsPerSecond(op, batch, TIMING);

const fmt = (n: number) => (n >= 1e6 ? `${(n / 1e6).toFixed(2)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}k` : n.toFixed(0));
const mbps = (opsPerSec: number, bytes: number) => `${((opsPerSec * bytes * 8) / 1e9).toFixed(2)} Gbit/s`;

function benchAead(p: CryptoProvider): void {
  for (const { size, sealsPerSecond: seals, opensPerSecond: opens, batchSealsPerSecond: batched } of measureAead(p, AEAD_SIZES, TIMING)) {
    console.log(`  aead ${String(size).padStart(4)} B  seal ${fmt(seals).padStart(7)}/s (${mbps(seals, size)})  open ${fmt(opens).padStart(7)}/s (${mbps(opens, size)})  seal in batches ${fmt(batched).padStart(7)}/s (${mbps(batched, size)})`);
  }
}

function benchDh(p: CryptoProvider): void {
  const d = p.dh!;
  const staticPrivate = new Uint8Array(32).fill(3);
  const peer = d.publicKey(new Uint8Array(32).fill(5));
  const shared = opsPerSecond(() => { d.sharedSecret(staticPrivate, peer); }, 20);
  // A fresh private key every time, as with ephemeral keys (no KeyObject cache hit in node:crypto).
  const fresh = new Uint8Array(32).fill(9);
  let i = 0;
  const ephemeral = opsPerSecond(() => { fresh[0] = i++; fresh[1] = i >>> 8; d.sharedSecret(fresh, peer); }, 20);
  const pub = opsPerSecond(() => { fresh[2] = i++; d.publicKey(fresh); }, 20);
  // The X25519 work of one handshake side: a fresh ephemeral key pair, then four DH with the
  // ephemeral and the static key alternating (what the Noise IK pattern does).
  const peerEphemeral = d.publicKey(new Uint8Array(32).fill(6));
  const handshakes = opsPerSecond(() => {
    fresh[3] = i++; fresh[4] = i >>> 8;
    d.publicKey(fresh);
    d.sharedSecret(fresh, peer);
    d.sharedSecret(staticPrivate, peer);
    d.sharedSecret(fresh, peerEphemeral);
    d.sharedSecret(staticPrivate, peerEphemeral);
  }, 4);
  console.log(`  x25519  shared (static key) ${fmt(shared)}/s  shared (fresh key) ${fmt(ephemeral)}/s  publicKey (fresh key) ${fmt(pub)}/s  handshake mix ${fmt(handshakes)}/s`);
}

function benchHashes(p: CryptoProvider): void {
  const h = p.hashes!;
  const key = new Uint8Array(32).fill(1);
  const input = new Uint8Array(32).fill(2);
  const one = new Uint8Array([1]);
  const hmac = opsPerSecond(() => { h.hmac(key, input); }, 200);
  const kdf2 = opsPerSecond(() => { const prk = h.hmac(key, input); const t0 = h.hmac(prk, one); h.hmac(prk, t0, one); }, 100);
  const mac1Input = new Uint8Array(116); // an initiation message up to mac1
  const mac = opsPerSecond(() => { h.mac(key, mac1Input); }, 200);
  const hash = opsPerSecond(() => { h.hash(key, input); }, 200);
  console.log(`  blake2s hmac ${fmt(hmac)}/s  KDF2 ${fmt(kdf2)}/s  mac(116 B) ${fmt(mac)}/s  hash(64 B) ${fmt(hash)}/s`);
}

function benchXAead(p: CryptoProvider): void {
  const x = p.xaead!;
  const key = new Uint8Array(32), nonce = new Uint8Array(24), cookie = new Uint8Array(16), ad = new Uint8Array(16);
  console.log(`  xaead cookie reply ${fmt(opsPerSecond(() => { x.xseal(key, nonce, cookie, ad); }, 100))}/s`);
}

console.log(`crypto-micro on ${runtimeLabel()} (${process.arch}), ${MEASURE_MS} ms per figure, best of 3`);

for (const { provider, error } of await loadProviders()) {
  console.log(`\n${provider.name}${error ? `  (self-test failures: ${error})` : ''}`);
  if (provider.aead) benchAead(provider);
  if (provider.xaead) benchXAead(provider);
  if (provider.dh) benchDh(provider);
  if (provider.hashes) benchHashes(provider);
}

const chosen = await selectCrypto();
console.log('\nselectCrypto() picks:', JSON.stringify(chosen.providers));
