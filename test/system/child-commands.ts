/**
 * The command loop of the test helper processes (core-driver.ts, hostile-peer.ts,
 * onpath-attacker.ts): one JSON command per stdin line, run one at a time in order, each answered
 * with `reply(id, ok, body)`. Calls `onClose` once stdin ends and the last command has been
 * answered. `CommandChannel` is the test side: it sends commands and matches the answers.
 */
import { createInterface } from 'node:readline';
import type { NsProcess } from './netns.ts';

export type CommandOutcome = ({ ok: true } & Record<string, unknown>) | { ok: false; error: string };
export type CommandReply = { id: number; ok: true; [key: string]: unknown } | { id: number; ok: false; error: string };

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

/**
 * The test side of a helper process that runs `serveCommands` and writes one JSON reply per
 * stdout line: each request gets an id, waits for the reply with that id (or the timeout), and
 * fails with the helper's output when the helper answers not ok or exits.
 */
export class CommandChannel<C extends { cmd: string }> {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (r: CommandReply) => void; reject: (e: Error) => void }>();

  constructor(readonly process: NsProcess, private readonly name: string) {
    createInterface({ input: process.child.stdout! }).on('line', (line) => {
      let msg: CommandReply;
      try { msg = JSON.parse(line) as CommandReply; } catch { return; }
      const p = this.pending.get(msg.id);
      if (p) { this.pending.delete(msg.id); p.resolve(msg); }
    });
    void process.exited.then(() => {
      for (const p of this.pending.values()) p.reject(new Error(`${name} exited\n${this.process.describe()}`));
      this.pending.clear();
    });
  }

  async request(command: C, timeoutMs = 15_000): Promise<Extract<CommandReply, { ok: true }>> {
    if (!this.process.running) throw new Error(`${this.name} is not running\n${this.process.describe()}`);
    const id = this.nextId++;
    const result = await new Promise<CommandReply>((resolvePromise, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`${this.name}: no answer to ${command.cmd} within ${timeoutMs} ms\n${this.process.describe()}`));
      }, timeoutMs);
      this.pending.set(id, {
        resolve: (r) => { clearTimeout(timer); resolvePromise(r); },
        reject: (e) => { clearTimeout(timer); reject(e); },
      });
      this.process.child.stdin!.write(`${JSON.stringify({ id, ...command })}\n`);
    });
    if (!result.ok) throw new Error(`${this.name}: ${command.cmd} failed: ${result.error}\n${this.process.describe()}`);
    return result;
  }
}
