/**
 * bin/launch.mjs runs the JavaScript that scripts/compile.mjs wrote only while it matches every
 * TypeScript source it was compiled from; otherwise the sources run. Checked on a small tree in a
 * temporary directory with the real launcher, freshness check and compile script: an entry module
 * that imports a second module and prints which form ran and that module's value.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const REPO = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const run = promisify(execFile);

/** A tree with the launcher and the compile step; bin/roamguard.ts prints "<form> <answer>". */
function makeTree(): string {
  const root = mkdtempSync(join(tmpdir(), 'roamguard-launch-'));
  for (const file of ['bin/launch.mjs', 'bin/compiled.mjs', 'scripts/compile.mjs', 'scripts/source-closure.mjs']) {
    mkdirSync(join(root, dirname(file)), { recursive: true });
    copyFileSync(join(REPO, file), join(root, file));
  }
  symlinkSync(join(REPO, 'node_modules'), join(root, 'node_modules'));
  writeFileSync(join(root, 'package.json'), '{ "name": "launch-test", "type": "module", "private": true }\n');
  mkdirSync(join(root, 'dataplane'));
  // Type annotations: the entry only loads where TypeScript is really handled.
  writeFileSync(join(root, 'bin/roamguard.ts'), [
    "import { answer } from '../dataplane/answer.ts';",
    "const form: string = import.meta.url.endsWith('.js') ? 'compiled' : 'sources';",
    'console.log(`${form} ${answer}`);',
    '',
  ].join('\n'));
  writeAnswer(root, 'one');
  return root;
}

function writeAnswer(root: string, value: string): void {
  writeFileSync(join(root, 'dataplane/answer.ts'), `export const answer: string = '${value}';\n`);
}

async function launch(root: string, runtime: 'node' | 'bun' = 'node'): Promise<string> {
  // By name, not process.execPath: this file also runs under `bun test`.
  const exe = runtime === 'node' ? 'node' : join(REPO, 'node_modules/.bin/bun');
  const { stdout } = await run(exe, [join(root, 'bin/launch.mjs')], { cwd: root, timeout: 30_000 });
  return stdout.trim();
}

async function compile(root: string): Promise<void> {
  await run('node', [join(root, 'scripts/compile.mjs'), root], { cwd: root, timeout: 60_000 });
}

test('the compiled JavaScript runs only while it matches every source; an edit runs the sources at once', { timeout: 120_000 }, async () => {
  const root = makeTree();
  try {
    assert.equal(await launch(root), 'sources one', 'never compiled: the sources run');

    await compile(root);
    assert.equal(await launch(root), 'compiled one', 'fresh: the compiled JavaScript runs');

    // An edit of a module the entry imports (not the entry itself), and of a different length.
    writeAnswer(root, 'three');
    assert.equal(await launch(root), 'sources three', 'an edited dependency: the sources run, with the edit');

    await compile(root);
    assert.equal(await launch(root), 'compiled three', 'compiled again');

    // Same size, new content: the time differs, so the content hash decides.
    writeAnswer(root, 'seven');
    utimesSync(join(root, 'dataplane/answer.ts'), new Date(), new Date(Date.now() + 5_000));
    assert.equal(await launch(root), 'sources seven', 'a same-size edit is seen by its hash');

    // Touched but unchanged (a checkout, a copy): still fresh.
    await compile(root);
    const later = new Date(statSync(join(root, 'dataplane/answer.ts')).mtimeMs + 60_000);
    utimesSync(join(root, 'dataplane/answer.ts'), later, later);
    assert.equal(await launch(root), 'compiled seven', 'a new time with the same content stays compiled');

    // Compiled output gone, or a source gone: the sources run (or fail as the sources would).
    unlinkSync(join(root, 'dataplane/answer.js'));
    assert.equal(await launch(root), 'sources seven', 'a missing compiled file: the sources run');

    await compile(root);
    rmSync(join(root, '.compiled.json'));
    assert.equal(await launch(root), 'sources seven', 'no manifest: the sources run');

    // Bun follows the same rule.
    await compile(root);
    assert.equal(await launch(root, 'bun'), 'compiled seven', 'Bun runs the fresh compiled JavaScript');
    writeAnswer(root, 'nine');
    assert.equal(await launch(root, 'bun'), 'sources nine', 'Bun runs the edited sources');
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test('the compile step skips a tree without sources (the image\'s dependency layer) and says so', async () => {
  const root = mkdtempSync(join(tmpdir(), 'roamguard-compile-empty-'));
  try {
    for (const file of ['bin/compiled.mjs', 'scripts/compile.mjs', 'scripts/source-closure.mjs']) {
      mkdirSync(join(root, dirname(file)), { recursive: true });
      copyFileSync(join(REPO, file), join(root, file));
    }
    writeFileSync(join(root, 'package.json'), '{ "name": "deps-only", "type": "module", "private": true }\n');
    const { stdout } = await run('node', [join(root, 'scripts/compile.mjs')], { cwd: root, timeout: 60_000 });
    assert.match(stdout, /no sources .*nothing to compile/);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});
