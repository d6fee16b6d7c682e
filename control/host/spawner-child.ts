/**
 * The process behind CommandSpawner (spawner.ts): runs the commands the agent sends over IPC with
 * the ordinary systemRunner and sends back each result. It stays small, so starting a command
 * from it costs a fraction of what it costs from the agent (see spawner.ts). It ends when the
 * agent's end of the channel closes, whatever way the agent ended.
 */
import { systemRunner } from './runner.ts';
import type { SpawnerReply, SpawnerRequest } from './spawner-messages.ts';

process.on('disconnect', () => process.exit(0));
process.on('message', (message: SpawnerRequest) => {
  const reply = (answer: SpawnerReply) => { if (process.connected) process.send!(answer); };
  systemRunner(message.cmd, message.args, message.options).then(
    (result) => reply({ id: message.id, result }),
    (err: Error) => reply({ id: message.id, error: err.message }),
  );
});
