/**
 * Logging for the data plane daemon, with wireguard-go's LOG_LEVEL values:
 * `verbose` (or `debug`) logs everything, `error` only errors (the default), `silent` nothing.
 * Keys never reach a log line: peers are named by the short form of their public key.
 */
export type LogLevel = 'silent' | 'error' | 'verbose';

export interface Logger {
  error(message: string): void;
  verbose(message: string): void;
}

export function parseLogLevel(value: string | undefined): LogLevel {
  switch ((value ?? '').toLowerCase()) {
    case '': case 'error': return 'error';
    case 'verbose': case 'debug': return 'verbose';
    case 'silent': return 'silent';
    default: throw new Error(`LOG_LEVEL must be verbose, debug, error or silent, got ${JSON.stringify(value)}`);
  }
}

export function createLogger(level: LogLevel, prefix: string, write: (line: string) => void = (l) => process.stderr.write(`${l}\n`)): Logger {
  const stamp = () => new Date().toISOString();
  const noop = () => {};
  return {
    error: level === 'silent' ? noop : (m) => write(`ERROR: (${prefix}) ${stamp()} ${m}`),
    verbose: level === 'verbose' ? (m) => write(`DEBUG: (${prefix}) ${stamp()} ${m}`) : noop,
  };
}

/**
 * A daemon outlives whoever started it, and with it often the reader of its stderr (the agent
 * that launched it restarts; `roamguard wg` itself exits once the daemon is ready). Node turns a
 * write to a pipe nobody reads into an 'error' event, and an unhandled one ends the process: the
 * data plane would die at its first log line. A log line that cannot be written is lost, nothing more.
 *
 * The listener is ours whatever else listens: a worker's output is piped into process.stderr, and
 * the pipe's own 'error' listener removes itself and throws when it is the last one (under tsx,
 * whose loader thread is such a worker, that ended the daemon at its first log line after the
 * reader left, then hung it in exit).
 */
export function surviveLostStderr(): void {
  if (!process.stderr.listeners('error').includes(ignoreStderrError)) process.stderr.on('error', ignoreStderrError);
}

function ignoreStderrError(): void {
  // The line is lost; the process goes on.
}

export const silentLogger: Logger = { error: () => {}, verbose: () => {} };
