#!/usr/bin/env node
// Compiles roamguard's TypeScript to JavaScript, each `foo.ts` to a `foo.js` beside it, so that a
// start runs JavaScript instead of transpiling every module (and again in every worker thread)
// through tsx. Runs at install time (`prepare` in package.json: npm install / npm ci) and with
// `npm run build`; scripts/build-image-tree.sh runs it on the image's copy of the sources.
//
//   node scripts/compile.mjs [ROOT]        (default: this checkout)
//
// What is compiled: the sources the commands can load (scripts/source-closure.mjs). The compiler
// is the esbuild that tsx itself transpiles with, so the output is what tsx would run. Each module
// stays a module (relative imports stay imports, `.ts` rewritten to `.js`); packages are not
// bundled. Every file is written to a temporary name and renamed, and the manifest that
// bin/compiled.mjs checks is removed first and written last: a start meanwhile runs the sources.
import { mkdirSync, renameSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { MANIFEST, MANIFEST_FORMAT, fingerprint } from '../bin/compiled.mjs';
import { sourceClosure } from './source-closure.mjs';

const root = resolve(process.argv[2] ?? join(dirname(fileURLToPath(import.meta.url)), '..'));
if (!existsSync(join(root, 'bin', 'roamguard.ts'))) {
  // The container image's dependency layer installs from package.json alone (see the Dockerfile).
  console.log(`compile: no sources under ${root} (a dependency-only install): nothing to compile`);
  process.exit(0);
}
const started = performance.now();
const requireFromTsx = createRequire(createRequire(join(root, 'package.json')).resolve('tsx/package.json'));
const esbuild = requireFromTsx('esbuild');

const sources = sourceClosure(root).filter((p) => p.endsWith('.ts') && !p.endsWith('.d.ts'));

/** Relative imports stay imports of the sibling compiled module; only the entry points are read. */
const keepModules = {
  name: 'keep-modules',
  setup(build) {
    build.onResolve({ filter: /^\.\.?\// }, (args) => {
      if (args.kind === 'entry-point') return undefined;
      return { path: args.path.replace(/\.ts$/, '.js'), external: true };
    });
  },
};

rmSync(join(root, MANIFEST), { force: true });
const result = await esbuild.build({
  absWorkingDir: root,
  entryPoints: sources,
  outdir: root,
  outbase: root,
  bundle: true,
  packages: 'external',
  platform: 'node',
  format: 'esm',
  target: 'node20',
  write: false,
  logLevel: 'warning',
  plugins: [keepModules],
});
// The Kubernetes client library, tree-shaken to what control/kube/kube-client.ts re-exports (see
// there): its index loads every API group, 26 MiB of the agent's heap. Minified, because V8 keeps
// a module's source text in the heap. Its CommonJS dependencies call require(), which an ES
// module has only through createRequire.
const KUBE_CLIENT = 'control/kube/kube-client.ts';
const kubeClient = !sources.includes(KUBE_CLIENT) ? { outputFiles: [] } : await esbuild.build({
  absWorkingDir: root,
  entryPoints: [KUBE_CLIENT],
  outdir: root,
  outbase: root,
  bundle: true,
  minify: true,
  platform: 'node',
  format: 'esm',
  target: 'node20',
  write: false,
  logLevel: 'warning',
  banner: { js: "import { createRequire as roamguardCreateRequire } from 'node:module'; const require = roamguardCreateRequire(import.meta.url);" },
});
const outputs = [...result.outputFiles.filter((f) => f.path !== join(root, KUBE_CLIENT.replace(/\.ts$/, '.js'))), ...kubeClient.outputFiles];
for (const file of outputs) {
  mkdirSync(dirname(file.path), { recursive: true });
  const temporary = `${file.path}.${process.pid}.tmp`;
  writeFileSync(temporary, file.contents);
  renameSync(temporary, file.path);
}
const files = {};
for (const path of sources) files[path] = fingerprint(root, path);
const manifest = { format: MANIFEST_FORMAT, compiler: `esbuild ${esbuild.version}`, files };
const temporary = join(root, `${MANIFEST}.${process.pid}.tmp`);
writeFileSync(temporary, `${JSON.stringify(manifest, null, 1)}\n`);
renameSync(temporary, join(root, MANIFEST));
console.log(`compile: ${sources.length} TypeScript files to JavaScript in ${Math.round(performance.now() - started)} ms`);
