#!/usr/bin/env node
// Lists the source files the container image needs (scripts/source-closure.mjs: the given
// directories, tests excluded, and what they reach through relative imports). The JavaScript
// compiled from them is not listed: scripts/build-image-tree.sh compiles the image's copy itself.
// Prints repository-relative paths, one per line, sorted. Used by scripts/build-image-tree.sh.
//
//   node scripts/image-sources.mjs bin dataplane control bench
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sourceClosure } from './source-closure.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const files = sourceClosure(root, process.argv.slice(2));
process.stdout.write(files.join('\n') + '\n');
