/**
 * The command loop of the test helper processes (core-driver.ts, hostile-peer.ts): one JSON
 * command per stdin line, run one at a time in order, each answered with `reply(id, ok, body)`.
 * Calls `onClose` once stdin ends and the last command has been answered.
 */

export type CommandOutcome = ({ ok: true } & Record<string, unknown>) | { ok: false; error: string };
import { createInterface } from 'node:readline';

export function serveCommands<C>(
  handle: (command: C) => Promise<Record<string, unknown>>,
  reply: (id: number, outcome: CommandOutcome) => void,
  onClose: () => void,
  describeError: (err: Error) => string = (err) => err.stack ?? String(err),
): void {
  let queue = Promise.resolve();
  const lines = createInterface({ input: process.stdin });
  lines.on('line', (line) => {
    if (line.trim() === '') return;
    queue = queue.then(async () => {
      let id = 0;
      try {
        const command = JSON.parse(line) as C & { id?: number };
        id = command.id ?? 0;
        reply(id, { ...(await handle(command)), ok: true });
      } catch (err) {
        reply(id, { ok: false, error: describeError(err as Error) });
      }
    });
  });
  lines.on('close', () => { void queue.then(onClose); });
}
