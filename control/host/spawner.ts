/**
 * A CommandRunner that starts commands from a small helper process instead of the agent itself.
 *
 * Starting a process copies the starting process's page tables, so its cost grows with the
 * starter's memory: at 5 000 Nodes the agent holds about 500 MiB, and each `ip` or `nft` it
 * started blocked its event loop for 6-20 ms (2.7 s of a 33 s CPU profile under churn, about a
 * tenth of the agent's busy time). The helper (spawner-child.ts, about 40 MiB) starts them in a
 * millisecond or two and sends back the same CommandResult systemRunner gives.
 *
 * The helper is started on first use and again after it exits (commands then in flight fail
 * with an error, as a failed command would). If it cannot be started, commands run from the
 * agent as before. It ends with the agent: `close()`, or its IPC channel closing.
 *
 * Under Bun commands run from the process itself: the agent is a Node program, and Bun's `fork`
 * IPC is not the same contract.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { systemRunner, type CommandOptions, type CommandResult, type CommandRunner } from './runner.ts';
import type { SpawnerReply, SpawnerRequest } from './spawner-messages.ts';
import { isBun } from '../../dataplane/sys/threads.ts';

/** Beyond the command's own timeout, how long to wait for the helper's answer. */
const ANSWER_GRACE_MS = 5000;

interface Pending { resolve(result: CommandResult): void; reject(err: Error): void; timer: NodeJS.Timeout }

export class CommandSpawner {
  private child: ChildProcess | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private closed = false;
  /** Set once starting the helper failed: commands run from this process. */
  private unavailable = isBun;

  /** The helper's PID while it runs (tests, diagnostics). */
  get helperPid(): number | undefined { return this.child?.pid; }

  /** The runner to hand out (bound). */
  readonly run: CommandRunner = (cmd, args, options) => this.runCommand(cmd, args, options);

  close(): void {
    this.closed = true;
    this.child?.disconnect();
    this.child = undefined;
    this.failPending('the command spawner was closed');
  }

  private runCommand(cmd: string, args: readonly string[], options?: CommandOptions): Promise<CommandResult> {
    const child = this.closed || this.unavailable ? undefined : this.helper();
    if (!child) return systemRunner(cmd, args, options);
    const id = this.nextId++;
    return new Promise<CommandResult>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`the command spawner did not answer for ${cmd} ${args.join(' ')}`));
      }, (options?.timeoutMs ?? 30_000) + ANSWER_GRACE_MS);
      timer.unref();
      this.pending.set(id, { resolve, reject, timer });
      this.holdOpen(child);
      const request: SpawnerRequest = { id, cmd, args: [...args], options };
      child.send(request);
    });
  }

  private helper(): ChildProcess | undefined {
    if (this.child) return this.child;
    const url = new URL(`./spawner-child${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url);
    try {
      const execArgv = url.pathname.endsWith('.ts') ? ['--import', 'tsx'] : [];
      const child = fork(fileURLToPath(url), [], { execArgv, stdio: ['ignore', 'ignore', 'inherit', 'ipc'], serialization: 'json' });
      child.on('message', (reply: SpawnerReply) => this.answer(reply));
      child.on('exit', () => {
        if (this.child === child) this.child = undefined;
        this.failPending('the command spawner exited');
      });
      child.on('error', () => {
        if (this.child === child) this.child = undefined;
        this.failPending('the command spawner failed');
      });
      this.child = child;
      this.holdOpen(child);
      return child;
    } catch {
      this.unavailable = true;
      return undefined;
    }
  }

  /** The helper keeps this process alive only while a command waits for it. */
  private holdOpen(child: ChildProcess): void {
    const channel = (child as unknown as { channel?: { ref(): void; unref(): void } }).channel;
    if (this.pending.size > 0) {
      child.ref();
      channel?.ref();
    } else {
      child.unref();
      channel?.unref();
    }
  }

  private answer(reply: SpawnerReply): void {
    const waiting = this.pending.get(reply.id);
    if (!waiting) return;
    this.pending.delete(reply.id);
    if (this.child) this.holdOpen(this.child);
    clearTimeout(waiting.timer);
    if (reply.result) waiting.resolve(reply.result);
    else waiting.reject(new Error(reply.error));
  }

  private failPending(why: string): void {
    for (const [id, waiting] of this.pending) {
      this.pending.delete(id);
      clearTimeout(waiting.timer);
      waiting.reject(new Error(why));
    }
  }
}
