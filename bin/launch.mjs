// What bin/roamguard runs: the compiled JavaScript (scripts/compile.mjs) when it matches every
// TypeScript source it was compiled from, else the TypeScript sources themselves — through tsx
// under Node, natively under Bun — so an edited source is what runs, never stale output. The
// choice is made once, here; worker threads follow it (their entry module is a sibling of the
// module that starts them: `.js` beside `.js`, `.ts` beside `.ts`).
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { staleReason } from './compiled.mjs';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
if (staleReason(root) === undefined) {
  await import('./roamguard.js');
} else {
  if (!process.versions.bun) (await import('tsx/esm/api')).register();
  await import('./roamguard.ts');
}
