/**
 * What the agent and the relay's forwarding thread say to each other (forwarder-thread.ts,
 * forwarder-worker.ts): plain objects, since Sets and Maps are cloned but clearer spelled out.
 */
import type { PairConfig, PairCounters } from './forward-core.ts';

export interface ThreadConfig {
  bytesPerSecond: number;
  bindAddress?: string;
  countersIntervalMs: number;
}

export interface WirePairConfig {
  id: string;
  ports: [number, number];
  allowedSources: [string[], string[]];
}

export type ToThread = { kind: 'set'; seq: number; configs: WirePairConfig[] } | { kind: 'close' };

export type FromThread =
  | { kind: 'set-done'; seq: number; ready: string[]; unusable: number[]; counters: Array<[string, PairCounters]> }
  | { kind: 'counters'; counters: Array<[string, PairCounters]> }
  | { kind: 'port-error'; port: number; message: string };

export function toWire(config: PairConfig): WirePairConfig {
  return { id: config.id, ports: [config.ports[0], config.ports[1]], allowedSources: [[...config.allowedSources[0]], [...config.allowedSources[1]]] };
}

export function fromWire(config: WirePairConfig): PairConfig {
  return { id: config.id, ports: config.ports, allowedSources: [new Set(config.allowedSources[0]), new Set(config.allowedSources[1])] };
}
