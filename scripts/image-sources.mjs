#!/usr/bin/env node
// Lists the source files the container image needs: every .ts/.mjs/.js/.json file under the given
// directories (tests excluded), plus whatever they reach through relative imports
// (`from '…'`, `import('…')`, `new URL('…', import.meta.url)` for worker entry points), followed
// across the repository — e.g. the bench's namespace helpers that live under test/ and lab/.
// Prints repository-relative paths, one per line, sorted. Used by scripts/build-image-tree.sh.
//
//   node scripts/image-sources.mjs bin dataplane control bench
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const SOURCE = /\.(ts|mjs|js|json)$/;
const SPECIFIER = /(?:\bfrom\s*|\bimport\s*\(\s*|\bnew\s+URL\(\s*)['"](\.{1,2}\/[^'"]+)['"]/g;

function walk(dir, out) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      if (entry.name !== 'node_modules' && entry.name !== 'results') walk(path, out);
    } else if (SOURCE.test(entry.name) && !entry.name.endsWith('.test.ts')) out.push(path);
  }
}

const queue = [];
for (const dir of process.argv.slice(2)) {
  const abs = resolve(root, dir);
  if (!existsSync(abs)) continue;
  if (statSync(abs).isDirectory()) walk(abs, queue);
  else queue.push(abs);
}
const seen = new Set();
while (queue.length > 0) {
  const file = queue.pop();
  if (seen.has(file)) continue;
  seen.add(file);
  if (!/\.(ts|mjs|js)$/.test(file)) continue;
  const text = readFileSync(file, 'utf8');
  for (const match of text.matchAll(SPECIFIER)) {
    const target = resolve(dirname(file), match[1]);
    if (!target.startsWith(`${root}/`) || target.includes('/node_modules/')) continue;
    if (existsSync(target) && statSync(target).isFile()) queue.push(target);
  }
}
process.stdout.write([...seen].map((f) => relative(root, f)).sort().join('\n') + '\n');
