/** Polls `condition` every few milliseconds until it holds; throws, naming `what`, after `timeoutMs`. */
export async function until(condition: () => boolean, timeoutMs = 5000, what = 'the condition'): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}
