/**
 * The device's allowed-IPs table as other threads read it: flattened into shared memory
 * (flat-allowedips.ts) and published again after every change, at most once per turn of changes
 * (a control-socket request that sets a thousand prefixes flattens once). A published table never
 * changes; subscribers (session/shared-sessions.ts) hand each new one to their thread.
 */
import type { AllowedIps } from './allowedips.ts';

/** What a subscriber sees of it, whatever the peer type. */
export interface RoutesFeed {
  readonly current: Int32Array;
  onPublish(listener: (flat: Int32Array) => void): () => void;
}

export class PublishedRoutes<P> implements RoutesFeed {
  private flat: Int32Array;
  private scheduled = false;
  private readonly listeners = new Set<(flat: Int32Array) => void>();

  /** Takes over `table.onChange`; `numberOf` names each peer by its number (>= 0, never reused). */
  constructor(private readonly table: AllowedIps<P>, private readonly numberOf: (peer: P) => number) {
    this.flat = table.flatten(numberOf);
    table.onChange = () => this.schedule();
  }

  /** The latest published table. */
  get current(): Int32Array {
    return this.flat;
  }

  /** Calls `listener` with each table published from now on; returns the unsubscribe. */
  onPublish(listener: (flat: Int32Array) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      this.flat = this.table.flatten(this.numberOf);
      for (const listener of this.listeners) listener(this.flat);
    });
  }
}
