/**
 * The byte copy of the data path (dataplane/sys/copy-bytes.ts): under Node a misaligned copy
 * between shared buffers goes through libc's memmove by address. Checked against `set` over random
 * offsets, lengths and overlaps; the memmove path is shown to be taken exactly where it should
 * (and only there), and a range that does not fit throws before any byte moves.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { MEMMOVE_MIN_BYTES, copierFor, copyBySet } from '../../dataplane/sys/copy-bytes.ts';
import { loadLibc, type Libc } from '../../dataplane/sys/libc.ts';
import { isBun } from '../../dataplane/sys/threads.ts';
import { prng } from '../helpers/prng.ts';

/** The real libc with memmove calls counted. */
async function countingLibc(): Promise<{ libc: Libc; calls: () => number }> {
  const real = await loadLibc();
  let calls = 0;
  const libc: Libc = { ...real, memmove: (dst, src, length) => { calls++; real.memmove(dst, src, length); } };
  return { libc, calls: () => calls };
}

/** A random integer in [0, n). */
function below(random: () => number, n: number): number {
  return Math.floor(random() * n);
}

function sharedBytes(length: number, seed: number): Uint8Array {
  const bytes = new Uint8Array(new SharedArrayBuffer(length));
  const random = prng(seed);
  for (let i = 0; i < length; i++) bytes[i] = below(random, 256);
  return bytes;
}

describe('copy-bytes', () => {
  test('copies exactly what set copies, over random offsets, lengths and overlaps', async () => {
    const copy = copierFor(await loadLibc());
    const random = prng(7);
    for (let round = 0; round < 400; round++) {
      const source = sharedBytes(8192, round);
      // Views at random byte offsets, into another buffer or (a quarter of the time) the same one.
      const same = below(random, 4) === 0;
      const dstBuffer = same ? source : sharedBytes(8192, 1000 + round);
      const expected = dstBuffer.slice();
      const src = source.subarray(below(random, 64));
      const dst = dstBuffer.subarray(below(random, 64));
      const start = below(random, src.length - 2048);
      const end = start + below(random, 2048);
      const at = below(random, dst.length - 2048);
      // The expected result: the same copy made with set on a private copy of the bytes.
      const expectedSource = same ? expected : source.slice();
      const expectedDst = expected.subarray(dst.byteOffset);
      const expectedSrc = expectedSource.subarray(src.byteOffset);
      copyBySet(expectedDst, at, expectedSrc, start, end);
      copy(dst, at, src, start, end);
      assert.deepEqual(dstBuffer, expected, `round ${round}: [${start}, ${end}) at ${at}${same ? ', same buffer' : ''}`);
    }
  });

  test('under Node, a misaligned shared copy of MEMMOVE_MIN_BYTES or more goes by memmove; nothing else does', async () => {
    const { libc, calls } = await countingLibc();
    const copy = copierFor(libc);
    const src = sharedBytes(4096, 1);
    const dst = new Uint8Array(new SharedArrayBuffer(4096));
    const plain = new Uint8Array(4096);
    copy(dst, 3, src, 0, MEMMOVE_MIN_BYTES); // misaligned, long enough, both shared
    const misaligned = calls();
    copy(dst, 8, src, 0, 1368); // aligned
    copy(dst, 3, src, 0, MEMMOVE_MIN_BYTES - 1); // short
    copy(plain, 3, src, 0, 1368); // not shared
    copy(dst, 3, plain, 0, 1368);
    assert.equal(misaligned, isBun ? 0 : 1, 'the misaligned shared copy');
    assert.equal(calls(), misaligned, 'aligned, short and unshared copies use set');
    assert.deepEqual(dst.subarray(3, 3 + 1368), plain.subarray(0, 1368));
    if (isBun) assert.equal(copy, copyBySet, 'Bun copies fast with set: no FFI');
  });

  test('a range that does not fit throws a RangeError and moves nothing', async () => {
    const { libc, calls } = await countingLibc();
    const copy = copierFor(libc);
    const src = sharedBytes(2048, 2);
    const dst = new Uint8Array(new SharedArrayBuffer(2048));
    const cases: Array<[number, number, number]> = [
      [0, 2049, 1], // past the source
      [-1, 400, 1], // before the source
      [0, 400, 1700], // past the destination
      [0, 400, -3], // before the destination
      [0.5, 400.5, 1], // not whole offsets
      [400, 300, 1], // an end before the start
    ];
    for (const [start, end, at] of cases) {
      assert.throws(() => copy(dst, at, src, start, end), RangeError, `[${start}, ${end}) at ${at}`);
      assert.throws(() => copyBySet(dst, at, src, start, end), RangeError, `set: [${start}, ${end}) at ${at}`);
    }
    assert.equal(calls(), 0);
    assert.ok(dst.every((b) => b === 0), 'the destination is untouched');
  });
});
