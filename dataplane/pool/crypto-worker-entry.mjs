// Entry point of a crypto worker thread. Node cannot import TypeScript by itself and does not
// reliably pass loader flags to worker threads, so the worker registers tsx before loading the
// TypeScript worker module; Bun runs TypeScript natively.
if (!process.versions.bun) {
  const { register } = await import('tsx/esm/api');
  register();
}
const worker = await import('./crypto-worker.ts');
export default worker.default;
