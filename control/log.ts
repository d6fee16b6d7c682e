/**
 * The agent's log, through pino: one line per event, either JSON (for log collectors: the default
 * when stderr is not a terminal, as in a pod) or `time LEVEL message key=value` for people
 * (LOG_FORMAT=text, or stderr is a terminal).
 *
 *   {"level":"info","time":"2026-01-02T03:04:05.678Z","msg":"added a peer","node":"node-2","key":"xTIBA5rb"}
 *   2026-01-02T03:04:05.678Z INFO  added a peer node=node-2 key=xTIBA5rb
 *
 * Lines about a peer carry `node` and `key` (the short form of the public key: its first 8 base64
 * characters). Keys are never logged: every string that goes out (message, field values, array
 * items) is scanned, and anything shaped like a whole WireGuard key — 32 bytes in base64 (44
 * characters ending in `=`) or in hex (64 digits) — is replaced by `[redacted key]`, as is any
 * value of a field whose name says it holds a secret (`privateKey`, `presharedKey`, `token`, …).
 * Public keys look exactly like private ones, so full public keys are redacted too: log
 * `shortKey(...)` instead.
 */
import { pino, type DestinationStream, type Logger as PinoLogger } from 'pino';

export type AgentLogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent';
export type LogFields = Record<string, string | number | boolean | undefined | null | readonly string[]>;

export interface AgentLogger {
  debug(message: string, fields?: LogFields): void;
  info(message: string, fields?: LogFields): void;
  warn(message: string, fields?: LogFields): void;
  error(message: string, fields?: LogFields): void;
}

export interface LoggerOptions {
  level: AgentLogLevel;
  /** JSON lines (default: when stderr is not a terminal). */
  json?: boolean;
  /** Where each line goes, without its newline (default: stderr, synchronously). */
  write?: (line: string) => void;
  now?: () => Date;
}

export const REDACTED = '[redacted key]';

/** A 32-byte key in base64 (43 characters and one `=`) or in hex, anywhere in a string. */
const KEY_SHAPED = /(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=|(?<![0-9a-fA-F])[0-9a-fA-F]{64}(?![0-9a-fA-F])/g;
/** Field names whose values are secrets whatever they look like. */
const SECRET_FIELD = /private.?key|preshared.?key|psk|secret|token|password/i;

/** `text` with every key-shaped run replaced. */
export function redactKeys(text: string): string {
  return text.replace(KEY_SHAPED, REDACTED);
}

function redactValue(name: string, value: LogFields[string]): LogFields[string] {
  if (value === undefined || value === null) return value;
  if (SECRET_FIELD.test(name)) return REDACTED;
  if (typeof value === 'string') return redactKeys(value);
  if (Array.isArray(value)) return (value as readonly string[]).map((v) => (typeof v === 'string' ? redactKeys(v) : v));
  return value;
}

/** The fields as they may be logged (a copy; keys redacted, undefined left out). */
export function sanitizeFields(fields: LogFields): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(fields)) {
    if (value === undefined) continue;
    // pino's own keys stay pino's: a field named like one is kept under another name.
    const key = name === 'level' || name === 'time' || name === 'msg' ? `field_${name}` : name;
    out[key] = redactValue(name, value);
  }
  return out;
}

function formatValue(value: unknown): string {
  if (Array.isArray(value)) return value.join(',');
  const text = typeof value === 'object' && value !== null ? JSON.stringify(value) : String(value);
  return /[\s"=]/.test(text) || text === '' ? JSON.stringify(text) : text;
}

/** pino's JSON line → `time LEVEL message key=value …`. */
export function jsonLineToText(line: string): string {
  let record: Record<string, unknown>;
  try {
    record = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return line.trimEnd();
  }
  const { time, level, msg, ...fields } = record;
  const extra = Object.entries(fields).map(([k, v]) => `${k}=${formatValue(v)}`);
  return [String(time), String(level).toUpperCase().padEnd(5), String(msg ?? ''), ...extra].join(' ');
}

function destination(json: boolean, write?: (line: string) => void): DestinationStream {
  const out = write ?? ((line: string) => process.stderr.write(`${line}\n`));
  return {
    write(chunk: string) {
      for (const line of chunk.split('\n')) {
        if (line === '') continue;
        out(json ? line : jsonLineToText(line));
      }
    },
  };
}

export function createAgentLogger(options: LoggerOptions): AgentLogger {
  const json = options.json ?? !process.stderr.isTTY;
  const now = options.now ?? (() => new Date());
  const logger: PinoLogger = pino({
    level: options.level,
    base: undefined,
    messageKey: 'msg',
    timestamp: () => `,"time":"${now().toISOString()}"`,
    formatters: { level: (label) => ({ level: label }) },
  }, destination(json, options.write));
  const emit = (level: Exclude<AgentLogLevel, 'silent'>) => (message: string, fields: LogFields = {}) => {
    if (!logger.isLevelEnabled(level)) return;
    logger[level](sanitizeFields(fields), redactKeys(message));
  };
  return { debug: emit('debug'), info: emit('info'), warn: emit('warn'), error: emit('error') };
}

export const silentAgentLogger: AgentLogger = { debug() {}, info() {}, warn() {}, error() {} };
