#!/usr/bin/env node
// Builds the native helpers beside their C sources: today one, dataplane/crypto/native/openssl-aead.c
// (the "openssl-ffi" crypto provider: dataplane/crypto/openssl-ffi.ts). Run by `npm install`
// (prepare), `npm run build` and scripts/test.sh after the system packages are in place.
//
// A helper that cannot be built here (no C compiler, no libcrypto.so.3) is not an error: its
// provider then reports itself unavailable and the crypto selection uses the next one. So this
// prints one line saying what it did and exits 0, unless --require is given (the test command).
//
//   node scripts/build-native.mjs [--require] [ROOT]
import { spawnSync } from 'node:child_process';
import { existsSync, renameSync, rmSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

// The tree to build in: this checkout, or the one given (build-image-tree.sh passes the image's).
const args = process.argv.slice(2);
const required = args.includes('--require');
const given = args.find((a) => !a.startsWith('--'));
const root = resolve(given ?? join(dirname(fileURLToPath(import.meta.url)), '..'));
const HELPERS = [
  { source: 'dataplane/crypto/native/openssl-aead.c', output: 'dataplane/crypto/native/openssl-aead.so', libraries: ['-l:libcrypto.so.3'] },
];

let failed = false;
for (const helper of HELPERS) {
  const source = join(root, helper.source);
  const output = join(root, helper.output);
  if (!existsSync(source)) continue; // a tree without it (the image's, before its sources are copied)
  if (existsSync(output) && statSync(output).mtimeMs >= statSync(source).mtimeMs) {
    console.log(`build-native: ${helper.output} is up to date`);
    continue;
  }
  const compiler = process.env.CC || 'cc';
  const temporary = `${output}.${process.pid}.tmp`;
  const run = spawnSync(compiler, ['-O2', '-fPIC', '-shared', '-Wall', '-Wextra', '-o', temporary, source, ...helper.libraries], { encoding: 'utf8' });
  if (run.status === 0) {
    renameSync(temporary, output);
    console.log(`build-native: built ${helper.output}`);
  } else {
    rmSync(temporary, { force: true });
    failed = true;
    const why = run.error ? `${compiler}: ${run.error.message}` : (run.stderr || '').trim().split('\n').slice(-1)[0];
    console.log(`build-native: ${relative(root, source)} not built (${why}); its crypto provider will be unavailable and the next one is used`);
  }
}
process.exit(required && failed ? 1 : 0);
