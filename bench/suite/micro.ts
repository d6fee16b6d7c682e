/**
 * The microbenchmarks in the suite: micro-child.ts once per runtime (Node, then Bun when
 * installed), each in a fresh process inside namespace A, with its progress relayed.
 */
import type { Namespace, Scope } from '../../test/system/netns.ts';
import { runJsonLinesChild, scriptCommand } from './children.ts';
import type { MicroMessage, MicroRuntimeResult, MicroSettings } from './micro-types.ts';

export type { MicroRuntimeResult } from './micro-types.ts';

/** Expected seconds of one runtime's microbenchmarks (for the time-left estimate). */
export const microSeconds = (quick: boolean): number => (quick ? 7 : 30);

export async function runMicro(
  scope: Scope, ns: Namespace, runtime: 'node' | 'bun', settings: MicroSettings, progress: (line: string) => void,
): Promise<MicroRuntimeResult> {
  const { cmd, args } = scriptCommand(runtime, 'bench/suite/micro-child.ts', { exposeGc: true });
  let result: MicroRuntimeResult | undefined;
  await runJsonLinesChild(scope, ns, cmd, [...args, JSON.stringify(settings)], {
    label: `microbenchmarks (${runtime})`,
    timeoutMs: (settings.quick ? 90 : 240) * 1000,
    onMessage(message) {
      const m = message as MicroMessage;
      if (m.type === 'progress') progress(`    ${runtime}: ${m.text}`);
      else if (m.type === 'result') result = m.result;
    },
  });
  if (!result) throw new Error(`microbenchmarks (${runtime}) printed no result`);
  return result;
}
