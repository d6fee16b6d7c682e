// Entry point of a piscina crypto worker. Node cannot import TypeScript by itself and does not
// reliably pass loader flags to worker threads, so the worker registers tsx before loading the
// TypeScript module; Bun runs TypeScript natively.
if (!process.versions.bun) {
  const { register } = await import('tsx/esm/api');
  register();
}
const worker = await import('./piscina-worker.ts');
export default worker.default;
