/**
 * docs/security.md cannot rot silently: every line of its tables names the test that proves it,
 * as a backquoted `test/...` path, optionally with a quoted piece of the test's title and a
 * "(pending: branch)" mark for a protection still on a branch.
 *
 * - unmarked: the file exists, and the quoted title is in it;
 * - pending: the file, or with a title the title in the file, does NOT exist yet: so once the
 *   branch is merged this test fails until the mark is taken off (and the title checked).
 *
 * Titles are compared with the source text as written, minus the backslashes of escaped quotes.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = join(fileURLToPath(new URL('.', import.meta.url)), '..', '..');
const DOC_PATH = 'docs/security.md';

export interface ProofReference {
  path: string;
  title: string | undefined;
  pending: string | undefined;
  /** The table row it came from, for messages. */
  row: string;
}

const REFERENCE = /`(test\/[A-Za-z0-9_./-]+\.ts)`(?:\s+"([^"]+)")?(?:\s+\*?\(pending: ([^)]+)\)\*?)?/g;

/** Rows of the tables whose header has a "proven by" column, and the references in that column. */
export function proofRows(markdown: string): Array<{ row: string; references: ProofReference[] }> {
  const rows: Array<{ row: string; references: ProofReference[] }> = [];
  let column = -1;
  for (const line of markdown.split('\n')) {
    if (!line.startsWith('|')) {
      column = -1;
      continue;
    }
    const cells = line.split('|').slice(1, -1).map((c) => c.trim());
    if (column === -1) {
      column = cells.findIndex((c) => c.toLowerCase() === 'proven by');
      if (column === -1) column = -2; // a table without proofs: not ours to check
      continue;
    }
    if (column < 0 || /^-+$/.test(cells[0] ?? '')) continue;
    const cell = cells[column] ?? '';
    const references = [...cell.matchAll(REFERENCE)].map((m) => ({ path: m[1], title: m[2], pending: m[3], row: line.slice(0, 80) }));
    rows.push({ row: line.slice(0, 80), references });
  }
  return rows;
}

/** What is wrong with one reference, or undefined. */
export function checkReference(ref: ProofReference, readSource: (path: string) => string | undefined): string | undefined {
  const source = readSource(ref.path)?.replace(/\\(['"`])/g, '$1');
  const present = source !== undefined && (ref.title === undefined || source.includes(ref.title));
  const what = ref.title === undefined ? ref.path : `${ref.path} "${ref.title}"`;
  if (ref.pending === undefined) {
    if (source === undefined) return `${what}: no such file`;
    if (!present) return `${what}: no test with that title in the file`;
    return undefined;
  }
  if (source !== undefined && ref.title === undefined) return `${what} (pending: ${ref.pending}): the file exists; take the mark off, or quote the title that is pending`;
  if (present) return `${what} (pending: ${ref.pending}): it is here now; take the mark off`;
  return undefined;
}

function readRepoFile(path: string): string | undefined {
  const full = join(ROOT, path);
  return existsSync(full) ? readFileSync(full, 'utf8') : undefined;
}

describe('docs/security.md', () => {
  const doc = readFileSync(join(ROOT, DOC_PATH), 'utf8');

  test('has a section per attacker, Observed endpoints and Secrets', () => {
    for (const heading of ['A peer on the internet', 'An on-path attacker', 'A compromised node', 'A stolen agent token', 'A pod on the node', 'Observed endpoints', 'Secrets']) {
      assert.match(doc, new RegExp(`^## ${heading}$`, 'm'), heading);
    }
  });

  test('every line of a "proven by" table names at least one test', () => {
    const rows = proofRows(doc);
    assert.ok(rows.length >= 30, `${rows.length} rows`);
    const without = rows.filter((r) => r.references.length === 0).map((r) => r.row);
    assert.deepEqual(without, []);
  });

  test('every test it names exists (with its title); every pending one is still pending', (t) => {
    const references = proofRows(doc).flatMap((r) => r.references);
    const problems = references.map((ref) => checkReference(ref, readRepoFile)).filter((p) => p !== undefined);
    assert.deepEqual(problems, []);
    const pending = references.filter((r) => r.pending !== undefined);
    t.diagnostic(`${references.length} references, ${pending.length} pending: ${[...new Set(pending.map((r) => `${r.path} (${r.pending})`))].join(', ')}`);
  });

  test('the checker itself: a missing file, a missing title, a landed pending line are caught', () => {
    const files: Record<string, string> = { 'test/unit/a.test.ts': "test('it\\'s here', () => {});" };
    const read = (path: string) => files[path];
    const md = [
      '| | what | proven by |', '|---|---|---|',
      '| can | x | `test/unit/a.test.ts` "it\'s here" |',
      '| can | y | `test/unit/missing.test.ts` |',
      '| can | z | `test/unit/a.test.ts` "not a title" |',
      '| can | w | `test/unit/a.test.ts` "it\'s here" *(pending: fix/x)* |',
      '| can | v | `test/unit/later.test.ts` *(pending: fix/x)* |',
      '| can | u | nothing here |',
    ].join('\n');
    const rows = proofRows(md);
    assert.equal(rows.length, 6);
    assert.deepEqual(rows.map((r) => r.references.length), [1, 1, 1, 1, 1, 0]);
    const verdicts = rows.flatMap((r) => r.references).map((ref) => checkReference(ref, read));
    assert.equal(verdicts[0], undefined);
    assert.match(verdicts[1]!, /no such file/);
    assert.match(verdicts[2]!, /no test with that title/);
    assert.match(verdicts[3]!, /it is here now; take the mark off/);
    assert.equal(verdicts[4], undefined);
  });
});
