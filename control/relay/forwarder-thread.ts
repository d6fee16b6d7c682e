/**
 * The relay forwarder as the agent uses it: RelayForwarder's sockets run in a worker thread
 * (forwarder-worker.ts says why); this side keeps the last counters it heard of, so reading them
 * never waits.
 */
import type { Worker } from 'node:worker_threads';
import { startWorker } from '../../dataplane/sys/threads.ts';
import type { PairConfig, PairCounters } from './forward-core.ts';
import { toWire, type FromThread, type ThreadConfig, type ToThread } from './forwarder-messages.ts';

export interface RelayForwarderThreadOptions {
  /** Bytes per second per pair; 0 = unlimited. */
  bytesPerSecond: number;
  /** Address to bind the relay ports on ('::' for both families). */
  bindAddress?: string;
  onError?: (port: number, err: Error) => void;
  /** How often the thread reports its counters (default 1000 ms). */
  countersIntervalMs?: number;
}

export class RelayForwarderThread {
  private readonly worker: Worker;
  private seq = 0;
  private readonly waiting = new Map<number, (ready: string[]) => void>();
  private lastCounters = new Map<string, PairCounters>();
  private failed: Error | undefined;
  /** Ports that could not be bound (in use by something else): the allocation avoids them. */
  readonly unusable = new Set<number>();

  constructor(private readonly options: RelayForwarderThreadOptions) {
    const entry = new URL(`./forwarder-worker${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url);
    const config: ThreadConfig = { bytesPerSecond: options.bytesPerSecond, bindAddress: options.bindAddress, countersIntervalMs: options.countersIntervalMs ?? 1000 };
    this.worker = startWorker(entry, { ...config });
    this.worker.unref();
    this.worker.on('message', (message: FromThread) => this.onMessage(message));
    const fail = (err: Error) => {
      this.failed = err;
      for (const resolve of this.waiting.values()) resolve([]);
      this.waiting.clear();
    };
    this.worker.on('error', (err) => fail(err instanceof Error ? err : new Error(String(err))));
    this.worker.on('exit', (code) => fail(new Error(`relay forwarding thread exited (code ${code})`)));
  }

  /**
   * Opens the sockets of new pairs, closes those of pairs that went; resolves with the pairs
   * whose two ports are open. Rejects when the thread has died (the agent then starts a new one).
   */
  setPairs(configs: readonly PairConfig[]): Promise<PairConfig[]> {
    if (this.failed) return Promise.reject(this.failed);
    const seq = ++this.seq;
    const byId = new Map(configs.map((c) => [c.id, c]));
    return new Promise<PairConfig[]>((resolve, reject) => {
      this.waiting.set(seq, (ready) => {
        if (this.failed) reject(this.failed);
        else resolve(ready.flatMap((id) => byId.get(id) ?? []));
      });
      this.post({ kind: 'set', seq, configs: configs.map(toWire) });
    });
  }

  /** Per pair id: the counters as of the thread's last report (at most a second old). */
  counters(): Map<string, PairCounters> {
    return new Map(this.lastCounters);
  }

  get alive(): boolean {
    return this.failed === undefined;
  }

  close(): void {
    if (!this.failed) this.post({ kind: 'close' });
    this.failed ??= new Error('relay forwarding thread closed');
    // The thread closes its sockets and ends by itself; terminate is the backstop.
    setTimeout(() => void this.worker.terminate(), 1000).unref();
  }

  private post(message: ToThread): void {
    this.worker.postMessage(message);
  }

  private onMessage(message: FromThread): void {
    if (message.kind === 'port-error') {
      this.options.onError?.(message.port, new Error(message.message));
      return;
    }
    this.lastCounters = new Map(message.counters);
    if (message.kind === 'set-done') {
      for (const port of message.unusable) this.unusable.add(port);
      this.waiting.get(message.seq)?.(message.ready);
      this.waiting.delete(message.seq);
    }
  }
}
