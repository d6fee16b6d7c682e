/** What the agent and its command spawner (spawner.ts, spawner-child.ts) send each other. */
import type { CommandOptions, CommandResult } from './runner.ts';

export interface SpawnerRequest {
  id: number;
  cmd: string;
  args: string[];
  options?: CommandOptions;
}

/** The command's result, or why it could not be run (the runner's own error message). */
export type SpawnerReply = { id: number; result: CommandResult; error?: undefined } | { id: number; error: string; result?: undefined };
