// The source files the roamguard commands can load: every .ts/.mjs/.js/.json file under the given
// directories (tests excluded), plus whatever they reach through relative imports
// (`from '…'`, `import('…')`, `new URL('…', import.meta.url)` for worker entry points), followed
// across the repository — e.g. the bench's namespace helpers that live under test/ and lab/.
// scripts/image-sources.mjs prints it for the container image; scripts/compile.mjs compiles its
// TypeScript files.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

/** The directories whose commands and their dependencies make up the product. */
export const PRODUCT_DIRS = ['bin', 'dataplane', 'control', 'bench'];

const SOURCE = /\.(ts|mjs|js|json)$/;
const SPECIFIER = /(?:\bfrom\s*|\bimport\s*\(\s*|\bnew\s+URL\(\s*)['"](\.{1,2}\/[^'"]+)['"]/g;

/** A compiled `foo.js` beside its `foo.ts` is output (scripts/compile.mjs), not a source. */
function isCompiledOutput(path) {
  return path.endsWith('.js') && existsSync(`${path.slice(0, -3)}.ts`);
}

function walk(dir, out) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      if (entry.name !== 'node_modules' && entry.name !== 'results') walk(path, out);
    } else if (SOURCE.test(entry.name) && !entry.name.endsWith('.test.ts') && !isCompiledOutput(path)) out.push(path);
  }
}

/** Repository-relative paths under `root` of the closure of `dirs`, sorted. */
export function sourceClosure(root, dirs = PRODUCT_DIRS) {
  const queue = [];
  for (const dir of dirs) {
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
  return [...seen].map((f) => relative(root, f)).sort();
}
