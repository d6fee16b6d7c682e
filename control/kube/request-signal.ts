/**
 * An AbortSignal on one client-node request. client-node's fetch has no timeout of its own: a
 * request on a connection that died silently (a NAT on the way lost its state, a peer vanished
 * without a reset) waits forever, and so would whatever awaits it.
 */
import { Observable, type ConfigurationOptions, type RequestContext, type ResponseContext } from './kube-client.ts';

/** `options` (e.g. from setHeaderOptions) with a middleware that puts `signal` on the request. */
export function withSignal(signal: AbortSignal, options?: ConfigurationOptions): ConfigurationOptions {
  return {
    ...options,
    middleware: [...(options?.middleware ?? []), {
      pre: (context: RequestContext) => {
        context.setSignal(signal);
        return new Observable(Promise.resolve(context));
      },
      post: (context: ResponseContext) => new Observable(Promise.resolve(context)),
    }],
    middlewareMergeStrategy: 'append' as const,
  };
}

/** A request that got no answer in time; `code` makes the retry logic treat it as a network error. */
export class RequestTimeoutError extends Error {
  readonly code = 'ETIMEDOUT';
  constructor(readonly timeoutMs: number) {
    super(`no answer within ${timeoutMs} ms`);
    this.name = 'RequestTimeoutError';
  }
}

/** Runs `call` with a signal that aborts after `timeoutMs`; an abort becomes a RequestTimeoutError. */
export async function withTimeout<T>(timeoutMs: number, call: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  try {
    return await call(abort.signal);
  } catch (err) {
    if (abort.signal.aborted) throw new RequestTimeoutError(timeoutMs);
    throw err;
  } finally {
    clearTimeout(timer);
  }
}
