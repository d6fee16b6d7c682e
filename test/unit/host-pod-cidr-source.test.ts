/**
 * Pod CIDR sources: the Node spec, the file format (comments, bad lines reported not fatal,
 * family filter), per-family resolution, and the file watcher (in-place writes, atomic rename
 * replacement, deletion, a directory that appears later, close).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, renameSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  parsePodCidrFile, parsePodCidrSourceKind, podCidrsFromSpec, readPodCidrFile, resolvePodCidrs, watchPodCidrFile,
  type PodCidrList,
} from '../../control/host/pod-cidr-source.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'rg-podcidr-'));
}

describe('sources', () => {
  test('source kinds', () => {
    assert.equal(parsePodCidrSourceKind('spec'), 'spec');
    assert.equal(parsePodCidrSourceKind(' File '), 'file');
    assert.equal(parsePodCidrSourceKind('none'), 'none');
    assert.throws(() => parsePodCidrSourceKind('expression', 'POD_CIDR_SOURCE_IPV4'), /POD_CIDR_SOURCE_IPV4 must be one of none, spec, file, got "expression"/);
  });

  test('spec: podCIDRs first, else podCIDR; filtered by family; canonical', () => {
    const dual = { metadata: { name: 'n1' }, spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['FD00:10:244:1::/64', '10.244.1.0/24'] } };
    assert.deepEqual(podCidrsFromSpec(dual, 4), ['10.244.1.0/24']);
    assert.deepEqual(podCidrsFromSpec(dual, 6), ['fd00:10:244:1::/64']);
    assert.deepEqual(podCidrsFromSpec(dual), ['10.244.1.0/24', 'fd00:10:244:1::/64']);
    assert.deepEqual(podCidrsFromSpec({ spec: { podCIDR: '10.244.7.0/24', podCIDRs: [] } }, 4), ['10.244.7.0/24']);
    assert.deepEqual(podCidrsFromSpec({ spec: { podCIDR: '10.244.7.0/24' } }, 6), []);
    assert.deepEqual(podCidrsFromSpec({ spec: null }, 4), [], 'no allocation yet');
    assert.deepEqual(podCidrsFromSpec({}, 4), []);
    assert.throws(() => podCidrsFromSpec({ metadata: { name: 'n1' }, spec: { podCIDRs: ['10.244.1.1/24'] } }, 4), /node n1 spec\.podCIDRs\[0\]: .*host bits/);
  });

  test('file: comments, blank lines, CRLF; bad lines reported with their line number, not fatal', () => {
    const text = [
      '# pod CIDRs of this node',
      '10.244.1.0/24   # primary',
      '',
      '   fd00:10:244:1::/64',
      'not-a-cidr',
      '10.244.2.5/24',
      '10.244.1.0/24',
      '\t10.244.3.0/24\r',
    ].join('\n');
    const both = parsePodCidrFile(text, undefined, 'cidrs.txt');
    assert.deepEqual(both.cidrs, ['10.244.1.0/24', '10.244.3.0/24', 'fd00:10:244:1::/64']);
    assert.equal(both.errors.length, 2);
    assert.match(both.errors[0], /^cidrs\.txt line 5: "not-a-cidr" is not a CIDR/);
    assert.match(both.errors[1], /^cidrs\.txt line 6: "10\.244\.2\.5\/24" has host bits set/);
    assert.deepEqual(parsePodCidrFile(text, 4).cidrs, ['10.244.1.0/24', '10.244.3.0/24']);
    assert.deepEqual(parsePodCidrFile(text, 6).cidrs, ['fd00:10:244:1::/64']);
    assert.deepEqual(parsePodCidrFile(''), { cidrs: [], errors: [] });
  });

  test('readPodCidrFile reads and names the path when it cannot', async () => {
    const dir = tempDir();
    try {
      const path = join(dir, 'cidrs.txt');
      writeFileSync(path, '10.244.1.0/24\nfd00::/64\n');
      assert.deepEqual(await readPodCidrFile(path, 6), { cidrs: ['fd00::/64'], errors: [] });
      await assert.rejects(readPodCidrFile(join(dir, 'missing.txt')), /cannot read pod CIDR file .*missing\.txt/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('resolvePodCidrs: per family spec, file or none', async () => {
    const dir = tempDir();
    try {
      const path = join(dir, 'cidrs.txt');
      writeFileSync(path, '10.99.0.0/24\nfd00:99::/64\nbad\n');
      const node = { spec: { podCIDRs: ['10.244.1.0/24', 'fd00:10:244:1::/64'] } };
      assert.deepEqual(await resolvePodCidrs({ ipv4: 'spec', ipv6: 'file', filePath: path }, node), {
        v4: ['10.244.1.0/24'], v6: ['fd00:99::/64'], errors: [`${path} line 3: "bad" is not a CIDR: the prefix length ("/24", "/64") is missing`],
      });
      assert.deepEqual(await resolvePodCidrs({ ipv4: 'file', ipv6: 'none', filePath: path }, undefined), { v4: ['10.99.0.0/24'], v6: [], errors: [`${path} line 3: "bad" is not a CIDR: the prefix length ("/24", "/64") is missing`] });
      assert.deepEqual(await resolvePodCidrs({ ipv4: 'none', ipv6: 'spec' }, node), { v4: [], v6: ['fd00:10:244:1::/64'], errors: [] });
      await assert.rejects(resolvePodCidrs({ ipv4: 'file', ipv6: 'none' }, node), /needs filePath/);
      await assert.rejects(resolvePodCidrs({ ipv4: 'spec', ipv6: 'none' }, undefined), /needs the Node object/);
      await assert.rejects(resolvePodCidrs({ ipv4: 'cel' as never, ipv6: 'none' }, node), /ipv4 pod CIDR source must be one of/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** Collects watcher callbacks; `next()` waits for the next one. */
function collector() {
  const changes: PodCidrList[] = [];
  const errors: Error[] = [];
  const waiters: Array<() => void> = [];
  const wake = () => { while (waiters.length) waiters.shift()!(); };
  return {
    changes, errors,
    onChange: (list: PodCidrList) => { changes.push(list); wake(); },
    onError: (err: Error) => { errors.push(err); wake(); },
    async until(what: string, condition: () => boolean, timeoutMs = 5000): Promise<void> {
      const deadline = Date.now() + timeoutMs;
      while (!condition()) {
        const left = deadline - Date.now();
        if (left <= 0) throw new Error(`timed out waiting for ${what}; changes: ${JSON.stringify(changes)}, errors: ${errors.map((e) => e.message).join('; ')}`);
        await Promise.race([new Promise<void>((r) => waiters.push(r)), sleep(Math.min(left, 100))]);
      }
    },
  };
}

describe('watchPodCidrFile', () => {
  test('initial content, in-place edit, atomic rename replacement, unchanged rewrite, deletion, close', async () => {
    const dir = tempDir();
    const path = join(dir, 'cidrs.txt');
    writeFileSync(path, '10.244.1.0/24\n');
    const c = collector();
    // A long poll interval: these changes must be noticed through the directory watch.
    const watch = watchPodCidrFile(path, c.onChange, { onError: c.onError, debounceMs: 20, pollIntervalMs: 60_000 });
    try {
      await c.until('the initial content', () => c.changes.length === 1);
      assert.deepEqual(c.changes[0].cidrs, ['10.244.1.0/24']);

      writeFileSync(path, '10.244.1.0/24\n10.244.2.0/24\n');
      await c.until('the in-place edit', () => c.changes.length === 2);
      assert.deepEqual(c.changes[1].cidrs, ['10.244.1.0/24', '10.244.2.0/24']);

      // How config tools replace a file: write a new one beside it, rename it over the old one.
      writeFileSync(join(dir, '.cidrs.txt.new'), 'fd00:10:244:1::/64\nbogus\n');
      renameSync(join(dir, '.cidrs.txt.new'), path);
      await c.until('the renamed-over file', () => c.changes.length === 3);
      assert.deepEqual(c.changes[2].cidrs, ['fd00:10:244:1::/64']);
      assert.equal(c.changes[2].errors.length, 1);

      writeFileSync(path, 'fd00:10:244:1::/64\nbogus\n'); // same bytes again
      writeFileSync(join(dir, 'unrelated.txt'), 'x');
      await sleep(300);
      assert.equal(c.changes.length, 3, 'unchanged content and unrelated files cause no callback');

      unlinkSync(path);
      await c.until('the read error', () => c.errors.length === 1);
      assert.match(c.errors[0].message, /cannot read pod CIDR file .*cidrs\.txt/);
      assert.equal(c.changes.length, 3, 'a missing file keeps the last content in force');

      writeFileSync(path, '10.244.5.0/24\n');
      await c.until('the recreated file', () => c.changes.length === 4);
      assert.deepEqual(c.changes[3].cidrs, ['10.244.5.0/24']);
    } finally {
      watch.close();
    }
    writeFileSync(path, '10.244.6.0/24\n');
    await sleep(200);
    assert.equal(c.changes.length, 4, 'no callback after close');
    watch.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test('polling finds a file whose directory did not exist when watching began', async () => {
    const base = tempDir();
    const dir = join(base, 'later');
    const path = join(dir, 'cidrs.txt');
    const c = collector();
    const watch = watchPodCidrFile(path, c.onChange, { onError: c.onError, debounceMs: 20, pollIntervalMs: 100 });
    try {
      await c.until('the first read error', () => c.errors.length >= 1);
      mkdirSync(dir);
      writeFileSync(path, '10.244.8.0/24\n');
      await c.until('the file, by polling', () => c.changes.length === 1);
      assert.deepEqual(c.changes[0].cidrs, ['10.244.8.0/24']);
      assert.equal(c.errors.length, 1, 'the same error is reported once, not on every poll');
    } finally {
      watch.close();
      rmSync(base, { recursive: true, force: true });
    }
  });

  test('bad arguments are refused', () => {
    assert.throws(() => watchPodCidrFile('', () => {}), /path is empty/);
    assert.throws(() => watchPodCidrFile('/tmp/x', undefined as never), /needs an onChange callback/);
    assert.throws(() => watchPodCidrFile('/tmp/x', () => {}, { pollIntervalMs: 0 }), /pollIntervalMs must be at least 10/);
  });
});
