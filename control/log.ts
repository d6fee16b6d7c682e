/**
 * The agent's log: one line per event, either JSON (for log collectors: the default when stderr
 * is not a terminal) or `time LEVEL message key=value` for people at a terminal.
 * Lines about a peer carry `node` and `key` (the short form of the public key); private keys
 * never reach a log line because nothing passes them here.
 */
export type AgentLogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent';
export type LogFields = Record<string, string | number | boolean | undefined | null | readonly string[]>;

export interface AgentLogger {
  debug(message: string, fields?: LogFields): void;
  info(message: string, fields?: LogFields): void;
  warn(message: string, fields?: LogFields): void;
  error(message: string, fields?: LogFields): void;
}

const RANK: Record<AgentLogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 };

export interface LoggerOptions {
  level: AgentLogLevel;
  /** JSON lines (default: when the output is not a terminal). */
  json?: boolean;
  write?: (line: string) => void;
  now?: () => Date;
}

function formatValue(value: LogFields[string]): string {
  if (Array.isArray(value)) return value.join(',');
  const text = String(value);
  return /[\s"=]/.test(text) ? JSON.stringify(text) : text;
}

export function createAgentLogger(options: LoggerOptions): AgentLogger {
  const write = options.write ?? ((line: string) => process.stderr.write(`${line}\n`));
  const json = options.json ?? !process.stderr.isTTY;
  const now = options.now ?? (() => new Date());
  const threshold = RANK[options.level];
  const emit = (level: Exclude<AgentLogLevel, 'silent'>) => (message: string, fields: LogFields = {}) => {
    if (RANK[level] < threshold) return;
    const time = now().toISOString();
    if (json) {
      write(JSON.stringify({ time, level, msg: message, ...fields }));
      return;
    }
    const extra = Object.entries(fields).filter(([, v]) => v !== undefined).map(([k, v]) => `${k}=${formatValue(v)}`);
    write([time, level.toUpperCase().padEnd(5), message, ...extra].join(' '));
  };
  return { debug: emit('debug'), info: emit('info'), warn: emit('warn'), error: emit('error') };
}

export const silentAgentLogger: AgentLogger = { debug() {}, info() {}, warn() {}, error() {} };
