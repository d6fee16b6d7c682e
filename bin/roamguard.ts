/**
 * The roamguard command line: `roamguard <command> [args]`. Each command lives in
 * bin/commands/<name>.ts and is loaded only when used, so `roamguard genkey` never loads the
 * data plane and the data plane never loads the agent.
 */
export interface Command {
  summary: string;
  usage: string;
  run(args: string[]): Promise<number>;
}

const commands: Record<string, () => Promise<Command>> = {
  wg: async () => (await import('./commands/wg.ts')).wg,
  agent: async () => (await import('./commands/agent.ts')).agent,
  demo: async () => (await import('./commands/demo.ts')).demo,
  status: async () => (await import('./commands/status.ts')).status,
  health: async () => (await import('./commands/health.ts')).health,
  'rotate-key': async () => (await import('./commands/rotate-key.ts')).rotateKey,
  genkey: async () => (await import('./commands/genkey.ts')).genkey,
  pubkey: async () => (await import('./commands/genkey.ts')).pubkey,
  selftest: async () => (await import('./commands/selftest.ts')).selftest,
  bench: async () => (await import('./commands/bench.ts')).bench,
};

async function help(): Promise<void> {
  const lines = ['usage: roamguard [--runtime node|bun] <command> [args]', '', 'commands:'];
  for (const [name, load] of Object.entries(commands)) lines.push(`  ${name.padEnd(10)} ${(await load()).summary}`);
  lines.push('', 'Run `roamguard <command> --help` for a command\'s options.');
  console.log(lines.join('\n'));
}

/** What this process runs, as bin/launch.mjs chose it: the compiled JavaScript or the sources (and why). */
async function runningFrom(): Promise<string> {
  if (import.meta.url.endsWith('.js')) return 'compiled JavaScript';
  const { staleReason } = await import('./compiled.mjs');
  const why = staleReason(new URL('..', import.meta.url).pathname);
  return `TypeScript sources${why ? `: ${why}; npm run build compiles them` : ''}`;
}

async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    await help();
    return name ? 0 : 2;
  }
  if (name === '--version' || name === 'version') {
    const pkg = await import('../package.json', { with: { type: 'json' } });
    console.log(`roamguard ${pkg.default.version} (${await runningFrom()})`);
    return 0;
  }
  const load = commands[name];
  if (!load) {
    console.error(`roamguard: unknown command '${name}' (see roamguard --help)`);
    return 2;
  }
  const command = await load();
  if (args.includes('--help') || args.includes('-h')) {
    console.log(`usage: ${command.usage}\n\n${command.summary}`);
    return 0;
  }
  return command.run(args);
}

main(process.argv.slice(2)).then(
  // Exit explicitly: a finished daemon may still hold worker threads or timers.
  (code) => { process.exit(code); },
  (err: unknown) => {
    console.error(`roamguard: ${err instanceof Error ? err.message : String(err)}`);
    process.exitCode = 1;
  },
);
