// Whether the JavaScript that scripts/compile.mjs wrote beside each TypeScript source still matches
// it. Plain JavaScript: bin/launch.mjs asks this before it knows whether TypeScript can be loaded.
//
// The compile step records every source it compiled in a manifest: size, modification time and
// SHA-256. A source whose size differs, or whose time differs and whose content hash differs
// (a checkout or a copy can touch a file without changing it), or that is gone, or whose
// compiled file is missing, makes the whole build stale: then nothing compiled is run.
import { createHash } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';

/** The manifest, at the root of the checkout (git-ignored, like the compiled files). */
export const MANIFEST = '.compiled.json';
export const MANIFEST_FORMAT = 1;

/** The compiled file of a TypeScript source: `foo.ts` -> `foo.js`, in the same directory. */
export function compiledPath(source) {
  return source.replace(/\.ts$/, '.js');
}

function sha256(path) {
  return createHash('sha256').update(readFileSync(path)).digest('hex');
}

/** What the manifest records of one source (`path` relative to `root`). */
export function fingerprint(root, path) {
  const abs = join(root, path);
  const stat = statSync(abs);
  return { size: stat.size, mtimeMs: stat.mtimeMs, sha256: sha256(abs) };
}

/**
 * Undefined when the compiled JavaScript under `root` is complete and matches every source it was
 * compiled from; otherwise why not, in a few words naming the first file that differs.
 */
export function staleReason(root) {
  let manifest;
  try {
    manifest = JSON.parse(readFileSync(join(root, MANIFEST), 'utf8'));
  } catch {
    return 'not compiled';
  }
  if (manifest?.format !== MANIFEST_FORMAT || typeof manifest.files !== 'object' || manifest.files === null) return `${MANIFEST} is of another format`;
  for (const [path, recorded] of Object.entries(manifest.files)) {
    const abs = join(root, path);
    let stat;
    try {
      stat = statSync(abs);
    } catch {
      return `${path} is gone`;
    }
    if (stat.size !== recorded.size || (stat.mtimeMs !== recorded.mtimeMs && sha256(abs) !== recorded.sha256)) return `${path} changed since it was compiled`;
    try {
      statSync(join(root, compiledPath(path)));
    } catch {
      return `${compiledPath(path)} is missing`;
    }
  }
  return undefined;
}
